//! Tests against a CUDA device: a GPU, or the emulated driver (`scripts/emulated-cuda.sh`,
//! which scripts/test.sh uses). Without a device every test is reported as ignored (see
//! `common`); with `VRAMPOOL_REQUIRE_GPU=1` (scripts/gpu-check.sh sets it where nvidia-smi sees a
//! GPU) a missing device fails the run instead.
//!
//! The tests take one lock for their whole length: they read the device's free memory, which a
//! test running beside them would move.

mod common;

use std::sync::Arc;
use std::thread;

use common::{device, serial, GIB, MIB};
use vrampool_core::{Device, DeviceError, EventId, Pool, PoolConfig, StrategyKind, StreamId};
use vrampool_cuda::CudaDevice;

fn main() {
    let tests: Vec<(&'static str, fn())> = vec![
        ("alloc_free_and_copy_round_trip", alloc_free_and_copy_round_trip),
        ("mem_info_reports_the_device", mem_info_reports_the_device),
        ("reserve_map_unmap_moves_free_memory", reserve_map_unmap_moves_free_memory),
        ("events_record_query_and_wait", events_record_query_and_wait),
        ("out_of_memory_is_reported_as_such", out_of_memory_is_reported_as_such),
        ("pool_over_cuda_with_eight_threads", pool_over_cuda_with_eight_threads),
        ("pool_strategies_and_cross_stream_frees", pool_strategies_and_cross_stream_frees),
    ];
    common::run(tests, common::device_present(), "VRAMPOOL_REQUIRE_GPU")
}

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn alloc_free_and_copy_round_trip() {
    let (_serial, dev) = (serial(), device());
    let size = 8 * MIB;
    let seg = dev.alloc_segment(size).unwrap();
    assert_eq!(seg % 512, 0, "segments are 512 B aligned");
    assert_eq!(dev.live_segments(), 1);

    let data = pattern(size as usize, 7);
    dev.copy_to_device(seg, &data).unwrap();
    let mut back = vec![0u8; size as usize];
    dev.copy_to_host(seg, &mut back).unwrap();
    assert!(back == data, "bytes read back differ from bytes written");

    // Zero a middle part on the legacy default stream, then a tail on the per-thread stream.
    dev.fill_zero(seg + MIB, MIB, StreamId(0)).unwrap();
    dev.fill_zero(seg + 6 * MIB, MIB, StreamId(2)).unwrap();
    dev.synchronize().unwrap();
    dev.copy_to_host(seg, &mut back).unwrap();
    assert!(back[MIB as usize..2 * MIB as usize].iter().all(|&b| b == 0));
    assert!(back[6 * MIB as usize..7 * MIB as usize].iter().all(|&b| b == 0));
    assert_eq!(back[..MIB as usize], data[..MIB as usize]);
    assert_eq!(back[2 * MIB as usize..6 * MIB as usize], data[2 * MIB as usize..6 * MIB as usize]);

    // Ranges outside what the device holds are refused before the driver sees them.
    assert!(dev.copy_to_device(seg + size - 4, b"overflow").is_err());
    assert!(dev.fill_zero(seg + size, 512, StreamId(0)).is_err());
    assert!(dev.free_segment(seg, size + 1).is_err(), "wrong size refused");
    assert!(dev.free_segment(seg + 512, size).is_err(), "unknown base refused");

    dev.free_segment(seg, size).unwrap();
    assert_eq!(dev.live_segments(), 0);
    assert!(dev.free_segment(seg, size).is_err(), "double free refused");
    assert!(matches!(dev.alloc_segment(0), Err(DeviceError::Driver(_))));

    // Many small segments stay aligned and distinct.
    let mut segs: Vec<u64> = (0..64).map(|i| dev.alloc_segment(512 + 512 * i).unwrap()).collect();
    assert!(segs.iter().all(|s| s % 512 == 0));
    segs.sort_unstable();
    segs.dedup();
    assert_eq!(segs.len(), 64);
    dev.synchronize().unwrap();
}

fn mem_info_reports_the_device() {
    let (_serial, dev) = (serial(), device());
    let info = dev.mem_info().unwrap();
    assert_eq!(info.total, dev.total_memory());
    assert!(info.free > 0 && info.free <= info.total, "{info:?}");
    println!("driver {} ; {info:?}", CudaDevice::driver_version().unwrap());
}

fn reserve_map_unmap_moves_free_memory() {
    let (_serial, dev) = (serial(), device());
    let Some(g) = dev.vm_granularity() else {
        panic!("device 0 has no virtual-memory management");
    };
    assert!(g.is_power_of_two(), "granularity {g}");
    let reserved = 256 * g;
    let base = dev.reserve(reserved).unwrap();
    assert_eq!(base % g, 0);

    let before = dev.mem_info().unwrap().free;
    let first = 128 * g; // 256 MiB with the usual 2 MiB granularity
    dev.map(base, first).unwrap();
    let after_first = dev.mem_info().unwrap().free;
    assert!(before.saturating_sub(after_first) >= first, "free went from {before} to {after_first} after mapping {first}");

    // Grow in place: the next map is adjacent, and a copy spanning both works.
    dev.map(base + first, 16 * g).unwrap();
    assert_eq!(dev.mapped_bytes(), first + 16 * g);
    let span = pattern(2 * g as usize, 3);
    let at = base + first - g;
    dev.copy_to_device(at, &span).unwrap();
    let mut back = vec![0u8; span.len()];
    dev.copy_to_host(at, &mut back).unwrap();
    assert!(back == span, "copy across two mappings");
    dev.fill_zero(at, 2 * g, StreamId(0)).unwrap();
    dev.synchronize().unwrap();
    dev.copy_to_host(at, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));

    // Refusals: overlap, misalignment, outside the reservation, unmapped holes, partial unmaps.
    assert!(dev.map(base, g).is_err());
    assert!(dev.map(base + first + 16 * g + 512, g).is_err());
    assert!(dev.map(base + reserved, g).is_err());
    assert!(dev.copy_to_device(base + first + 16 * g, b"hole").is_err());
    assert!(dev.unmap(base, g).is_err(), "partial unmap refused");
    assert!(dev.unreserve(base, reserved).is_err(), "reservation with mappings refused");

    // Trim: unmapping gives the memory back.
    dev.unmap(base + first, 16 * g).unwrap();
    dev.unmap(base, first).unwrap();
    assert_eq!(dev.mapped_bytes(), 0);
    let after_unmap = dev.mem_info().unwrap().free;
    assert!(after_unmap + 16 * MIB >= before, "free went from {before} to {after_unmap} after unmapping everything");
    assert!(dev.unmap(base, first).is_err(), "double unmap refused");
    dev.unreserve(base, reserved).unwrap();
    assert!(dev.unreserve(base, reserved).is_err());
}

fn events_record_query_and_wait() {
    let (_serial, dev) = (serial(), device());
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let size = 128 * MIB;
    let seg = dev.alloc_segment(size).unwrap();
    for _ in 0..8 {
        dev.fill_zero(seg, size, s1).unwrap(); // keep s1 busy for a while
    }
    let e = dev.record_event(s1).unwrap();
    let early = dev.event_done(e).unwrap();
    println!("event done right after 1 GiB of memsets were queued: {early}");
    dev.stream_wait_event(s2, e).unwrap();
    dev.fill_zero(seg, MIB, s2).unwrap();
    dev.synchronize_stream(s2).unwrap();
    assert!(dev.event_done(e).unwrap(), "s2 waited for the event and finished, so the event is done");

    // The default streams' handle values are accepted.
    for stream in [StreamId(0), StreamId(1), StreamId(2)] {
        let e = dev.record_event(stream).unwrap();
        dev.stream_wait_event(s1, e).unwrap();
        dev.synchronize().unwrap();
        assert!(dev.event_done(e).unwrap());
        dev.release_event(e);
    }

    // Released and made-up events are refused, not handed to the driver.
    dev.release_event(e);
    assert!(dev.event_done(e).is_err());
    assert!(dev.stream_wait_event(s2, EventId(0xdead_beef)).is_err());
    dev.release_event(EventId(0xdead_beef)); // ignored

    // Events are reused from the cache.
    let a = dev.record_event(s1).unwrap();
    dev.release_event(a);
    let b = dev.record_event(s1).unwrap();
    assert_eq!(a, b, "a released event is recorded again");
    dev.release_event(b);

    dev.free_segment(seg, size).unwrap();
    dev.destroy_stream(s1).unwrap();
    dev.destroy_stream(s2).unwrap();
    assert!(dev.destroy_stream(s2).is_err(), "double destroy refused");
    assert!(dev.destroy_stream(StreamId(0)).is_err(), "the default stream is not ours to destroy");
}

fn out_of_memory_is_reported_as_such() {
    let (_serial, dev) = (serial(), device());
    let total = dev.mem_info().unwrap().total;
    assert_eq!(dev.alloc_segment(total + GIB), Err(DeviceError::OutOfMemory));
    assert_eq!(dev.live_segments(), 0);
    if let Some(g) = dev.vm_granularity() {
        let size = (total + GIB).next_multiple_of(g);
        let base = dev.reserve(size).unwrap();
        assert_eq!(dev.map(base, size), Err(DeviceError::OutOfMemory));
        assert_eq!(dev.mapped_bytes(), 0, "a failed map leaves nothing mapped");
        dev.unreserve(base, size).unwrap();
    }
    // The device still works after an OOM.
    let seg = dev.alloc_segment(MIB).unwrap();
    dev.free_segment(seg, MIB).unwrap();
}

fn pool_over_cuda_with_eight_threads() {
    let (_serial, dev) = (serial(), device());
    let dev = Arc::new(dev);
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
    const SIZES: [u64; 8] = [512, 4096, 100_000, MIB, 3 * MIB, 20 * MIB, 70 * MIB, 130 * MIB];
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (pool, dev) = (pool.clone(), dev.clone());
            thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                let mut live: Vec<(u64, u64, [u8; 8])> = Vec::new();
                for step in 0..600u64 {
                    if live.len() < 24 && (live.is_empty() || rng.below(3) != 0) {
                        let size = SIZES[rng.below(SIZES.len() as u64) as usize];
                        let addr = pool.allocate(size, StreamId(0)).unwrap();
                        assert_eq!(addr % 512, 0);
                        // A tag at both ends of the block: an overlap with another live block
                        // (of any thread) would overwrite one of them.
                        let tag = (t << 56 | step).to_le_bytes();
                        dev.copy_to_device(addr, &tag).unwrap();
                        dev.copy_to_device(addr + size - 8, &tag).unwrap();
                        live.push((addr, size, tag));
                    } else {
                        let (addr, size, tag) = live.swap_remove(rng.below(live.len() as u64) as usize);
                        let (mut head, mut tail) = ([0u8; 8], [0u8; 8]);
                        dev.copy_to_host(addr, &mut head).unwrap();
                        dev.copy_to_host(addr + size - 8, &mut tail).unwrap();
                        assert_eq!((head, tail), (tag, tag), "block {addr:#x} ({size} B) was overwritten");
                        pool.free(addr, None, None).unwrap();
                    }
                }
                for (addr, _, _) in live {
                    pool.free(addr, None, None).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker thread");
    }
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 0);
    assert!(stats.reserved_bytes.current > 0);
    println!(
        "pool: peak allocated {} MiB, peak reserved {} MiB, {} device allocs, {} fast-path hits",
        stats.allocated_bytes.peak / MIB,
        stats.reserved_bytes.peak / MIB,
        stats.num_device_alloc,
        stats.fast_path_hits
    );
    let released = pool.empty_cache().unwrap();
    assert_eq!(released, stats.reserved_bytes.current);
    assert_eq!(dev.live_segments(), 0, "empty_cache gives every segment back to the driver");
}

fn pool_strategies_and_cross_stream_frees() {
    let (_serial, dev) = (serial(), device());
    let dev = Arc::new(dev);
    let other = dev.create_stream().unwrap();
    for strategy in [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid] {
        let config = PoolConfig { strategy, ..PoolConfig::default() };
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
        for size in [512, 64 << 10, 4 * MIB] {
            let a = pool.allocate(size, StreamId(0)).unwrap();
            dev.fill_zero(a, size, StreamId(0)).unwrap();
            // Used on `other` too: its reuse must wait for `other`'s work (an event on it).
            pool.record_stream(a, other).unwrap();
            // `other` is a non-blocking stream: it must wait for stream 0's memset first.
            let zeroed = dev.record_event(StreamId(0)).unwrap();
            dev.stream_wait_event(other, zeroed).unwrap();
            dev.release_event(zeroed);
            dev.fill_zero(a, size, other).unwrap();
            pool.free(a, None, None).unwrap();
            dev.synchronize().unwrap();
            let b = pool.allocate(size, StreamId(0)).unwrap();
            pool.free(b, None, None).unwrap();
        }
        assert_eq!(pool.stats().allocated_bytes.current, 0, "{strategy:?}");
        pool.empty_cache().unwrap();
    }
    dev.destroy_stream(other).unwrap();
    assert_eq!(dev.live_segments(), 0);
}
