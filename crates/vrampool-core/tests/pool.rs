//! The pool's behaviour through its public API, on the simulated device.

use std::sync::Arc;

use vrampool_core::sizes::{GIB, KIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{
    BlockState, Device, DeviceError, EventKind, InvalidFreeReason, Limit, OomReport, Pool, PoolConfig, PoolError, SimDevice, SimMode,
    Stats, StreamId,
};

const S0: StreamId = StreamId(0);
const ALL: [StrategyKind; 4] = [StrategyKind::Hybrid, StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy];

fn pool_on(capacity: u64, strategy: StrategyKind) -> (Pool, Arc<SimDevice>) {
    let dev = Arc::new(SimDevice::new(capacity, SimMode::HostBacked));
    let config = PoolConfig { strategy, ..PoolConfig::default() };
    (Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap(), dev)
}

#[test]
fn every_strategy_serves_every_size_and_gives_it_all_back() {
    for strategy in ALL {
        let (pool, dev) = pool_on(4 * GIB, strategy);
        let sizes = [1, 512, 513, 4096, 64 * KIB + 3, MIB, 4 * MIB, 64 * MIB, 300 * MIB];
        let blocks: Vec<u64> = sizes.iter().map(|&s| pool.allocate(s, S0).unwrap()).collect();
        for (&b, &s) in blocks.iter().zip(&sizes) {
            assert_eq!(b % 512, 0, "{strategy:?}: block of {s} B at {b:#x} is not 512-aligned");
            dev.write(b + s - 1, &[0xAB]).unwrap();
        }
        let stats = pool.stats();
        assert_eq!(stats.allocation.current, sizes.len() as u64);
        assert_eq!(stats.requested_bytes.current, sizes.iter().sum::<u64>());
        assert!(stats.allocated_bytes.current >= stats.requested_bytes.current);
        for b in blocks {
            pool.free(b, None, None).unwrap();
        }
        assert_eq!(pool.stats().allocated_bytes.current, 0);
        assert!(pool.stats().reserved_bytes.current > 0, "{strategy:?}: freed memory stays cached");
        let released = pool.trim().unwrap();
        assert_eq!(released, pool.stats().reserved_bytes.freed);
        assert_eq!(pool.stats().reserved_bytes.current, 0, "{strategy:?}: trim gives every segment back");
        assert_eq!(dev.counters().live_segments, 0);
    }
}

#[test]
fn freed_blocks_are_reused_without_new_segments() {
    for strategy in ALL {
        let (pool, _) = pool_on(GIB, strategy);
        for size in [512, 3000, 100 * KIB, 8 * MIB, 80 * MIB] {
            let a = pool.allocate(size, S0).unwrap();
            pool.free(a, Some(size), None).unwrap();
            let device_allocs = pool.stats().num_device_alloc;
            let b = pool.allocate(size, S0).unwrap();
            assert_eq!(pool.stats().num_device_alloc, device_allocs, "{strategy:?} {size}: cached block reused");
            assert_eq!(a, b, "{strategy:?} {size}");
            pool.free(b, None, None).unwrap();
        }
    }
}

#[test]
fn small_blocks_come_back_through_the_lock_free_fast_path() {
    let (pool, _) = pool_on(GIB, StrategyKind::Hybrid);
    let a = pool.allocate(1000, S0).unwrap();
    pool.free(a, None, None).unwrap();
    let b = pool.allocate(1000, S0).unwrap();
    assert_eq!(a, b);
    assert_eq!(pool.stats().fast_path_hits, 1);
    // A cached block shows in the snapshot as cached, not free and not active.
    pool.free(b, None, None).unwrap();
    let states: Vec<BlockState> = pool.snapshot().iter().flat_map(|s| s.blocks.iter().map(|b| b.2)).collect();
    assert!(states.contains(&BlockState::Cached));
    assert!(!states.iter().any(|s| matches!(s, BlockState::Active { .. })));
}

#[test]
fn blocks_of_a_class_size_come_back_without_a_lock_in_every_tier() {
    // Hybrid: 512 B (slab), 4 MiB (best-fit), 64 MiB (buddy); and the single strategies, of which
    // the slab caches only its shared slabs' classes (see the next test).
    for strategy in ALL {
        let (pool, _) = pool_on(GIB, strategy);
        let mut last = 0;
        let sizes: &[u64] = if strategy == StrategyKind::Slab { &[512] } else { &[512, 4 * MIB, 64 * MIB] };
        for (k, &size) in sizes.iter().enumerate() {
            let a = pool.allocate(size, S0).unwrap();
            pool.free(a, None, None).unwrap();
            let b = pool.allocate(size, S0).unwrap();
            assert_eq!(a, b, "{strategy:?} {size}");
            assert_eq!(pool.stats().fast_path_hits, k as u64 + 1, "{strategy:?} {size}: a cache hit");
            pool.free(b, None, None).unwrap();
            last = b;
        }
        // A cached block is cached, not free, until its strategy needs it back.
        let state = pool.snapshot().iter().flat_map(|s| s.blocks.clone()).find(|b| b.0 == last).map(|b| b.2);
        assert_eq!(state, Some(BlockState::Cached), "{strategy:?}");
        pool.trim().unwrap();
        assert_eq!(pool.stats().reserved_bytes.current, 0, "{strategy:?}: a trim gives cached blocks back too");
    }
}

#[test]
fn a_freed_slab_run_goes_back_at_once_and_the_next_run_is_carved_lowest_address_first() {
    for strategy in [StrategyKind::Hybrid, StrategyKind::Slab] {
        // Segments at rising addresses: host memory's come in whatever order the host maps them
        // (mapped top-down, a second segment lay below the first when this test ran alone).
        let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig { strategy, ..PoolConfig::default() }).unwrap();
        // Two 1 MiB runs fill a 2 MiB segment; a third starts a second segment, half free.
        let low = pool.allocate(MIB, S0).unwrap();
        let _beside = pool.allocate(MIB, S0).unwrap();
        let _high = pool.allocate(MIB, S0).unwrap();
        assert_eq!(dev.counters().alloc_calls, 2, "{strategy:?}");
        pool.free(low, None, None).unwrap();
        // A run of another class takes the freed run's place, not the second segment's free half:
        // a cached run would keep its place while the slab carved the new one above it.
        let next = pool.allocate(768 * KIB, S0).unwrap();
        assert_eq!(next, low, "{strategy:?}");
        // A run of the freed one's class is carved again too, not served from a cache.
        pool.free(next, None, None).unwrap();
        let again = pool.allocate(MIB, S0).unwrap();
        assert_eq!((again, pool.stats().fast_path_hits), (low, 0), "{strategy:?}");
        // The shared slabs' classes are still cached.
        let small = pool.allocate(32 * KIB, S0).unwrap();
        pool.free(small, None, None).unwrap();
        assert_eq!(pool.allocate(32 * KIB, S0).unwrap(), small);
        assert_eq!(pool.stats().fast_path_hits, 1, "{strategy:?}");
        assert_eq!(dev.counters().alloc_calls, 2, "{strategy:?}: nothing grew");
    }
}

#[test]
fn a_freed_run_where_the_next_run_of_its_class_goes_comes_back_without_the_lock() {
    for strategy in [StrategyKind::Hybrid, StrategyKind::Slab] {
        let (pool, dev) = pool_on(GIB, strategy);
        let a = pool.allocate(64 * KIB, S0).unwrap();
        pool.free(a, None, None).unwrap();
        assert_eq!(pool.allocate(64 * KIB, S0).unwrap(), a, "{strategy:?}");
        assert_eq!(pool.stats().fast_path_hits, 1, "{strategy:?}: the kept run");
        // Kept again, it goes back before the tier places another class: a 40 KiB run takes its place.
        pool.free(a, None, None).unwrap();
        assert_eq!(pool.allocate(40 * KIB, S0).unwrap(), a, "{strategy:?}");
        // And before the tier frees anything: the kept 64 KiB run above merges with the freed
        // 40 KiB one, and the next 64 KiB run is carved at the lowest address.
        let above = pool.allocate(64 * KIB, S0).unwrap();
        assert_eq!(above, a + 40 * KIB, "{strategy:?}");
        pool.free(above, None, None).unwrap();
        pool.free(a, None, None).unwrap();
        assert_eq!(pool.allocate(64 * KIB, S0).unwrap(), a, "{strategy:?}");
        // A run freed above a free range that holds its size is not kept: the next run goes lower.
        let second = pool.allocate(64 * KIB, S0).unwrap();
        pool.free(a, None, None).unwrap();
        pool.free(second, None, None).unwrap();
        assert_eq!(pool.allocate(64 * KIB, S0).unwrap(), a, "{strategy:?}");
        assert_eq!(pool.stats().fast_path_hits, 1, "{strategy:?}: no hit but the first");
        // A trim gives back the segment of a kept run.
        pool.free(a, None, None).unwrap();
        pool.trim().unwrap();
        assert_eq!((pool.stats().reserved_bytes.current, dev.counters().used), (0, 0), "{strategy:?}");
    }
}

#[test]
fn cached_large_blocks_go_back_to_their_strategy_before_it_places_another_request() {
    for reclaim in [true, false] {
        let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
        let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: false, reclaim, ..PoolConfig::default() };
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
        // Two 4 MiB blocks side by side in one segment, both freed into the cache.
        let a = pool.allocate(4 * MIB, S0).unwrap();
        let b = pool.allocate(4 * MIB, S0).unwrap();
        assert_eq!(b, a + 4 * MIB);
        let segments = dev.counters().alloc_calls;
        pool.free(a, None, None).unwrap();
        pool.free(b, None, None).unwrap();
        // 8 MiB is no cached class: the strategy gets both blocks back, merges them and places
        // the request there, with no new segment.
        let big = pool.allocate(8 * MIB, S0).unwrap();
        assert_eq!((big, dev.counters().alloc_calls), (a, segments), "reclaim {reclaim}");
        assert_eq!(pool.stats().fast_path_hits, 0);
    }
}

#[test]
fn a_class_that_two_tiers_hand_out_is_cached_for_one_only() {
    // small_max 100 KiB: a 100 KiB request gets a 112 KiB slab block (its class), a 112 KiB
    // request a 112 KiB best-fit block. Only best-fit's is cached (it hands that class out for
    // 112 KiB requests); each goes back to its own tier (a debug assertion checks it).
    let dev = Arc::new(SimDevice::new(GIB, SimMode::HostBacked));
    let config = PoolConfig { small_max: 100 * KIB, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    for _ in 0..3 {
        let slab = pool.allocate(100 * KIB, S0).unwrap();
        let best_fit = pool.allocate(112 * KIB, S0).unwrap();
        pool.free(slab, None, None).unwrap();
        pool.free(best_fit, None, None).unwrap();
    }
    assert_eq!(pool.stats().fast_path_hits, 2, "the best-fit block, on the second and third rounds");
    pool.trim().unwrap();
    assert_eq!((pool.stats().reserved_bytes.current, dev.counters().live_segments), (0, 0));
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let (pool, _) = pool_on(GIB, StrategyKind::Hybrid);
    let a = pool.allocate(4096, S0).unwrap();
    let before = pool.stats();
    let size_err = |r: Result<u64, PoolError>| matches!(r, Err(PoolError::InvalidSize { .. }));
    assert!(size_err(pool.allocate(0, S0)));
    assert!(size_err(pool.allocate(u64::MAX, S0)), "absurd size, no overflow");
    let not_allocated = |r| matches!(r, Err(PoolError::InvalidFree { reason: InvalidFreeReason::NotAllocated, .. }));
    assert!(not_allocated(pool.free(0xdead_beef, None, None)), "foreign pointer");
    assert!(not_allocated(pool.free(a + 512, None, None)), "interior pointer");
    assert!(matches!(
        pool.free(a, Some(100), None),
        Err(PoolError::InvalidFree { reason: InvalidFreeReason::WrongSize { expected: 4096, given: 100 }, .. })
    ));
    assert_eq!(pool.stats(), before, "refused calls change no counter");
    // More than the device holds is out of memory (callers catching that must see it), and only
    // counts as one.
    let err = pool.allocate(2 * GIB, S0).unwrap_err();
    let PoolError::OutOfMemory(report) = err else { panic!("more than the device holds gave {err}") };
    assert_eq!((report.requested, report.allocated), (2 * GIB, 4096));
    assert_eq!(pool.stats(), Stats { num_ooms: before.num_ooms + 1, ..before });
    pool.free(a, Some(4096), None).unwrap();
    assert!(not_allocated(pool.free(a, None, None)), "double free");
    assert!(matches!(pool.check_device(1), Err(PoolError::WrongDevice { pool: 0, given: 1 })));
    pool.close();
    assert_eq!(pool.allocate(512, S0), Err(PoolError::Closed));
    assert_eq!(pool.free(a, None, None), Err(PoolError::Closed));
}

#[test]
fn out_of_memory_releases_the_cache_retries_and_then_explains() {
    // Plain segments: with expandable ones the cached tail would simply grow in place. Without
    // `reclaim`, which would give most of the cache back before growing, without a retry.
    let dev = Arc::new(SimDevice::new(64 * MIB, SimMode::HostBacked));
    let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: false, reclaim: false, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    // Fill the device with cached small segments, then ask for a large block: the pool must give
    // its cache back and retry.
    let small: Vec<u64> = (0..30).map(|_| pool.allocate(MIB, S0).unwrap()).collect();
    small.iter().for_each(|&b| pool.free(b, None, None).unwrap());
    assert!(pool.stats().reserved_bytes.current >= 30 * MIB);
    let big = pool.allocate(60 * MIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_ooms, 0);
    // Now a request that cannot fit at all.
    let err = pool.allocate(30 * MIB, S0).unwrap_err();
    let PoolError::OutOfMemory(report) = &err else { panic!("expected OOM, got {err}") };
    assert_eq!(report.requested, 30 * MIB);
    assert_eq!(report.allocated, 60 * MIB);
    assert!(report.reserved >= 60 * MIB);
    let text = err.to_string();
    assert!(text.contains("tried to allocate 30.00 MiB") && text.contains("reserved but unallocated"), "{text}");
    assert_eq!(pool.stats().num_ooms, 1);
    pool.free(big, None, None).unwrap();
    assert!(pool.allocate(30 * MIB, S0).is_ok(), "memory is usable again after the free");
    drop(pool);
    assert_eq!(dev.counters().live_segments, 0, "dropping the pool frees every segment");
}

#[test]
fn a_limit_caps_reservation_and_can_change() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    let config = PoolConfig { limit: Some(Limit::Fraction(0.25)), ..PoolConfig::default() };
    let pool = Pool::new(dev as Arc<dyn Device>, config).unwrap();
    assert_eq!(pool.capacity(), GIB / 4);
    let err = pool.allocate(300 * MIB, S0).unwrap_err();
    assert!(
        matches!(err, PoolError::OutOfMemory(OomReport { requested, limit: Some(l), .. }) if requested == 300 * MIB && l == GIB / 4),
        "{err}"
    );
    let a = pool.allocate(200 * MIB, S0).unwrap();
    let err = pool.allocate(100 * MIB, S0).unwrap_err();
    let PoolError::OutOfMemory(report) = err else { panic!("expected OOM") };
    assert_eq!(report.limit, Some(GIB / 4));
    pool.set_limit(Some(Limit::Bytes(GIB))).unwrap();
    assert!(pool.allocate(100 * MIB, S0).is_ok());
    assert!(pool.set_limit(Some(Limit::Fraction(1.5))).is_err());
    pool.free(a, None, None).unwrap();
}

#[test]
fn a_lowered_limit_refuses_even_blocks_a_thread_has_cached() {
    let (pool, _) = pool_on(GIB, StrategyKind::Hybrid);
    let (small, large) = (512, 8 * KIB);
    for size in [small, large] {
        let a = pool.allocate(size, S0).unwrap();
        pool.free(a, None, None).unwrap();
    }
    pool.set_limit(Some(Limit::Bytes(4 * KIB))).unwrap();
    assert!(matches!(pool.allocate(large, S0), Err(PoolError::OutOfMemory(_))), "a cached block above the cap is not handed out");
    let hits = pool.stats().fast_path_hits;
    let a = pool.allocate(small, S0).unwrap();
    assert_eq!(pool.stats().fast_path_hits, hits + 1, "one below the cap still is");
    pool.free(a, None, None).unwrap();
    pool.set_limit(None).unwrap();
    let b = pool.allocate(large, S0).unwrap();
    assert_eq!(pool.stats().fast_path_hits, hits + 2, "the cached block serves again once the cap allows it");
    pool.free(b, None, None).unwrap();
}

#[test]
fn two_pools_used_in_turn_on_one_thread_keep_their_cached_blocks_apart() {
    let (a, _) = pool_on(GIB, StrategyKind::Hybrid);
    let (b, _) = pool_on(GIB, StrategyKind::Hybrid);
    let from_a: Vec<u64> = (0..8).map(|_| a.allocate(512, S0).unwrap()).collect();
    from_a.iter().for_each(|&p| a.free(p, None, None).unwrap());
    let b_segments = b.stats().num_device_alloc;
    let from_b: Vec<u64> = (0..8).map(|_| b.allocate(512, S0).unwrap()).collect();
    assert_eq!(b.stats().num_device_alloc, b_segments + 1, "b reserves its own memory rather than take a's cached blocks");
    assert_eq!(b.stats().fast_path_hits, 0);
    assert_eq!(a.stats().allocated_bytes.current, 0);
    let again: Vec<u64> = (0..8).map(|_| a.allocate(512, S0).unwrap()).collect();
    assert_eq!(a.stats().fast_path_hits, 8, "a's blocks waited in a's cache");
    for (pool, blocks) in [(&a, again), (&b, from_b)] {
        blocks.iter().for_each(|&p| pool.free(p, None, None).unwrap());
        assert_eq!(pool.stats().allocated_bytes.current, 0);
    }
}

#[test]
fn device_faults_surface_as_errors_and_leave_the_pool_consistent() {
    let (pool, dev) = pool_on(GIB, StrategyKind::Hybrid);
    let a = pool.allocate(8 * MIB, S0).unwrap();
    dev.fail_alloc_in(1);
    let err = pool.allocate(100 * MIB, S0).unwrap_err();
    assert_eq!(err, PoolError::Device(DeviceError::InjectedFault("segment allocation")));
    let stats = pool.stats();
    assert_eq!(stats.allocation.current, 1);
    assert_eq!(stats.reserved_bytes.current, dev.counters().used);
    assert!(pool.allocate(100 * MIB, S0).is_ok(), "the next call succeeds");
    pool.free(a, None, None).unwrap();
}

#[test]
fn a_block_freed_on_its_stream_is_reused_there_and_not_elsewhere() {
    // Without `reclaim`: it would give s1's idle memory back to the device (which synchronises
    // first) before s2 grows, and the device may then hand s2 the same addresses.
    let dev = Arc::new(SimDevice::new(GIB, SimMode::HostBacked));
    let config = PoolConfig { reclaim: false, ..PoolConfig::default() };
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
    let (s1, s2) = (StreamId(1), StreamId(2));
    for size in [4096, 8 * MIB, 100 * MIB] {
        let a = pool.allocate(size, s1).unwrap();
        pool.free(a, None, None).unwrap();
        let other = pool.allocate(size, s2).unwrap();
        assert_ne!(a, other, "{size}: a block freed on s1 is not handed to s2");
        assert_eq!(pool.allocate(size, s1).unwrap(), a, "{size}: but s1 reuses it at once");
    }
    assert_eq!(dev.live_events(), 0, "same-stream frees need no event");
}

#[test]
fn cross_stream_use_defers_reuse_until_the_other_stream_passes_the_free() {
    let (pool, dev) = pool_on(GIB, StrategyKind::Hybrid);
    dev.set_auto_complete(false);
    let (s1, s2) = (StreamId(1), StreamId(2));
    for size in [4096, 8 * MIB] {
        let a = pool.allocate(size, s1).unwrap();
        pool.record_stream(a, s2).unwrap();
        pool.free(a, None, None).unwrap();
        let stats = pool.stats();
        assert_eq!(stats.allocated_bytes.current, 0);
        assert!(stats.active_bytes.current >= size, "{size}: a free waiting for s2 stays active");
        let b = pool.allocate(size, s1).unwrap();
        assert_ne!(a, b, "{size}: s2 may still use the block: not reusable yet");
        dev.complete_stream(s2);
        let c = pool.allocate(size, s1).unwrap();
        assert_eq!(a, c, "{size}: once s2 passed the free the block is reused");
        pool.free(b, None, None).unwrap();
        pool.free(c, None, None).unwrap();
        assert_eq!(pool.stats().active_bytes.current, 0, "{size}: the pending free is done");
    }
    // A free that names another stream is the same as a recorded use.
    let a = pool.allocate(4096, s1).unwrap();
    pool.free(a, None, Some(s2)).unwrap();
    assert_ne!(pool.allocate(4096, s1).unwrap(), a);
    assert!(pool.snapshot().iter().flat_map(|s| &s.blocks).any(|b| b.0 == a && b.2 == BlockState::PendingFree));
    assert_eq!(pool.stats().deferred_frees, 3);
    assert!(matches!(pool.record_stream(0x1234, s2), Err(PoolError::InvalidFree { .. })));
}

#[test]
fn alignment_and_padding_are_kept() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    for strategy in ALL {
        let config = PoolConfig { strategy, alignment: 4096, round_up_divisions: 4, ..PoolConfig::default() };
        let pool = Pool::new(dev.clone() as Arc<dyn Device>, config).unwrap();
        for size in [1, 5000, 70_000, 3 * MIB + 1, 90 * MIB] {
            let a = pool.allocate(size, S0).unwrap();
            assert_eq!(a % 4096, 0, "{strategy:?} {size}");
        }
        // 5000 B with 4 divisions per power of two rounds to 6 KiB (or more, by class).
        let sizes: Vec<u64> = pool
            .snapshot()
            .iter()
            .flat_map(|s| s.blocks.iter().filter(|b| matches!(b.2, BlockState::Active { requested: 5000 })).map(|b| b.1))
            .collect();
        assert_eq!(sizes.len(), 1);
        assert!(sizes[0] >= 6 * KIB && sizes[0] % 4096 == 0, "{strategy:?}: {sizes:?}");
    }
}

#[test]
fn the_event_log_records_the_trace() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    let pool = Pool::new(dev as Arc<dyn Device>, PoolConfig { record_events: true, ..PoolConfig::default() }).unwrap();
    let a = pool.allocate(1000, StreamId(7)).unwrap();
    pool.free(a, None, None).unwrap();
    let kinds: Vec<EventKind> = pool.take_events().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![EventKind::SegmentAlloc, EventKind::Alloc, EventKind::Free]);
    assert!(pool.take_events().is_empty());
}

#[test]
fn close_reports_leaks_and_drop_returns_everything() {
    let (pool, dev) = pool_on(GIB, StrategyKind::Hybrid);
    let kept = pool.allocate(123, S0).unwrap();
    let freed = pool.allocate(10 * MIB, S0).unwrap();
    pool.free(freed, None, None).unwrap();
    let leaks = pool.close();
    assert_eq!(leaks.len(), 1);
    assert_eq!((leaks[0].addr, leaks[0].requested), (kept, 123));
    assert!(pool.close().is_empty(), "closing twice is harmless");
    drop(pool);
    assert_eq!(dev.counters().used, 0);
}

#[test]
fn peaks_reset_to_current() {
    let (pool, _) = pool_on(GIB, StrategyKind::Hybrid);
    let a = pool.allocate(10 * MIB, S0).unwrap();
    let b = pool.allocate(10 * MIB, S0).unwrap();
    pool.free(b, None, None).unwrap();
    assert_eq!(pool.stats().allocated_bytes.peak, 20 * MIB);
    pool.reset_peak_stats();
    assert_eq!(pool.stats().allocated_bytes.peak, 10 * MIB);
    pool.free(a, None, None).unwrap();
    let pairs = pool.stats().to_pairs();
    for key in ["allocated_bytes.all.current", "reserved_bytes.all.peak", "num_alloc_retries", "num_device_alloc", "fragmentation"] {
        assert!(pairs.iter().any(|(k, _)| k == key), "missing {key}");
    }
}

#[test]
fn carved_blocks_count_as_reserved_never_as_allocated() {
    let (pool, _) = pool_on(GIB, StrategyKind::Hybrid);
    let a = pool.allocate(3 * MIB, S0).unwrap();
    let region = pool.allocate_carved(20 * MIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.allocated_bytes.current, stats.allocated_bytes.peak), (3 * MIB, 3 * MIB), "the carved block is not allocated");
    assert_eq!((stats.requested_bytes.peak, stats.allocation.current, stats.allocation.peak), (3 * MIB, 1, 1));
    assert!(stats.reserved_bytes.current >= 23 * MIB, "but it is reserved");
    assert_eq!(stats.cached_bytes, 0, "nor cached");
    assert_eq!(pool.live_blocks().len(), 2, "and still a live block of the pool");
    pool.free_carved(region, 20 * MIB, &[]).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.allocated_bytes.current, stats.allocated_bytes.peak, stats.allocation.current), (3 * MIB, 3 * MIB, 1));
    assert!(pool.free_carved(region, 20 * MIB, &[]).is_err(), "freed once");
    pool.free(a, None, None).unwrap();
    assert_eq!(pool.stats().allocated_bytes.current, 0);
}

#[test]
fn more_live_blocks_than_table_slots_spill_to_the_overflow_map() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = Pool::new(dev as Arc<dyn Device>, PoolConfig::default()).unwrap();
    // 100,000 live blocks: more than the live table's 65,536 slots.
    let blocks: Vec<u64> = (0..100_000).map(|_| pool.allocate(512, S0).unwrap()).collect();
    assert_eq!(pool.live_blocks().len(), 100_000);
    for &b in blocks.iter().step_by(2) {
        pool.record_stream(b, StreamId(0)).unwrap();
        pool.free(b, Some(512), None).unwrap();
        assert!(pool.free(b, Some(512), None).is_err(), "double free found in either place");
    }
    for &b in blocks.iter().skip(1).step_by(2) {
        assert!(matches!(pool.free(b, Some(4), None), Err(PoolError::InvalidFree { reason: InvalidFreeReason::WrongSize { .. }, .. })));
        pool.free(b, None, None).unwrap();
    }
    assert_eq!(pool.stats().allocation.current, 0);
    assert!(pool.live_blocks().is_empty());
}

#[test]
fn blocks_cached_by_a_thread_come_back_when_it_exits_or_after_a_trim() {
    let dev = Arc::new(SimDevice::new(GIB, SimMode::AddressOnly));
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
    // A thread frees small blocks into its own cache and exits: they go back to the pool.
    {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let blocks: Vec<u64> = (0..50).map(|_| pool.allocate(2048, S0).unwrap()).collect();
            blocks.into_iter().for_each(|b| pool.free(b, None, None).unwrap());
        })
        .join()
        .unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 0, "the exited thread's cache was given back");

    // A live thread's cache is emptied by a trim at once, while the thread waits.
    let (to_worker, from_main) = std::sync::mpsc::channel::<()>();
    let (to_main, from_worker) = std::sync::mpsc::channel::<()>();
    let worker = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let b = pool.allocate(4096, S0).unwrap();
            pool.free(b, None, None).unwrap(); // cached by this thread
            to_main.send(()).unwrap();
            from_main.recv().unwrap(); // main trims meanwhile
            let again = pool.allocate(4096, S0).unwrap(); // the cache is empty: from a new slab
            pool.free(again, None, None).unwrap();
        })
    };
    from_worker.recv().unwrap();
    pool.trim().unwrap();
    let small_segments = pool.snapshot().iter().filter(|s| s.strategy == "slab").count();
    assert_eq!(small_segments, 0, "the waiting worker's cached block went back, and its slab with it");
    to_worker.send(()).unwrap();
    worker.join().unwrap();
    let stats = pool.stats();
    assert_eq!(stats.allocation.current, 0);
    assert_eq!(stats.allocation.allocated, 52);
}

#[test]
fn counters_from_many_threads_add_up_and_peaks_stay_within_the_slack() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = Arc::new(Pool::new(dev as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let blocks: Vec<u64> = (0..1000).map(|_| pool.allocate(1024, S0).unwrap()).collect();
                blocks.into_iter().for_each(|b| pool.free(b, None, None).unwrap());
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let stats = pool.stats();
    assert_eq!(stats.allocation.allocated, 4000);
    assert_eq!(stats.allocation.freed, 4000);
    assert_eq!(stats.allocated_bytes.current, 0);
    // Each thread held 1,000 KiB at its top; the peak is at least one thread's top, less the
    // slack of updating peaks every 64 KiB, and at most all four together.
    let peak = stats.allocated_bytes.peak;
    assert!(peak + 64 * KIB >= 1000 * KIB && peak <= 4000 * KIB, "peak {peak}");
}

/// The peak reserved while one step's freed sizes sit cached and the next step asks for others.
fn peak_reserved_over_steps(reclaim: bool, steps: &[u64]) -> u64 {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let config = PoolConfig { reclaim, expandable: false, ..PoolConfig::default() };
    let pool = Pool::new(dev as Arc<dyn Device>, config).unwrap();
    for &size in steps {
        let a = pool.allocate(size, S0).unwrap();
        pool.free(a, None, None).unwrap();
    }
    pool.stats().reserved_bytes.peak
}

#[test]
fn growth_first_gives_back_segments_no_block_uses() {
    // A 30 MiB and then a 40 MiB block (best-fit, a segment each), then a 100 MiB one (the large
    // tier's buddy, a segment cut to it), then 50 MiB: with `reclaim`, each growth first returns
    // the idle segments, in its own tier and the others.
    let steps = [30 * MIB, 40 * MIB, 100 * MIB, 50 * MIB];
    assert_eq!(peak_reserved_over_steps(true, &steps), 100 * MIB);
    assert_eq!(peak_reserved_over_steps(false, &steps), 30 * MIB + 40 * MIB + 100 * MIB + 50 * MIB);
    assert!(PoolConfig::default().reclaim, "on by default");
}

#[test]
fn growth_gives_back_only_what_it_needs_until_the_pool_drifts() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig { expandable: false, ..PoolConfig::default() }).unwrap();
    // Three idle segments of the large tier, 300 MiB: the high-water mark.
    let large: Vec<u64> = [100 * MIB, 120 * MIB, 80 * MIB].iter().map(|&n| pool.allocate(n, S0).unwrap()).collect();
    for &b in &large {
        pool.free(b, None, None).unwrap();
    }
    assert_eq!(pool.stats().reserved_bytes.peak, 300 * MIB);
    // A 10 MiB segment of the middle tier would pass the mark by 10 MiB (within a sixteenth of
    // it): the smallest idle segment that covers that goes back, and the two others stay cached.
    let mid = pool.allocate(10 * MIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.reserved_bytes.current, stats.num_device_free, stats.reserved_bytes.peak), (230 * MIB, 1, 300 * MIB));
    // They serve their sizes again without a device call.
    let allocs = dev.counters().alloc_calls;
    let again: Vec<u64> = [100 * MIB, 120 * MIB].iter().map(|&n| pool.allocate(n, S0).unwrap()).collect();
    assert_eq!(dev.counters().alloc_calls, allocs);
    // 280 MiB more would take the pool to 510 MiB, more than a sixteenth above the 300 MiB it
    // held when live memory peaked: every idle segment goes back, the middle tier's too.
    for b in again.into_iter().chain([mid]) {
        pool.free(b, None, None).unwrap();
    }
    let big = pool.allocate(280 * MIB, S0).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 280 * MIB);
    pool.free(big, None, None).unwrap();
}

#[test]
fn after_a_trim_growths_give_back_against_what_the_pool_holds() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::AddressOnly));
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig { expandable: false, ..PoolConfig::default() }).unwrap();
    let first = pool.allocate(200 * MIB, S0).unwrap();
    pool.free(first, None, None).unwrap();
    assert_eq!(pool.trim().unwrap(), 200 * MIB);
    // 100 MiB of the large tier, cached; then 30 MiB of the middle tier passes the 100 MiB the
    // pool holds since the trim: the idle segment goes back. Measured against the 200 MiB mark
    // of before the trim, nothing would, and 130 MiB would stay reserved.
    let large = pool.allocate(100 * MIB, S0).unwrap();
    pool.free(large, None, None).unwrap();
    let mid = pool.allocate(30 * MIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.reserved_bytes.current, stats.reserved_bytes.peak), (30 * MIB, 200 * MIB));
    assert_eq!(dev.counters().free_calls, 2);
    pool.free(mid, None, None).unwrap();
}

#[test]
fn growth_keeps_segments_that_hold_live_blocks() {
    let dev = Arc::new(SimDevice::new(4 * GIB, SimMode::HostBacked));
    let pool = Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig { expandable: false, ..PoolConfig::default() }).unwrap();
    let kept = pool.allocate(30 * MIB, S0).unwrap();
    dev.write(kept, b"kept").unwrap();
    let idle = pool.allocate(40 * MIB, S0).unwrap();
    pool.free(idle, None, None).unwrap();
    let grown = pool.allocate(50 * MIB, S0).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 80 * MIB, "the idle 40 MiB segment went back, the live one stayed");
    assert_eq!(dev.read(kept, 4).unwrap(), b"kept");
    for b in [kept, grown] {
        pool.free(b, None, None).unwrap();
    }
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Arc<Pool>>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn a_pool_dropped_by_a_thread_local_destructor_at_thread_exit_does_not_abort() {
    // HELD is set first, so it is destroyed last at the thread's exit: after the thread's block
    // cache (given back to the pool) and the other thread-local state. Its drop is then the
    // pool's last owner going: nothing the pool's drop does may need that state.
    let dev = Arc::new(SimDevice::new(GIB, SimMode::HostBacked));
    let pool = Arc::new(Pool::new(dev.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let worker = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            HELD.with(|h| *h.borrow_mut() = Some(Arc::clone(&pool)));
            for stream in [S0, StreamId(1)] {
                let a = pool.allocate(4096, stream).unwrap();
                pool.free(a, None, None).unwrap(); // kept in this thread's cache
            }
            drop(pool);
            wait.recv().unwrap();
        })
    };
    drop(pool);
    go.send(()).unwrap();
    worker.join().unwrap();
    assert_eq!(dev.counters().live_segments, 0, "the pool was dropped, by the worker's exit");
}

/// Issue 48: a plain buddy asked for 44 MiB on a 48 MiB device needs a 64 MiB block, and its
/// out-of-memory says so rather than leaving "44 MiB of 48 MiB" unexplained.
#[test]
fn a_buddy_out_of_memory_names_the_power_of_two_it_needed() {
    for expandable in [false, true] {
        let dev = Arc::new(SimDevice::new(48 * MIB, SimMode::AddressOnly));
        let config = PoolConfig { strategy: StrategyKind::Buddy, expandable, ..PoolConfig::default() };
        let pool = Pool::new(dev as Arc<dyn Device>, config).unwrap();
        let err = pool.allocate(44 * MIB, S0).unwrap_err();
        let PoolError::OutOfMemory(report) = &err else { panic!("expandable={expandable}: {err}") };
        assert_eq!((report.requested, report.block, report.reserved), (44 * MIB, 64 * MIB, 0), "expandable={expandable}");
        assert!(err.to_string().contains("tried to allocate 44.00 MiB (which the strategy rounds to 64.00 MiB); pool has"), "{err}");
        assert!(pool.allocate(32 * MIB, S0).is_ok(), "expandable={expandable}: a power of two that fits is served");
    }
    // A strategy that does not round past the alignment says nothing of it.
    let (pool, _) = pool_on(48 * MIB, StrategyKind::BestFit);
    let PoolError::OutOfMemory(report) = pool.allocate(50 * MIB, S0).unwrap_err() else { panic!() };
    assert_eq!(report.block, 0);
}
