//! Soak: 8 threads of mixed operations on one hybrid pool over a host-backed device: allocations
//! of every tier, frees (some naming another stream, some of blocks recorded on another stream),
//! stream completion and occasional trims. Each block carries a tag checked while it lives and at
//! its free; every few thousand operations a thread checks that the pool's segments are tiled by
//! their blocks and that its own blocks are live there. At the end nothing may leak and the
//! counters must be exact.
//!
//! `VRAMPOOL_SOAK_OPS` sets the total operation count (default 100,000: about 15 s in a debug build, for CI);
//! `scripts/soak.sh` runs 10 million in release.

use std::sync::Arc;
use std::time::Instant;

use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::{BlockState, Device, Pool, PoolConfig, SimDevice, SimMode, StreamId};

const THREADS: u64 = 8;
const STREAMS: u64 = 3;
const MAX_LIVE_PER_THREAD: usize = 48;
const CHECK_EVERY: u64 = 5_000;

fn total_ops() -> u64 {
    std::env::var("VRAMPOOL_SOAK_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

/// xorshift: fast and reproducible per thread.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Sizes over the slab (most), best-fit and buddy tiers, with exact powers of two now and then.
fn size_for(r: u64) -> u64 {
    match r % 100 {
        0..=59 => 1 + (r >> 8) % (8 * KIB),
        60..=84 => 8 * KIB + (r >> 8) % MIB,
        85..=94 => MIB + (r >> 8) % (16 * MIB),
        95..=97 => 1 << (9 + (r >> 8) % 16),
        _ => 32 * MIB + (r >> 8) % (32 * MIB),
    }
}

struct Block {
    addr: u64,
    size: u64,
    tag: u64,
}

/// The first, middle and last 8 bytes of a block of `size >= 8` bytes.
fn spots(size: u64) -> [u64; 3] {
    [0, (size / 2) & !7, (size - 8) & !7]
}

impl Block {
    /// SAFETY: `addr..addr + size` must be a live block of a host-backed pool that only this
    /// thread touches until it frees it, and `size >= 8`.
    unsafe fn stamp(&self) {
        for off in spots(self.size) {
            std::ptr::write_unaligned((self.addr + off) as *mut u64, self.tag);
        }
    }

    /// SAFETY: as for `stamp`.
    unsafe fn intact(&self) -> bool {
        spots(self.size).iter().all(|&off| std::ptr::read_unaligned((self.addr + off) as *const u64) == self.tag)
    }
}

/// Segments are tiled by their blocks and free ranges, never overlap, and every block of
/// `mine` is active in one of them.
fn check_layout(pool: &Pool, mine: &[Block]) {
    let snapshot = pool.snapshot();
    let mut end_of_previous = 0;
    for seg in &snapshot {
        assert!(seg.base >= end_of_previous, "segment {:#x} overlaps the one before", seg.base);
        end_of_previous = seg.base + seg.size;
        let mut cursor = seg.base;
        for &(addr, size, _) in &seg.blocks {
            assert_eq!(addr, cursor, "segment {:#x}: a gap or an overlap at {addr:#x}", seg.base);
            cursor += size;
        }
        assert_eq!(cursor, seg.base + seg.size, "segment {:#x} is not covered", seg.base);
    }
    for b in mine {
        let active = snapshot.iter().flat_map(|s| &s.blocks).any(|&(addr, size, state)| {
            addr == b.addr && size >= b.size && matches!(state, BlockState::Active { requested } if requested == b.size)
        });
        assert!(active, "block {:#x} ({} B) is live but not active in the snapshot", b.addr, b.size);
    }
}

/// One thread's share: returns how many frees named another stream or followed a record_stream.
fn worker(pool: &Pool, dev: &SimDevice, t: u64, ops: u64) -> u64 {
    let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
    let stream = t % STREAMS;
    let other = |r: u64| StreamId((stream + 1 + r % (STREAMS - 1)) % STREAMS);
    let mut live: Vec<Block> = Vec::new();
    let mut cross = 0;
    for i in 0..ops {
        let r = next(&mut rng);
        if live.len() < MAX_LIVE_PER_THREAD && (r % 2 == 0 || live.is_empty()) {
            let size = size_for(r >> 4).max(8);
            let addr = pool.allocate(size, StreamId(stream)).unwrap_or_else(|e| panic!("thread {t}: {size} B: {e}"));
            let block = Block { addr, size, tag: t << 56 | i };
            // SAFETY: a fresh live block of a host-backed pool, owned by this thread.
            unsafe { block.stamp() };
            if (r >> 12) % 20 == 0 {
                pool.record_stream(addr, other(r >> 20)).unwrap();
            }
            live.push(block);
        } else {
            let block = live.swap_remove((r >> 8) as usize % live.len());
            // SAFETY: still live: this thread has not freed it yet.
            assert!(unsafe { block.intact() }, "thread {t}: block {:#x} was overwritten while live", block.addr);
            let by = ((r >> 16) % 10 == 0).then(|| other(r >> 24));
            cross += u64::from(by.is_some());
            pool.free(block.addr, Some(block.size), by).unwrap_or_else(|e| panic!("thread {t}: free: {e}"));
        }
        if i % 1000 == 999 {
            dev.complete_stream(StreamId(stream));
        }
        if i % CHECK_EVERY == CHECK_EVERY - 1 {
            // SAFETY: as above.
            assert!(live.iter().all(|b| unsafe { b.intact() }), "thread {t}: a live block was overwritten");
            check_layout(pool, &live);
        }
        if t == 0 && i % 20_000 == 19_999 {
            pool.trim().unwrap();
        }
    }
    for block in live {
        // SAFETY: as above.
        assert!(unsafe { block.intact() });
        pool.free(block.addr, Some(block.size), None).unwrap();
    }
    cross
}

#[test]
fn eight_threads_of_mixed_operations_leave_no_leak_and_exact_counters() {
    let ops = total_ops();
    let dev = Arc::new(SimDevice::new(64 << 30, SimMode::HostBacked));
    // Events complete only when each thread says its stream's work is done.
    dev.set_auto_complete(false);
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, dev) = (Arc::clone(&pool), Arc::clone(&dev));
            std::thread::spawn(move || worker(&pool, &dev, t, ops / THREADS))
        })
        .collect();
    let cross: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let seconds = started.elapsed().as_secs_f64();

    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 0, "exact accounting");
    assert_eq!(stats.requested_bytes.current, 0);
    assert_eq!(stats.allocation.current, 0);
    assert_eq!(stats.allocation.allocated, stats.allocation.freed);
    assert!(pool.live_blocks().is_empty());
    dev.complete_all();
    pool.trim().unwrap();
    let stats = pool.stats();
    assert_eq!((stats.active_bytes.current, stats.reserved_bytes.current, stats.segment.current), (0, 0, 0), "nothing leaks");
    assert_eq!(dev.counters().used, 0, "the device has every byte back");
    assert_eq!(dev.live_events(), 0, "every event was released");
    eprintln!(
        "soak: {} operations over {THREADS} threads in {seconds:.1} s ({:.2} M ops/s); {} allocations, {cross} cross-stream frees, \
         {} deferred, peak reserved {} MiB, {} device allocations; 0 overwritten blocks, 0 leaked bytes",
        ops / THREADS * THREADS,
        (ops / THREADS * THREADS) as f64 / seconds / 1e6,
        stats.allocation.allocated,
        stats.deferred_frees,
        stats.reserved_bytes.peak / MIB,
        stats.num_device_alloc,
    );
}
