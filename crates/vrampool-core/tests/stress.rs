//! Many threads allocating and freeing on a host-backed device; each block carries a pattern
//! that must survive until its free, so any overlap between live blocks shows up.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier};

use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{Device, Pool, PoolConfig, SimDevice, SimMode, StreamId};

const THREADS: u64 = 8;
const OPS_PER_THREAD: u64 = 100_000;

/// xorshift: fast and reproducible per thread.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Where the pattern goes: the first, middle and last 8 bytes of the block.
fn spots(size: u64) -> [u64; 3] {
    [0, (size / 2) & !7, size.saturating_sub(8) & !7]
}

/// Writes `tag` at the spots.
///
/// SAFETY: `addr..addr + size` must be a live block of a host-backed pool (so real host memory
/// this thread alone may touch until it frees the block), and `size >= 8`.
unsafe fn stamp(addr: u64, size: u64, tag: u64) {
    for off in spots(size) {
        std::ptr::write_unaligned((addr + off) as *mut u64, tag);
    }
}

/// SAFETY: as for `stamp`.
unsafe fn intact(addr: u64, size: u64, tag: u64) -> bool {
    spots(size).iter().all(|&off| std::ptr::read_unaligned((addr + off) as *const u64) == tag)
}

/// How the threads use the pool.
#[derive(Clone, Copy)]
struct Shape {
    /// Each block goes to one of this many streams, which the threads take turns at.
    streams: u64,
    /// Live blocks a thread holds at most.
    max_live: usize,
    /// Track leaks (a birth time for every live block).
    track_leaks: bool,
    /// Blocks of at most 68 KiB (else up to 25 MiB).
    small: bool,
}

const TWO_STREAMS: Shape = Shape { streams: 2, max_live: 64, track_leaks: false, small: false };

fn run(strategy: StrategyKind) {
    run_shaped(strategy, TWO_STREAMS);
}

fn run_shaped(strategy: StrategyKind, shape: Shape) {
    let dev = Arc::new(SimDevice::new(16 << 30, SimMode::HostBacked));
    let config = PoolConfig { strategy, track_leaks: shape.track_leaks, ..PoolConfig::default() };
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap());
    let (barrier, held) = (Arc::new(Barrier::new(THREADS as usize)), Arc::new(AtomicUsize::new(0)));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, barrier, held) = (Arc::clone(&pool), Arc::clone(&barrier), Arc::clone(&held));
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
                let mut live: Vec<(u64, u64, u64)> = Vec::new();
                for i in 0..OPS_PER_THREAD {
                    let stream = StreamId((t + i / 1_000) % shape.streams);
                    let r = next(&mut rng);
                    // Up to the most live, then about as many frees as allocations.
                    let grow = live.len() < shape.max_live / 2 || r % 2 == 0;
                    if live.len() < shape.max_live && (grow || live.is_empty()) {
                        let size = match r % 100 {
                            0..=69 => 8 + (r >> 8) % (4 * KIB),
                            _ if shape.small => 4 * KIB + (r >> 8) % (64 * KIB),
                            70..=94 => 4 * KIB + (r >> 8) % (MIB),
                            _ => MIB + (r >> 8) % (24 * MIB),
                        };
                        let addr = pool.allocate(size, stream).expect("the device is large enough");
                        let tag = t << 48 | i;
                        // SAFETY: a fresh live block of a host-backed pool, owned by this thread.
                        unsafe { stamp(addr, size, tag) };
                        live.push((addr, size, tag));
                    } else {
                        let (addr, size, tag) = live.swap_remove((r >> 8) as usize % live.len());
                        // SAFETY: still live: this thread has not freed it yet.
                        assert!(unsafe { intact(addr, size, tag) }, "block {addr:#x} was overwritten while live");
                        pool.free(addr, Some(size), None).unwrap();
                    }
                    if i % 20_000 == 19_999 && t == 0 {
                        pool.trim().unwrap();
                    }
                }
                // Every thread's live blocks, and none else, are in the leak report.
                held.fetch_add(live.len(), Relaxed);
                barrier.wait();
                if t == 0 {
                    let report = pool.live_blocks();
                    assert_eq!(report.len(), held.load(Relaxed));
                    assert!(report.iter().all(|b| b.age_ns.is_some() == shape.track_leaks));
                }
                barrier.wait();
                for (addr, size, tag) in live {
                    // SAFETY: as above.
                    assert!(unsafe { intact(addr, size, tag) });
                    pool.free(addr, Some(size), None).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 0, "{strategy:?}: exact accounting");
    assert_eq!(stats.allocation.current, 0);
    assert_eq!(stats.allocation.allocated, stats.allocation.freed);
    assert!(pool.live_blocks().is_empty());
    pool.trim().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0, "{strategy:?}: nothing leaks");
    assert_eq!(dev.counters().used, 0);
}

#[test]
fn eight_threads_hybrid() {
    run(StrategyKind::Hybrid);
}

/// More live blocks than the live table has slots (the rest go to its overflow map), with their
/// birth times, on more streams than the table of arenas has slots.
#[test]
fn eight_threads_on_many_streams_with_thousands_of_live_blocks_each() {
    run_shaped(StrategyKind::Hybrid, Shape { streams: 200, max_live: 4_000, track_leaks: true, small: true });
}

#[test]
fn eight_threads_best_fit() {
    run(StrategyKind::BestFit);
}

#[test]
fn eight_threads_buddy() {
    run(StrategyKind::Buddy);
}

#[test]
fn eight_threads_slab() {
    run(StrategyKind::Slab);
}
