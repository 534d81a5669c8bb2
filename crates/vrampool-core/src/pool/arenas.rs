//! The arenas of the streams other than the default one, found without a lock or a guard.
//!
//! Design: a map behind a lock holds every arena, boxed; a direct-mapped table of `SLOTS`
//! (stream, arena) pairs in front of it answers a lookup with two loads, so that two threads on
//! two streams do not meet at a lock on every call that leaves the fast path (a papaya map,
//! pinned for each call, met at seize's process-wide mutex: two threads on two streams ran at
//! 0.89-1.0x one thread's throughput). A stream whose slot another stream holds takes the lock.

use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use std::collections::HashMap;

use foldhash::fast::FixedState;
use parking_lot::Mutex;

use crate::arena::Arena;
use crate::device::StreamId;

/// Slots in the table (a power of two): streams beyond these share slots, and the later ones
/// pin the map.
const SLOTS: usize = 64;

/// An empty slot's stream: the default stream, which never goes in the table.
const EMPTY: u64 = 0;

#[derive(Default)]
struct Slot {
    stream: AtomicU64,
    /// Null until the slot's arena is published.
    arena: AtomicPtr<Arena>,
}

pub(super) struct Arenas {
    map: Mutex<HashMap<StreamId, Box<Arena>, FixedState>>,
    slots: [Slot; SLOTS],
}

impl Default for Arenas {
    fn default() -> Self {
        Self { map: Mutex::default(), slots: std::array::from_fn(|_| Slot::default()) }
    }
}

impl Arenas {
    /// The arena of `stream` (never the default stream), made on first use by `make`.
    #[inline(always)]
    pub fn get_or_make(&self, stream: StreamId, make: impl FnOnce() -> Arena) -> &Arena {
        debug_assert_ne!(stream.0, EMPTY, "the default stream's arena is the pool's own");
        let slot = &self.slots[Self::slot_of(stream)];
        Self::published(slot, stream).unwrap_or_else(|| self.locked(stream, make, slot))
    }

    /// The arena of `stream` if it has one.
    pub fn get(&self, stream: StreamId) -> Option<&Arena> {
        Self::published(&self.slots[Self::slot_of(stream)], stream).or_else(|| {
            let arena: *const Arena = &**self.map.lock().get(&stream)?;
            // SAFETY: as in `locked`.
            Some(unsafe { &*arena })
        })
    }

    /// The arena `slot` publishes for `stream`, if it does.
    #[inline(always)]
    fn published(slot: &Slot, stream: StreamId) -> Option<&Arena> {
        if slot.stream.load(Acquire) != stream.0 {
            return None;
        }
        let arena = slot.arena.load(Acquire);
        // SAFETY: a published pointer is to a boxed arena in `map` (see `locked`).
        (!arena.is_null()).then(|| unsafe { &*arena })
    }

    #[cold]
    fn locked(&self, stream: StreamId, make: impl FnOnce() -> Arena, slot: &Slot) -> &Arena {
        let arena: *const Arena = &**self.map.lock().entry(stream).or_insert_with(|| Box::new(make()));
        // The first stream to claim the slot publishes its arena there; the stream stored first
        // and the pointer after it, so a reader that sees the stream but a null pointer locks.
        if slot.stream.compare_exchange(EMPTY, stream.0, Relaxed, Relaxed).is_ok() {
            slot.arena.store(arena.cast_mut(), Release);
        }
        // SAFETY: arenas are never removed from `map`, and a box's contents stay where they are
        // when the map moves the box, so the arena lives as long as `self` does.
        unsafe { &*arena }
    }

    /// Calls `f` on every arena, with the lock released (`f` may look arenas up).
    pub fn for_each(&self, mut f: impl FnMut(&Arena)) {
        let arenas: Vec<*const Arena> = self.map.lock().values().map(|a| &**a as *const Arena).collect();
        for arena in arenas {
            // SAFETY: as in `locked`, a boxed arena lives as long as `self`.
            f(unsafe { &*arena });
        }
    }

    fn slot_of(stream: StreamId) -> usize {
        // Streams are pointers (multiples of 8 or more) or small integers: mix the bits.
        (stream.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use std::collections::HashMap;
    use std::sync::Barrier;

    #[test]
    fn each_stream_finds_its_own_arena_from_every_thread() {
        let arenas = Arenas::default();
        let config = PoolConfig::default();
        // Four times the slots: most streams share a slot with another.
        let streams: Vec<StreamId> = (1..=4 * SLOTS as u64).map(|i| StreamId(i * 0x1000)).collect();
        let barrier = Barrier::new(4);
        let seen: Vec<HashMap<u64, usize>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|t| {
                    let (arenas, streams, barrier, config) = (&arenas, &streams, &barrier, &config);
                    s.spawn(move || {
                        barrier.wait();
                        let mut seen = HashMap::new();
                        for round in 0..3 {
                            // An odd stride visits every stream, each thread in its own order.
                            for i in 0..streams.len() {
                                let stream = streams[(i * (2 * t + 1) + round) % streams.len()];
                                let arena = arenas.get_or_make(stream, || Arena::for_config(config, stream));
                                assert_eq!(arena.stream, stream);
                                let addr = arena as *const Arena as usize;
                                assert_eq!(*seen.entry(stream.0).or_insert(addr), addr, "one arena a stream");
                            }
                        }
                        seen
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "every thread finds the same arenas");
        let mut count = 0;
        arenas.for_each(|_| count += 1);
        assert_eq!(count, streams.len());
        for &stream in &streams {
            let found = arenas.get(stream).map(|a| a as *const Arena as usize);
            assert_eq!(found, Some(seen[0][&stream.0]), "`get` finds the arena `get_or_make` made");
        }
        assert!(arenas.get(StreamId(5 * SLOTS as u64 * 0x1000)).is_none(), "`get` makes none");
        let published = arenas.slots.iter().filter(|s| !s.arena.load(Relaxed).is_null()).count();
        assert!(published > SLOTS / 2, "streams spread over the slots: {published} of {SLOTS}");
    }
}
