//! Expandable segments: the best-fit tier grows one reserved address range by mapping chunks (at
//! most 32 a growth, at least a 1024th of the high-water mark each), trims by unmapping the wholly
//! free ones, and falls back to plain segments where it must.

use std::collections::BTreeMap;
use std::sync::Arc;

use vrampool_core::sizes::{GIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{BlockState, Device, DeviceError, Limit, Pool, PoolConfig, PoolError, SimDevice, SimMode, StreamId};

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);
const CHUNK: u64 = 2 * MIB;

fn pool_with(dev: &Arc<SimDevice>, strategy: StrategyKind, expandable: bool, limit: Option<u64>) -> Pool {
    let config = PoolConfig { strategy, expandable, limit: limit.map(Limit::Bytes), ..PoolConfig::default() };
    Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap()
}

/// What must hold after every call: segments tile, reserved = mapped + segment bytes = what the
/// device has in use, and every device call is counted.
fn check_consistent(pool: &Pool, dev: &SimDevice) {
    let stats = pool.stats();
    let counters = dev.counters();
    let mut reserved = 0;
    for seg in pool.snapshot() {
        let mut cursor = seg.base;
        for &(addr, size, _) in &seg.blocks {
            assert_eq!(addr, cursor, "blocks tile the segment");
            cursor += size;
        }
        assert_eq!(cursor, seg.base + seg.size);
        if seg.expandable {
            assert_eq!(seg.base % CHUNK, 0);
            assert_eq!(seg.size % CHUNK, 0, "an expandable run is whole chunks");
        }
        reserved += seg.size;
    }
    assert_eq!(reserved, stats.reserved_bytes.current, "reserved = the snapshot's segments");
    assert_eq!(reserved, counters.used, "the device agrees");
    assert_eq!(stats.num_device_alloc, counters.alloc_calls + counters.map_calls);
    assert_eq!(stats.num_device_free, counters.free_calls + counters.unmap_calls);
}

/// The expandable runs of the snapshot as (stream, base, size).
fn expandable_runs(pool: &Pool) -> Vec<(StreamId, u64, u64)> {
    pool.snapshot().iter().filter(|s| s.expandable).map(|s| (s.stream, s.base, s.size)).collect()
}

#[test]
fn growth_maps_chunks_into_one_reservation_instead_of_new_segments() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
    let blocks: Vec<u64> = (0..8).map(|_| pool.allocate(3 * MIB, S0).unwrap()).collect();
    let counters = dev.counters();
    assert_eq!(counters.alloc_calls, 0, "no plain segment for the best-fit tier");
    assert_eq!(counters.map_calls, 12, "24 MiB in 2 MiB chunks");
    let runs = expandable_runs(&pool);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (_, base, size) = runs[0];
    assert_eq!(size, 24 * MIB);
    for (k, &b) in blocks.iter().enumerate() {
        assert_eq!(b, base + k as u64 * 3 * MIB, "blocks follow each other across chunk boundaries");
    }
    let stats = pool.stats();
    assert_eq!((stats.segment.current, stats.reserved_bytes.current, stats.num_device_alloc), (1, 24 * MIB, 12));
    // A freed block is reused without any device call; a larger request maps only what the free
    // tail lacks.
    pool.free(blocks[7], None, None).unwrap();
    let again = pool.allocate(3 * MIB, S0).unwrap();
    assert_eq!((again, dev.counters().map_calls), (blocks[7], 12));
    pool.free(again, None, None).unwrap();
    let big = pool.allocate(7 * MIB, S0).unwrap();
    assert_eq!(big, blocks[7], "the free 3 MiB at the end grew by 4 MiB");
    assert_eq!(dev.counters().map_calls, 14);
    check_consistent(&pool, &dev);

    // The same with expandable segments off: plain segments of 6 MiB (room for two blocks).
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::Hybrid, false, None);
    for _ in 0..8 {
        pool.allocate(3 * MIB, S0).unwrap();
    }
    assert_eq!((dev.counters().alloc_calls, dev.counters().map_calls), (4, 0));
    assert!(expandable_runs(&pool).is_empty());
    assert_eq!(pool.stats().reserved_bytes.current, 24 * MIB);
}

#[test]
fn a_block_spans_two_mapped_chunks() {
    let dev = Arc::new(SimDevice::new(256 * MIB, SimMode::HostBacked));
    let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
    let a = pool.allocate(3 * MIB / 2, S0).unwrap();
    let b = pool.allocate(3 * MIB / 2, S0).unwrap();
    assert_eq!(b, a + 3 * MIB / 2);
    assert_eq!(dev.counters().map_calls, 2);
    let boundary = a + CHUNK;
    assert!(b < boundary && boundary < b + 3 * MIB / 2, "b straddles the chunk boundary");
    // Bytes on both sides of the boundary, one write across it, and the block's ends.
    dev.write(boundary - 8, b"left....right...").unwrap();
    dev.write(b, b"first").unwrap();
    dev.write(b + 3 * MIB / 2 - 4, b"last").unwrap();
    assert_eq!(dev.read(boundary - 8, 16).unwrap(), b"left....right...");
    assert_eq!(dev.read(b, 5).unwrap(), b"first");
    assert!(dev.write(a + 4 * MIB - 2, b"past").is_err(), "nothing mapped past the end");
    check_consistent(&pool, &dev);
}

#[test]
fn trim_unmaps_only_wholly_free_chunks_and_holes_map_back() {
    let dev = Arc::new(SimDevice::new(512 * MIB, SimMode::HostBacked));
    let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
    let blocks: Vec<u64> = (0..10).map(|_| pool.allocate(4 * MIB, S0).unwrap()).collect();
    let base = blocks[0];
    // Free [8, 28) MiB inside and [36, 40) MiB at the end; stamp the others.
    for k in [2, 3, 4, 5, 6, 9] {
        pool.free(blocks[k], None, None).unwrap();
    }
    let kept = [0, 1, 7, 8];
    for k in kept {
        dev.write(blocks[k], &[k as u8; 64]).unwrap();
        dev.write(blocks[k] + 4 * MIB - 64, &[k as u8; 64]).unwrap();
    }
    let used = dev.counters().used;
    assert_eq!(used, 40 * MIB);
    let unmaps = dev.counters().unmap_calls;
    let released = pool.trim().unwrap();
    assert_eq!(released, 24 * MIB, "10 chunks inside, 2 at the end");
    assert_eq!(dev.counters().used, used - released, "physical memory went back");
    assert_eq!(dev.counters().unmap_calls - unmaps, 12);
    for k in kept {
        assert_eq!(dev.read(blocks[k], 64).unwrap(), vec![k as u8; 64], "live blocks keep their bytes");
        assert_eq!(dev.read(blocks[k] + 4 * MIB - 64, 64).unwrap(), vec![k as u8; 64]);
    }
    assert!(dev.read(base + 10 * MIB, 8).is_err(), "a hole is unmapped");
    let runs = expandable_runs(&pool);
    assert_eq!(runs, vec![(S0, base, 8 * MIB), (S0, base + 28 * MIB, 8 * MIB)]);
    check_consistent(&pool, &dev);
    assert_eq!(pool.trim().unwrap(), 0, "nothing more is wholly free");

    // 6 MiB fits in the hole: mapping 6 MiB there rather than growing at the end.
    let maps = dev.counters().map_calls;
    let c = pool.allocate(6 * MIB, S0).unwrap();
    assert_eq!(c, base + 8 * MIB);
    assert_eq!(dev.counters().map_calls - maps, 3);
    dev.write(c + 6 * MIB - 8, b"in a map").unwrap();
    check_consistent(&pool, &dev);

    for k in kept {
        pool.free(blocks[k], None, None).unwrap();
    }
    pool.free(c, None, None).unwrap();
    pool.trim().unwrap();
    let counters = dev.counters();
    assert_eq!((counters.used, counters.map_calls), (0, counters.unmap_calls));
    assert!(pool.snapshot().is_empty());
    assert_eq!(pool.stats().segment.current, 0);
    check_consistent(&pool, &dev);
    // And it grows again from nothing.
    let d = pool.allocate(4 * MIB, S0).unwrap();
    dev.write(d, b"again").unwrap();
    check_consistent(&pool, &dev);
}

/// 30 blocks of 9 MiB, every other one freed, then 40 MiB blocks until the limit refuses:
/// returns (reserved after the pattern, 40 MiB blocks served, reserved at the end).
fn fragmentation_pattern(expandable: bool, limit: u64) -> (u64, usize, u64) {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::Hybrid, expandable, Some(limit));
    let blocks: Vec<u64> = (0..30).map(|_| pool.allocate(9 * MIB, S0).unwrap()).collect();
    for b in blocks.iter().skip(1).step_by(2) {
        pool.free(*b, None, None).unwrap();
    }
    let after_pattern = pool.stats().reserved_bytes.current;
    let mut served = 0;
    while served < 20 {
        match pool.allocate(40 * MIB, S0) {
            Ok(_) => served += 1,
            Err(PoolError::OutOfMemory(_)) => break,
            Err(e) => panic!("{e}"),
        }
        check_consistent(&pool, &dev);
    }
    check_consistent(&pool, &dev);
    (after_pattern, served, pool.stats().reserved_bytes.current)
}

#[test]
fn expandable_segments_strand_less_memory_than_plain_segments() {
    let limit = 320 * MIB;
    let plain = fragmentation_pattern(false, limit);
    let expandable = fragmentation_pattern(true, limit);
    eprintln!(
        "limit {} MiB: plain segments reserved {} MiB after the pattern, served {} blocks of 40 MiB, reserved {} MiB at the end",
        limit / MIB,
        plain.0 / MIB,
        plain.1,
        plain.2 / MIB
    );
    eprintln!(
        "limit {} MiB: expandable reserved {} MiB after the pattern, served {} blocks of 40 MiB, reserved {} MiB at the end",
        limit / MIB,
        expandable.0 / MIB,
        expandable.1,
        expandable.2 / MIB
    );
    assert_eq!(plain.0, 270 * MIB, "15 segments of 18 MiB (room for two blocks), each half free");
    assert_eq!(plain.1, 1, "the 50 MiB left under the limit takes one; every segment holds a live block");
    assert_eq!(expandable.0, 270 * MIB, "exactly the 30 blocks");
    assert_eq!(expandable.1, 4, "the free 9 MiB ranges give back 8 MiB each");
    assert!(expandable.2 <= limit);

    // Without a limit: what each reserves for the same 4 blocks of 40 MiB.
    let unlimited = |expandable: bool| {
        let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
        let pool = pool_with(&dev, StrategyKind::Hybrid, expandable, None);
        let blocks: Vec<u64> = (0..30).map(|_| pool.allocate(9 * MIB, S0).unwrap()).collect();
        blocks.iter().skip(1).step_by(2).for_each(|&b| pool.free(b, None, None).unwrap());
        pool.trim().unwrap();
        for _ in 0..4 {
            pool.allocate(40 * MIB, S0).unwrap();
        }
        check_consistent(&pool, &dev);
        pool.stats().reserved_bytes.current
    };
    let (plain, expandable) = (unlimited(false), unlimited(true));
    eprintln!("no limit, trim, 4 blocks of 40 MiB: plain segments reserve {} MiB, expandable {} MiB", plain / MIB, expandable / MIB);
    assert_eq!(plain, 430 * MIB, "15 half-free segments of 18 MiB and 4 of 40 MiB");
    // 135 MiB live, 15 MiB of partial chunks around the holes, 160 MiB for the new blocks.
    assert_eq!(expandable, 310 * MIB);
}

/// A workload over the best-fit tier with growth, trims (holes) and regrowth into holes; every
/// step is checked. Returns the errors met.
fn workload(pool: &Pool, dev: &SimDevice) -> Vec<PoolError> {
    let mut errors = Vec::new();
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut alloc = |size: u64, stream: StreamId, live: &mut BTreeMap<u64, u64>| match pool.allocate(size, stream) {
        Ok(addr) => {
            live.insert(addr, size);
        }
        Err(e) => {
            errors.push(e);
            // The call after a failure succeeds.
            live.insert(pool.allocate(size, stream).unwrap(), size);
        }
    };
    for (k, size) in [3, 5, 12, 2, 30, 7, 9, 4].into_iter().enumerate() {
        alloc(size * MIB + 512, StreamId(k as u64 % 2), &mut live);
        check_consistent(pool, dev);
    }
    let addrs: Vec<u64> = live.keys().copied().collect();
    for addr in addrs.iter().step_by(2) {
        pool.free(*addr, None, None).unwrap();
        live.remove(addr);
    }
    pool.trim().unwrap();
    check_consistent(pool, dev);
    for (k, size) in [6, 11, 3, 25].into_iter().enumerate() {
        alloc(size * MIB, StreamId(k as u64 % 2), &mut live);
        check_consistent(pool, dev);
    }
    for (addr, _) in std::mem::take(&mut live) {
        pool.free(addr, None, None).unwrap();
    }
    errors
}

#[test]
fn a_failed_map_at_any_point_leaves_the_pool_consistent_and_leaks_nothing() {
    let mut faults = 0;
    for n in 1.. {
        let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
        let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
        dev.fail_map_in(n);
        let errors = workload(&pool, &dev);
        if errors.is_empty() {
            assert!(n > dev.counters().map_calls, "the fault at map {n} did not fire");
            break;
        }
        faults += 1;
        assert_eq!(errors, vec![PoolError::Device(DeviceError::InjectedFault("map"))], "map {n}");
        assert_eq!(pool.stats().allocation.current, 0);
        pool.trim().unwrap();
        check_consistent(&pool, &dev);
        let counters = dev.counters();
        assert_eq!(counters.used, 0, "map {n}: nothing leaks");
        assert_eq!(counters.map_calls - 1, counters.unmap_calls, "map {n}: every mapped chunk was unmapped");
        assert!(pool.snapshot().is_empty());
        assert_eq!(pool.stats().segment.current, 0);
        drop(pool);
        assert_eq!(dev.counters().used, 0);
    }
    assert!(faults > 30, "the workload maps chunks at {faults} points");
}

#[test]
fn the_out_of_memory_path_unmaps_free_chunks_of_other_streams_and_retries() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    // Without `reclaim`, which would give stream 1's free chunks back before growing, so that
    // the out-of-memory path is never reached.
    let config =
        PoolConfig { strategy: StrategyKind::Hybrid, limit: Some(Limit::Bytes(64 * MIB)), reclaim: false, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    let other = pool.allocate(40 * MIB, S1).unwrap();
    let keep = pool.allocate(2 * MIB, S1).unwrap();
    pool.free(other, None, None).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 42 * MIB);
    let a = pool.allocate(40 * MIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.num_alloc_retries, stats.num_ooms), (1, 0));
    assert_eq!(stats.reserved_bytes.current, 42 * MIB, "stream 1's free 40 MiB went back, 2 MiB stay");
    let runs = expandable_runs(&pool);
    assert_eq!(runs.len(), 2);
    assert!(runs.contains(&(S1, other + 40 * MIB, 2 * MIB)), "{runs:?}: the hole split stream 1's segment");
    check_consistent(&pool, &dev);
    // A request that cannot fit: a clear OOM, and the pool stays consistent.
    let err = pool.allocate(30 * MIB, S0).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory(r) if r.requested == 30 * MIB && r.limit == Some(64 * MIB)));
    check_consistent(&pool, &dev);
    pool.free(a, None, None).unwrap();
    pool.free(keep, None, None).unwrap();
    pool.trim().unwrap();
    assert_eq!(dev.counters().used, 0);
}

/// Each stream's arena holds reservations of its own: two streams growing in turns map into two
/// ranges, each stream's blocks back to back in its own, and giving back one stream's free memory
/// leaves the other's mapped.
#[test]
fn each_stream_grows_a_reservation_of_its_own() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
    let mut blocks: BTreeMap<StreamId, Vec<u64>> = BTreeMap::new();
    for _ in 0..4 {
        for stream in [S0, S1] {
            blocks.entry(stream).or_default().push(pool.allocate(3 * MIB, stream).unwrap());
        }
    }
    let runs = expandable_runs(&pool);
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (stream, addrs) in &blocks {
        let run = runs.iter().find(|r| r.0 == *stream).unwrap_or_else(|| panic!("{runs:?}: no run of {stream:?}"));
        assert_eq!((run.1, run.2), (addrs[0], 12 * MIB), "{stream:?} grows its own range from its start");
        assert!(addrs.iter().enumerate().all(|(k, &a)| a == addrs[0] + k as u64 * 3 * MIB), "{stream:?}: {addrs:?}");
    }
    assert!(runs[0].1.abs_diff(runs[1].1) >= 256 * MIB, "{runs:?}: two reservations, not one shared");
    assert_eq!(dev.counters().alloc_calls, 0);
    check_consistent(&pool, &dev);
    for &addr in &blocks[&S1] {
        pool.free(addr, None, None).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(expandable_runs(&pool), vec![(S0, blocks[&S0][0], 12 * MIB)], "stream 0's mappings stay");
    check_consistent(&pool, &dev);
}

#[test]
fn the_pure_best_fit_strategy_grows_a_new_range_when_the_first_is_full() {
    let dev = Arc::new(SimDevice::new(8 * GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::BestFit, true, None);
    // Small blocks share the expandable segment with the large ones.
    let small = pool.allocate(1000, S0).unwrap();
    let a = pool.allocate(700 * MIB, S0).unwrap();
    let b = pool.allocate(700 * MIB, S0).unwrap();
    // 256 MiB first: too small for 700 MiB, so a 1 GiB range; the second 700 MiB block needs a
    // third range (4 GiB).
    let runs = expandable_runs(&pool);
    assert_eq!(runs.iter().map(|r| r.2).collect::<Vec<_>>(), vec![2 * MIB, 700 * MIB, 700 * MIB], "{runs:?}");
    assert!(runs[0].1 < runs[1].1 && runs[1].1 + GIB <= runs[2].1);
    assert_eq!(dev.counters().alloc_calls, 0);
    check_consistent(&pool, &dev);
    for x in [a, b, small] {
        pool.free(x, None, None).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!((dev.counters().used, pool.stats().segment.current), (0, 0));
    assert!(pool.snapshot().is_empty());
}

#[test]
fn without_vm_or_when_turned_off_the_tier_keeps_plain_segments() {
    for (vm, expandable) in [(false, true), (true, false)] {
        for strategy in [StrategyKind::Hybrid, StrategyKind::BestFit] {
            let dev = SimDevice::new(GIB, SimMode::HostBacked);
            let dev = Arc::new(if vm { dev } else { dev.without_vm() });
            let pool = pool_with(&dev, strategy, expandable, None);
            let blocks: Vec<u64> = [3 * MIB, 9 * MIB, 30 * MIB].iter().map(|&s| pool.allocate(s, S0).unwrap()).collect();
            assert_eq!(dev.counters().map_calls, 0);
            assert!(expandable_runs(&pool).is_empty());
            assert_eq!(pool.stats().segment.current, 3, "segments of 6, 18 and 30 MiB");
            blocks.iter().for_each(|&b| pool.free(b, None, None).unwrap());
            check_consistent(&pool, &dev);
            pool.trim().unwrap();
            assert_eq!(dev.counters().used, 0);
        }
    }
    // Slab and buddy never map.
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    for strategy in [StrategyKind::Slab, StrategyKind::Buddy] {
        let pool = pool_with(&dev, strategy, true, None);
        pool.allocate(9 * MIB, S0).unwrap();
        assert_eq!(dev.counters().map_calls, 0);
    }
}

#[test]
fn drop_unmaps_and_unreserves_everything_even_with_live_blocks() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::HostBacked));
    let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
    let mut kept = Vec::new();
    for stream in [S0, S1] {
        let blocks: Vec<u64> = (0..6).map(|_| pool.allocate(5 * MIB, stream).unwrap()).collect();
        pool.free(blocks[2], None, None).unwrap();
        pool.free(blocks[3], None, None).unwrap();
        kept.push(blocks[0]);
    }
    pool.allocate(100, S0).unwrap();
    pool.allocate(100 * MIB, S1).unwrap();
    pool.trim().unwrap();
    check_consistent(&pool, &dev);
    assert!(dev.counters().used > 0);
    assert!(pool.snapshot().iter().any(|s| matches!(s.blocks[0].2, BlockState::Active { .. }) && s.expandable));
    drop(pool);
    let counters = dev.counters();
    assert_eq!((counters.used, counters.live_segments), (0, 0));
    assert_eq!(counters.map_calls, counters.unmap_calls);
}

#[test]
fn threads_growing_and_trimming_at_once_keep_blocks_intact() {
    let dev = Arc::new(SimDevice::new(512 * MIB, SimMode::HostBacked));
    let pool = Arc::new(pool_with(&dev, StrategyKind::Hybrid, true, None));
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let (pool, dev) = (Arc::clone(&pool), Arc::clone(&dev));
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                let mut live: Vec<(u64, u64, [u8; 8])> = Vec::new();
                for i in 0..1500u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if live.len() < 8 && rng % 2 == 0 || live.is_empty() {
                        let size = MIB + 512 + (rng >> 8) % (12 * MIB);
                        let addr = pool.allocate(size, StreamId(t % 2)).unwrap();
                        let tag = (t << 56 | i).to_le_bytes();
                        dev.write(addr, &tag).unwrap();
                        dev.write(addr + size - 8, &tag).unwrap();
                        live.push((addr, size, tag));
                    } else {
                        let (addr, size, tag) = live.swap_remove((rng >> 8) as usize % live.len());
                        assert_eq!(dev.read(addr, 8).unwrap(), tag);
                        assert_eq!(dev.read(addr + size - 8, 8).unwrap(), tag);
                        pool.free(addr, None, None).unwrap();
                    }
                    if i % 50 == 0 {
                        pool.trim().unwrap();
                    }
                }
                for (addr, _, _) in live {
                    pool.free(addr, None, None).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    pool.trim().unwrap();
    check_consistent(&pool, &dev);
    assert_eq!(dev.counters().used, 0);
    assert!(dev.counters().map_calls > 100);
}

#[test]
fn cached_memory_at_the_end_grows_in_place_without_a_release_and_retry() {
    // tests/pool.rs's OOM scenario: with plain segments the 60 MiB block needs the cache given
    // back and a retry; here the 30 MiB free at the end of the segment just grows by 30 MiB.
    let dev = Arc::new(SimDevice::new(64 * MIB, SimMode::HostBacked));
    let pool = pool_with(&dev, StrategyKind::BestFit, true, None);
    let small: Vec<u64> = (0..30).map(|_| pool.allocate(MIB, S0).unwrap()).collect();
    small.iter().for_each(|&b| pool.free(b, None, None).unwrap());
    let big = pool.allocate(60 * MIB, S0).unwrap();
    // (A few 1 MiB blocks stay in this thread's cache, so the big one starts a little later.)
    assert!(big >= small[0] && big + 60 * MIB <= small[0] + 64 * MIB);
    let stats = pool.stats();
    assert_eq!((stats.num_alloc_retries, stats.num_ooms, dev.counters().alloc_calls), (0, 0, 0));
    let err = pool.allocate(30 * MIB, S0).unwrap_err();
    let PoolError::OutOfMemory(report) = &err else { panic!("expected OOM, got {err}") };
    assert_eq!((report.requested, report.allocated), (30 * MIB, 60 * MIB));
    assert_eq!(report.reserved, 60 * MIB, "the release before the retry unmapped the cached blocks' chunks");
    assert_eq!(pool.stats().num_alloc_retries, 1);
    pool.free(big, None, None).unwrap();
    assert!(pool.allocate(30 * MIB, S0).is_ok(), "memory is usable again after the free");
    check_consistent(&pool, &dev);
    drop(pool);
    assert_eq!(dev.counters().used, 0);
}

#[test]
fn before_growing_the_tier_unmaps_its_own_free_chunks_inside_but_keeps_its_free_tail() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::BestFit, true, None);
    // [a 6 MiB | b 2 MiB | c 2 MiB | d 2 MiB]: six chunks mapped.
    let [a, b, c, d] = [6, 2, 2, 2].map(|mib| pool.allocate(mib * MIB, S0).unwrap());
    let base = a;
    assert_eq!((b, c, d), (base + 6 * MIB, base + 8 * MIB, base + 10 * MIB));
    pool.free(a, None, None).unwrap();
    pool.free(d, None, None).unwrap();
    assert_eq!(dev.counters().map_calls, 6);
    // 8 MiB fits neither the 6 MiB free inside nor the 2 MiB free at the end: the tier grows.
    // First its three free chunks inside are unmapped (they become a hole); the free tail stays
    // mapped and the growth extends it by three chunks, so the block starts where d was.
    let big = pool.allocate(8 * MIB, S0).unwrap();
    assert_eq!(big, base + 10 * MIB);
    let counters = dev.counters();
    assert_eq!((counters.unmap_calls, counters.map_calls), (3, 9), "the tail was not unmapped and mapped again");
    assert_eq!(pool.stats().reserved_bytes.current, 12 * MIB, "b, c and the new block; not the 6 MiB hole");
    check_consistent(&pool, &dev);
    // The hole maps again when a block needs it.
    let again = pool.allocate(6 * MIB, S0).unwrap();
    assert_eq!(again, base);
    assert_eq!(pool.stats().reserved_bytes.current, 18 * MIB);
    check_consistent(&pool, &dev);

    // Without `reclaim` the tier keeps its free chunks and grows beside them.
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: true, reclaim: false, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    let [a, _, _, d] = [6, 2, 2, 2].map(|mib| pool.allocate(mib * MIB, S0).unwrap());
    pool.free(a, None, None).unwrap();
    pool.free(d, None, None).unwrap();
    pool.allocate(8 * MIB, S0).unwrap();
    assert_eq!((dev.counters().unmap_calls, pool.stats().reserved_bytes.current), (0, 18 * MIB));
}

mod random {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { size: u64, stream: u64 },
        Free { nth: usize },
        Trim,
        FailMap { in_calls: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (prop_oneof![3 => (MIB + 1)..(16 * MIB), 1 => (16 * MIB)..(60 * MIB), 1 => 1u64..MIB], 0u64..2)
                .prop_map(|(size, stream)| Op::Alloc { size, stream }),
            5 => any::<usize>().prop_map(|nth| Op::Free { nth }),
            1 => Just(Op::Trim),
            1 => (1u64..6).prop_map(|in_calls| Op::FailMap { in_calls }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        /// Random growth, frees, trims (holes), map faults and a limit: the pool stays
        /// consistent with the device after every step, and gives everything back at the end.
        #[test]
        fn random_use_stays_consistent(best_fit in any::<bool>(), limit in prop::option::of(100u64..400), ops in prop::collection::vec(op(), 1..100)) {
            let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
            let strategy = if best_fit { StrategyKind::BestFit } else { StrategyKind::Hybrid };
            let pool = pool_with(&dev, strategy, true, limit.map(|l| l * MIB));
            let mut live: BTreeMap<u64, u64> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Alloc { size, stream } => match pool.allocate(size, StreamId(stream)) {
                        Ok(addr) => {
                            let end = addr + size;
                            prop_assert!(live.range(..end).next_back().is_none_or(|(&a, &s)| a + s <= addr), "overlap");
                            prop_assert!(live.insert(addr, size).is_none());
                        }
                        Err(PoolError::OutOfMemory(_)) | Err(PoolError::Device(DeviceError::InjectedFault("map"))) => {}
                        Err(e) => prop_assert!(false, "unexpected error {}", e),
                    },
                    Op::Free { nth } => {
                        if live.is_empty() { continue; }
                        let addr = *live.keys().nth(nth % live.len()).unwrap();
                        let size = live.remove(&addr).unwrap();
                        pool.free(addr, Some(size), None).unwrap();
                    }
                    Op::Trim => { pool.trim().unwrap(); }
                    Op::FailMap { in_calls } => dev.fail_map_in(in_calls),
                }
                check_consistent(&pool, &dev);
                prop_assert_eq!(pool.stats().allocation.current, live.len() as u64);
            }
            for (&addr, &size) in &live {
                pool.free(addr, Some(size), None).unwrap();
            }
            pool.trim().unwrap();
            check_consistent(&pool, &dev);
            prop_assert_eq!(dev.counters().used, 0, "nothing leaks");
            prop_assert!(pool.snapshot().is_empty());
            prop_assert_eq!(pool.stats().segment.current, 0);
        }
    }
}

#[test]
fn a_large_growth_is_mapped_in_at_most_32_pieces_and_given_back_piece_by_piece() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::HostBacked));
    let pool = pool_with(&dev, StrategyKind::BestFit, true, None);
    // 100 MiB is 50 units of 2 MiB: 25 pieces of 4 MiB, not 50 maps (nor one).
    let big = pool.allocate(100 * MIB, S0).unwrap();
    assert_eq!(dev.counters().map_calls, 25);
    pool.free(big, None, None).unwrap();
    let small = pool.allocate(10 * MIB, S0).unwrap();
    assert_eq!(small, big, "the freed growth serves the next block");
    // Trim: the 22 pieces past the block go back; the piece the block ends in stays whole.
    assert_eq!(pool.trim().unwrap(), 88 * MIB);
    assert_eq!((dev.counters().unmap_calls, dev.counters().used), (22, 12 * MIB));
    check_consistent(&pool, &dev);
    // The free 2 MiB of that piece is still the strategy's: a block there makes no device call.
    let maps = dev.counters().map_calls;
    let rest = pool.allocate(2 * MIB, S0).unwrap();
    assert_eq!(rest, small + 10 * MIB);
    assert_eq!(dev.counters().map_calls, maps);
    dev.write(rest + 2 * MIB - 8, b"the end.").unwrap();
    pool.free(small, None, None).unwrap();
    pool.free(rest, None, None).unwrap();
    assert_eq!(pool.trim().unwrap(), 12 * MIB, "wholly free: the three pieces go back");
    assert_eq!(dev.counters().unmap_calls, 25);
    check_consistent(&pool, &dev);
}

#[test]
fn a_huge_growth_is_32_map_calls() {
    // 32 TiB on the address-only device: 32 maps and as many entries of bookkeeping, not 16 million.
    const TIB: u64 = 1 << 40;
    let dev = Arc::new(SimDevice::new(64 * TIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::BestFit, true, None);
    let block = pool.allocate(32 * TIB, S0).unwrap();
    assert_eq!((dev.counters().map_calls, dev.counters().used), (32, 32 * TIB));
    assert_eq!(expandable_runs(&pool), vec![(S0, block, 32 * TIB)]);
    pool.free(block, None, None).unwrap();
    assert_eq!(pool.trim().unwrap(), 32 * TIB);
    assert_eq!((dev.counters().unmap_calls, dev.counters().used), (32, 0));
    check_consistent(&pool, &dev);
}

#[test]
fn a_large_pool_maps_a_growth_in_pieces_of_its_share() {
    let dev = Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly));
    let pool = pool_with(&dev, StrategyKind::Hybrid, true, None);
    let small = pool.allocate(40 * MIB, S0).unwrap();
    assert_eq!(dev.counters().map_calls, 20, "a small pool: 40 MiB in 2 MiB chunks");
    // 4 GiB reserved once (the large tier's segment): a piece is now at least 4 MiB.
    let large = pool.allocate(4 * GIB, S0).unwrap();
    let maps = dev.counters().map_calls;
    let grown = pool.allocate(40 * MIB, S0).unwrap();
    assert_eq!(dev.counters().map_calls - maps, 10);
    check_consistent(&pool, &dev);
    for b in [small, large, grown] {
        pool.free(b, None, None).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(dev.counters().used, 0);
}

#[test]
fn a_shared_pool_grows_by_plain_segments_only() {
    // Issue 50: an importer maps one physical allocation per block, so `ipc` turns expandable
    // segments off even where the device could grow them.
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let config = PoolConfig { ipc: true, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    let _blocks: Vec<u64> = (0..4).map(|_| pool.allocate(3 * MIB, S0).unwrap()).collect();
    assert_eq!(dev.counters().map_calls, 0);
    assert!(expandable_runs(&pool).is_empty());
    check_consistent(&pool, &dev);
}
