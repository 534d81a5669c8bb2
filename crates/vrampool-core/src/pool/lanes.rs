//! Lanes: more than one arena for one stream, so that threads allocating on the same stream at
//! the same moment do not queue at one tier's lock. As glibc's malloc does with its arenas, a
//! thread moves to another lane when its allocations keep finding the lock taken; a program whose
//! threads take turns (PyTorch's autograd thread and the main one) never contends, and keeps one
//! lane per stream, its memory all in one place.
//!
//! A lane is an arena of its own, found by a stream key: the stream with the lane number in its
//! top byte (lane 0's key is the stream itself). Blocks carry their key (`LiveBlock::stream`), so
//! a free goes back to the lane that made the block from whichever thread frees it, and thread
//! caches and magazines keep each lane's blocks apart. Everything a device or a caller sees gets
//! the stream itself (`real`).
//!
//! A lane grows its own memory, and the growth's give-back returns what lanes no thread is in (the
//! ones threads left) hold idle, never what a lane in use holds (`is_occupied_sibling`). Design: a
//! lane that took blocks from another whenever its own had no fit kept taking them, since each one
//! it freed went back to the other lane (two threads on one stream, random sizes: a tenth of the
//! allocations crossed lanes, 1.1-1.25x one thread's throughput against 1.4x when lanes keep to
//! themselves). All lanes of a stream are one stream to the device, so when the device has no room
//! a lane does take a block another lane has free, with no event.
//!
//! Streams are device pointers or small integers, below 2^56 (user-space addresses are, with
//! five-level paging too); a stream at or above it never takes a lane, and one in [2^56, 2^58)
//! would read as a lane of a smaller stream (`real`), which no handle a driver gives out is.

use std::sync::atomic::{
    AtomicBool, AtomicU32,
    Ordering::{Relaxed, Release},
};

use super::*;

/// Lanes per stream.
const LANES: u8 = 4;

/// The lane number's place in a stream key.
const LANE_SHIFT: u32 = 56;

/// A thread moves to another lane when this many of its allocations find their tier's lock taken
/// within `CONTENTION_WINDOW_NS`. Design: a lock met now and then (a growth, a flush of the caches
/// that visits every arena) is no reason to split a stream's memory, and a thread that moves
/// without need leaves its memory behind and grows again; two threads that allocate on one
/// stream at once meet this often in tens of microseconds.
const CONTENDED_TO_MOVE: u32 = 64;
const CONTENTION_WINDOW_NS: u64 = 1_000_000;

/// The key of `stream`'s lane `lane`.
pub(super) fn key(stream: StreamId, lane: u8) -> StreamId {
    if lane == 0 || stream.0 >> LANE_SHIFT != 0 {
        return stream;
    }
    StreamId(stream.0 | u64::from(lane) << LANE_SHIFT)
}

/// The stream a key names.
#[inline(always)]
pub(super) fn real(key: StreamId) -> StreamId {
    match key.0 >> LANE_SHIFT {
        lane if lane < u64::from(LANES) => StreamId(key.0 & ((1 << LANE_SHIFT) - 1)),
        _ => key,
    }
}

/// Which lanes the pool's threads use.
#[derive(Default)]
pub(super) struct Lanes {
    /// Some thread has left lane 0: allocations look up their thread's lane.
    in_use: AtomicBool,
    /// Moves so far: the next thread to move takes the lane after the last one taken.
    moves: AtomicU32,
    /// Threads in each lane past the first (every thread starts in lane 0, which counts as
    /// occupied for good).
    occupants: [AtomicU32; LANES as usize],
}

impl PoolCore {
    /// The key this thread allocates under on `stream`.
    #[inline(always)]
    pub(super) fn lane_key(&self, stream: StreamId) -> StreamId {
        if !self.lanes.in_use.load(Relaxed) {
            return stream;
        }
        key(stream, self.with_thread_cache(|c| c.lane()).unwrap_or(0))
    }

    /// Locks `tier` of `arena` for an allocation, noting for this thread if another held it.
    pub(super) fn lock_tier_to_allocate<'a>(&self, arena: &'a Arena, tier: u8) -> MutexGuard<'a, Box<dyn Strategy>> {
        if let Some(guard) = arena.tiers[tier as usize].try_lock() {
            return self.file_kept_run(arena, tier, guard);
        }
        self.note_contention();
        self.lock_tier(arena, tier)
    }

    #[cold]
    fn note_contention(&self) {
        self.with_thread_cache(|c| {
            if c.note_contention(self.now_ns(), CONTENDED_TO_MOVE, CONTENTION_WINDOW_NS) {
                let next = self.lanes.moves.fetch_add(1, Relaxed) as u8 % (LANES - 1) + 1;
                // Never the lane it leaves: that one is contended.
                let to = if next == c.lane() { next % (LANES - 1) + 1 } else { next };
                self.leave_lane(c.lane());
                self.lanes.occupants[to as usize].fetch_add(1, Relaxed);
                c.set_lane(to);
                self.lanes.in_use.store(true, Release);
            }
        });
    }

    /// A thread leaves `lane` (it moves, or exits).
    pub(super) fn leave_lane(&self, lane: u8) {
        if lane != 0 {
            self.lanes.occupants[lane as usize].fetch_sub(1, Relaxed);
        }
    }

    /// Whether `other` is another lane of `key`'s stream with a thread in it. A growth gives back
    /// none of such a lane's memory: that thread's next step would grow it again, and the two
    /// lanes would trade segments at the high-water mark for as long as they ran (two threads
    /// stepping on one stream, simulated: a segment given back and grown every few steps, 0.2x one
    /// thread's throughput). What a thread left behind is given back as any idle memory is.
    pub(super) fn is_occupied_sibling(&self, key: StreamId, other: StreamId) -> bool {
        if other == key || real(other) != real(key) {
            return false;
        }
        let lane = (other.0 >> LANE_SHIFT) as usize;
        lane == 0 || self.lanes.occupants[lane].load(Relaxed) > 0
    }

    /// A block of `tier` from another lane of `key`'s stream that has one free, and that lane's
    /// key; None when no other lane does (or none is in use). For when the device has no room.
    pub(super) fn allocate_in_other_lane(&self, key: StreamId, tier: u8, rounded: u64) -> Option<(Block, StreamId)> {
        if !self.lanes.in_use.load(Relaxed) {
            return None;
        }
        let stream = real(key);
        (0..LANES).map(|lane| self::key(stream, lane)).filter(|&other| other != key).find_map(|other| {
            let arena = if other == StreamId(0) { &self.default_arena } else { self.arenas.get(other)? };
            let block = self.allocate_filed(arena, tier, &mut **self.lock_tier(arena, tier), rounded)?;
            Some((block, other))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimMode};
    use crate::sizes::{GIB, KIB, MIB};

    #[test]
    fn a_key_names_its_stream_and_lane_and_streams_past_the_lanes_keep_none() {
        for stream in [0, 7, 0x7f12_3456_7000, (1 << LANE_SHIFT) - 1] {
            let stream = StreamId(stream);
            for lane in 0..LANES {
                let k = key(stream, lane);
                assert_eq!(real(k), stream);
                assert_eq!(k == stream, lane == 0);
            }
        }
        let high = StreamId(u64::MAX);
        assert_eq!((key(high, 2), real(high)), (high, high));
    }

    #[test]
    fn a_thread_that_keeps_meeting_a_lock_moves_one_that_meets_it_now_and_then_stays() {
        let pool = Pool::new(Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly)), PoolConfig::default()).unwrap();
        let lane = || pool.with_thread_cache(|c| c.lane()).unwrap();
        // Contended allocations spread over more than a window each: never enough at once.
        for i in 1..=3 * CONTENDED_TO_MOVE {
            pool.with_thread_cache(|c| {
                assert!(!c.note_contention(u64::from(i) * CONTENTION_WINDOW_NS, CONTENDED_TO_MOVE, CONTENTION_WINDOW_NS))
            });
        }
        assert_eq!(lane(), 0);
        assert!(!pool.lanes.in_use.load(Relaxed));
        (0..CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
        assert_eq!(lane(), 1);
        assert!(pool.lanes.in_use.load(Relaxed));
        // Another thread that moves takes the next lane, and one moving again never stays.
        std::thread::scope(|s| {
            s.spawn(|| {
                (0..CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
                assert_eq!(lane(), 2);
            });
        });
        (0..3 * CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
        assert_ne!(lane(), 0);
    }

    #[test]
    fn two_threads_in_two_lanes_of_a_stream_free_each_others_blocks_and_every_block_goes_home() {
        let pool = Pool::new(Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly)), PoolConfig::default()).unwrap();
        let handed: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2u64)
                .map(|t| {
                    let pool = &pool;
                    s.spawn(move || {
                        if t == 1 {
                            (0..CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
                        }
                        let (mut live, mut kept) = (Vec::new(), Vec::new());
                        for i in 0..20_000u64 {
                            // 512 B..2.3 MiB: thread-cached blocks, first-tier runs and best-fit blocks.
                            let size = 512 + (i * 7919 + t * 104_729) % (2_300 * KIB);
                            live.push((pool.allocate(size, StreamId(0)).unwrap(), size));
                            if live.len() > 8 {
                                let (addr, size) = live.remove(0);
                                // Every fourth block outlives the thread's loop.
                                if i % 4 == 0 {
                                    kept.push((addr, size))
                                } else {
                                    pool.free(addr, Some(size), None).unwrap()
                                }
                            }
                        }
                        kept.extend(live);
                        kept
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let keys: std::collections::BTreeSet<u64> =
            handed.iter().flatten().map(|&(addr, _)| pool.live_block(addr).unwrap().stream).collect();
        assert_eq!(keys, [0, key(StreamId(0), 1).0].into(), "each thread's blocks in its lane");
        assert!(pool.live_blocks().iter().all(|b| b.stream == StreamId(0)), "a caller sees the stream");
        assert!(pool.snapshot().iter().all(|s| s.stream == StreamId(0)));
        // Each thread frees the other's blocks.
        std::thread::scope(|s| {
            for blocks in handed.iter().rev() {
                let pool = &pool;
                s.spawn(move || blocks.iter().for_each(|&(addr, size)| pool.free(addr, Some(size), Some(StreamId(0))).unwrap()));
            }
        });
        assert_eq!(pool.stats().allocated_bytes.current, 0);
        pool.trim().unwrap();
        assert_eq!(pool.stats().reserved_bytes.current, 0, "every block went back to the lane that made it");
    }

    #[test]
    fn a_growth_keeps_the_memory_of_a_lane_in_use_and_gives_back_what_a_thread_left() {
        let config = PoolConfig { expandable: false, ..PoolConfig::default() };
        let pool = Arc::new(Pool::new(Arc::new(SimDevice::new(GIB, SimMode::AddressOnly)), config).unwrap());
        let reserved = |pool: &Pool| pool.stats().reserved_bytes.current;
        let lane1 = key(StreamId(0), 1);
        // Lane 0 (this thread's) holds an idle 100 MiB segment: the high-water mark.
        let idle = pool.allocate(100 * MIB, StreamId(0)).unwrap();
        pool.free(idle, None, None).unwrap();
        let other = Arc::clone(&pool);
        // Joined, the thread has exited: its thread-local caches are gone.
        std::thread::spawn(move || {
            let pool = &*other;
            (0..CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
            let grown = pool.allocate(50 * MIB, StreamId(0)).unwrap();
            assert_eq!(pool.live_block(grown).unwrap().stream, lane1.0);
            assert_eq!(reserved(pool), 150 * MIB, "lane 0 has a thread: its idle segment stays");
            pool.free(grown, None, None).unwrap();
            // The thread moves on: lane 1's idle segment is what a growth gives back now.
            (0..CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
            assert!(!pool.is_occupied_sibling(StreamId(0), lane1) && pool.is_occupied_sibling(lane1, StreamId(0)));
            let again = pool.allocate(60 * MIB, StreamId(0)).unwrap();
            assert_eq!(reserved(pool), 160 * MIB, "lane 1's 50 MiB went back, lane 0's 100 MiB stayed");
            pool.free(again, None, None).unwrap();
        })
        .join()
        .unwrap();
        assert!((1..LANES).all(|lane| pool.lanes.occupants[lane as usize].load(Relaxed) == 0), "an exiting thread leaves its lane");
        pool.trim().unwrap();
        assert_eq!(reserved(&pool), 0);
    }

    #[test]
    fn a_lane_takes_a_free_block_of_another_lane_when_the_device_has_no_room() {
        let device = Arc::new(SimDevice::new(60 * MIB, SimMode::AddressOnly));
        let pool = Pool::new(device, PoolConfig { reclaim: false, ..PoolConfig::default() }).unwrap();
        // Lane 0 holds 56 MiB: a freed block among live ones.
        let held: Vec<u64> = (0..7).map(|_| pool.allocate(8 * MIB, StreamId(0)).unwrap()).collect();
        pool.free(held[3], None, None).unwrap();
        // This thread moves to lane 1, as contention would move it.
        pool.with_thread_cache(|c| c.set_lane(1)).unwrap();
        pool.lanes.in_use.store(true, Relaxed);
        let again = pool.allocate(8 * MIB, StreamId(0)).unwrap();
        assert_eq!(pool.live_block(again).map(|b| b.stream), Some(0), "lane 0's free block served lane 1");
        let own = pool.allocate(2 * MIB, StreamId(0)).unwrap();
        assert_eq!(pool.live_block(own).map(|b| b.stream), Some(key(StreamId(0), 1).0), "lane 1 grows where the device has room");
        assert!(pool.live_blocks().iter().all(|b| b.stream == StreamId(0)), "a caller sees the stream");
        // Freed from a thread in another lane, each block goes back to its own lane.
        std::thread::scope(|s| {
            s.spawn(|| {
                pool.free(again, None, None).unwrap();
                pool.free(own, None, Some(StreamId(0))).unwrap();
                held.iter().filter(|&&a| a != held[3]).for_each(|&a| pool.free(a, None, None).unwrap());
            });
        });
        pool.trim().unwrap();
        assert_eq!(pool.stats().reserved_bytes.current, 0);
    }

    #[test]
    fn the_event_log_leak_reports_and_snapshots_name_the_stream_of_a_lane_block() {
        let config = PoolConfig { record_events: true, track_leaks: true, scrub: Scrub::OnFree, ..PoolConfig::default() };
        let pool = Pool::new(Arc::new(SimDevice::new(GIB, SimMode::AddressOnly)), config).unwrap();
        (0..CONTENDED_TO_MOVE).for_each(|_| pool.note_contention());
        let stream = StreamId(0x7f00_1234_5000);
        let blocks: Vec<u64> = [4 * KIB, 300 * KIB, 3 * MIB].iter().map(|&size| pool.allocate(size, stream).unwrap()).collect();
        assert!(blocks.iter().all(|&a| real(StreamId(pool.live_block(a).unwrap().stream)) == stream));
        assert!(blocks.iter().all(|&a| pool.live_block(a).unwrap().stream != stream.0), "lane blocks");
        let leaks = pool.live_blocks();
        assert_eq!(leaks.len(), 3);
        assert!(leaks.iter().all(|b| b.stream == stream && b.age_ns.is_some()));
        assert!(pool.snapshot().iter().all(|s| s.stream == stream));
        blocks.iter().for_each(|&a| pool.free(a, None, None).unwrap());
        let events = pool.take_events();
        assert!(events.len() >= 6, "{events:?}");
        assert!(events.iter().all(|e| e.stream == stream), "{events:?}");
    }
}
