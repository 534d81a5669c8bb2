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
}

impl Holding {
    /// Notes a growth of `stream`'s arena: called under the growing tier's lock, before the new
    /// memory is added to the tier.
    pub(super) fn note_growth(&self, stream: StreamId) {
        if stream != StreamId(0) {
            *self.growths.lock().entry(stream).or_default() += 1;
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
        }
    }

    /// Streams held now (besides the default one).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.growths.lock().len()
    }
}

impl PoolCore {
    /// Runs `f` on the default arena and on every arena that may hold memory; one that holds none
    /// afterwards is forgotten until it grows again.
    pub(super) fn for_each_holding_arena(&self, mut f: impl FnMut(&Arena)) {
        f(&self.default_arena);
        for (stream, growths) in self.holding.streams() {
            let arena = self.arena(stream);
            f(&arena);
            if !holds_memory(&arena) {
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
}
