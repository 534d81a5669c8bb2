//! The arenas that may hold device memory: a give-back, a flush and the stats visit these alone,
//! so that their cost follows the arenas with memory, not every stream the pool has served.
//!
//! An arena enters at each growth and leaves when a visit finds it holding nothing. A growth
//! counts up under the growing tier's lock before the memory reaches the tier, and a visit drops
//! an arena only if no growth counted since it read the count (`forget_unless_grown`): a growth
//! that races the visit either shows in the count or in the tier the visit locks after it.

use std::collections::HashMap;

use foldhash::fast::FixedState;
use parking_lot::Mutex;

use super::*;

/// Streams whose arenas may hold memory, with the growths each has made (the default stream's
/// arena is always visited, and is not kept here).
#[derive(Default)]
pub(super) struct Holding {
    growths: Mutex<HashMap<StreamId, u64, FixedState>>,
    /// The map's length, read without its lock.
    held: std::sync::atomic::AtomicUsize,
}

impl Holding {
    /// Notes a growth of `stream`'s arena: called under the growing tier's lock, before the new
    /// memory is added to the tier.
    pub(super) fn note_growth(&self, stream: StreamId) {
        if stream != StreamId(0) {
            let mut map = self.growths.lock();
            *map.entry(stream).or_default() += 1;
            self.held.store(map.len(), Relaxed);
        }
    }

    /// The streams held now, each with its growth count.
    fn streams(&self) -> Vec<(StreamId, u64)> {
        self.growths.lock().iter().map(|(&s, &g)| (s, g)).collect()
    }

    /// Drops `stream` unless it grew since its count was `growths`.
    fn forget_unless_grown(&self, stream: StreamId, growths: u64) {
        let mut map = self.growths.lock();
        if map.get(&stream) == Some(&growths) {
            map.remove(&stream);
            self.held.store(map.len(), Relaxed);
        }
    }

    /// Streams held now (besides the default one).
    pub(super) fn len(&self) -> usize {
        self.held.load(Relaxed)
    }
}

#[cfg(test)]
thread_local! {
    /// Arenas this thread's visits went through, for the tests that count the work.
    static VISITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl PoolCore {
    /// Runs `f` on the default arena and on every arena that may hold memory; one that holds none
    /// afterwards is forgotten until it grows again.
    pub(super) fn for_each_holding_arena(&self, mut f: impl FnMut(&Arena)) {
        #[cfg(test)]
        VISITS.with(|v| v.set(v.get() + 1 + self.holding.len() as u64));
        f(&self.default_arena);
        for (stream, growths) in self.holding.streams() {
            let arena = self.arena(stream);
            f(arena);
            if !holds_memory(arena) {
                self.holding.forget_unless_grown(stream, growths);
            }
        }
    }
}

/// Whether any tier of `arena` holds a segment, or its expandable range a reservation.
fn holds_memory(arena: &Arena) -> bool {
    arena.tiers.iter().any(|tier| tier.lock().usage().reserved > 0) || arena.with_vm(|vm_arena| !vm_arena.reservations.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimMode};
    use crate::sizes::{GIB, MIB};

    #[test]
    fn a_growth_visits_only_the_arenas_that_hold_memory() {
        let pool = Pool::new(Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly)), PoolConfig::default()).unwrap();
        for stream in 1..=1000 {
            let addr = pool.allocate(3 * MIB, StreamId(stream)).unwrap();
            pool.free(addr, None, None).unwrap();
        }
        assert!(pool.holding.len() <= 1000);
        // Everything goes back; the next visit (the stats') forgets every arena the trim emptied.
        pool.trim().unwrap();
        pool.stats();
        assert_eq!(pool.holding.len(), 0);
        let mut visited = 0;
        pool.for_each_holding_arena(|_| visited += 1);
        assert_eq!(visited, 1, "the default arena alone");
        // A growth of one stream brings back that arena alone.
        let addr = pool.allocate(3 * MIB, StreamId(7)).unwrap();
        assert_eq!(pool.holding.len(), 1);
        pool.free(addr, None, None).unwrap();
    }

    #[test]
    fn allocations_held_on_thousands_of_streams_cost_no_visit_of_them_all_each() {
        // Issue 57: each stream's first allocation grows its arena, and a growth visited every arena holding
        // memory: quadratic in the streams (4,000 of them, each with a live block: 29 s).
        let pool = Pool::new(Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly)), PoolConfig::default()).unwrap();
        let visits = || VISITS.with(|v| v.get());
        let before = visits();
        let live: Vec<(u64, u64)> = (1..=2000).map(|s| (s, pool.allocate(4096, StreamId(s)).unwrap())).collect();
        let work = visits() - before;
        assert!(work < 10 * 2000, "{work} arena visits for 2,000 streams' first allocations");
        for (_, addr) in live {
            pool.free(addr, None, None).unwrap();
        }
        assert!(pool.trim().unwrap() > 0);
    }
}
