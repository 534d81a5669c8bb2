//! Every figure the pool reports, against values worked out by hand on a state built block by
//! block: fragmentation, the largest free block, each counter's current / peak / totals after a
//! rise and a fall, and the out-of-memory report and its message.
//!
//! The sizes are chosen to be no size class (a freed block of a class size stays cached, out of
//! its strategy), so that each free goes straight back to best fit and the layout is known.

use std::sync::Arc;

use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::stats::{CounterValues, StatValue};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{ArenaHeld, Device, OomReport, Pool, PoolConfig, PoolError, SimDevice, SimMode, StreamId};

const S0: StreamId = StreamId(0);

fn best_fit_pool(capacity: u64) -> Pool {
    let device = Arc::new(SimDevice::new(capacity, SimMode::AddressOnly));
    let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: false, ..PoolConfig::default() };
    Pool::new(device as Arc<dyn Device>, config).unwrap()
}

/// One 2 MiB segment holding, in address order: a free 300 KiB range (a, freed), b (200 KiB,
/// live), a free 300 KiB range (c, freed), d (100 KiB, live) and the free tail of 1,148 KiB.
/// Returns the live blocks b and d.
fn two_holes_and_a_tail(pool: &Pool) -> (u64, u64) {
    let [a, b, c, d] = [300 * KIB, 200 * KIB, 300 * KIB, 100 * KIB].map(|n| pool.allocate(n, S0).unwrap());
    assert_eq!([b - a, c - a, d - a], [300 * KIB, 500 * KIB, 800 * KIB], "blocks are cut in address order");
    pool.free(a, None, None).unwrap();
    pool.free(c, None, None).unwrap();
    (b, d)
}

#[test]
fn fragmentation_and_largest_free_of_a_known_layout() {
    let pool = best_fit_pool(MIB << 10);
    two_holes_and_a_tail(&pool);
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes.current, 2 * MIB);
    assert_eq!(stats.allocated_bytes.current, 300 * KIB);
    assert_eq!(stats.free_bytes(), 1748 * KIB);
    assert_eq!(stats.largest_free_bytes, 1148 * KIB, "the tail, not a 300 KiB hole");
    // 1 - 1148 / 1748: the two holes are the scattered part of the free memory.
    assert!((stats.fragmentation() - 600.0 / 1748.0).abs() < 1e-12, "{}", stats.fragmentation());
    assert!((stats.reserved_per_allocated() - 2048.0 / 300.0).abs() < 1e-12);
    let pairs = stats.to_pairs();
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}")).1;
    assert_eq!(get("largest_free_bytes"), StatValue::Count(1148 * KIB));
    assert_eq!(get("free_bytes"), StatValue::Count(1748 * KIB));
    assert_eq!(get("fragmentation"), StatValue::Ratio(stats.fragmentation()));
}

#[test]
fn fragmentation_is_zero_for_one_free_range_and_when_nothing_is_free() {
    let pool = best_fit_pool(MIB << 10);
    assert_eq!((pool.stats().fragmentation(), pool.stats().largest_free_bytes), (0.0, 0));
    let a = pool.allocate(300 * KIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!((stats.largest_free_bytes, stats.free_bytes()), (1748 * KIB, 1748 * KIB));
    assert_eq!(stats.fragmentation(), 0.0);
    // The whole segment taken: nothing free, nothing scattered.
    let rest = pool.allocate(1748 * KIB, S0).unwrap();
    assert_eq!(rest, a + 300 * KIB);
    assert_eq!((pool.stats().largest_free_bytes, pool.stats().free_bytes(), pool.stats().fragmentation()), (0, 0, 0.0));
}

#[test]
fn largest_free_is_the_largest_over_tiers_and_streams() {
    // Hybrid: a slab segment (2 MiB) on stream 0 and a best-fit segment on stream 1, whose free
    // tail is the largest range of the pool.
    let device = Arc::new(SimDevice::new(MIB << 10, SimMode::AddressOnly));
    let pool = Pool::new(device as Arc<dyn Device>, PoolConfig { expandable: false, ..PoolConfig::default() }).unwrap();
    pool.allocate(1000, S0).unwrap();
    let medium = 3 * MIB + 100 * KIB;
    pool.allocate(medium, StreamId(1)).unwrap();
    let stats = pool.stats();
    // The best-fit segment is 8 MiB (room for two, in 2 MiB units).
    assert_eq!(stats.reserved_bytes.current, 2 * MIB + 8 * MIB);
    assert_eq!(stats.largest_free_bytes, 8 * MIB - medium);
}

fn counter(current: u64, peak: u64, allocated: u64, freed: u64) -> CounterValues {
    CounterValues { current, peak, allocated, freed }
}

#[test]
fn every_counter_after_a_rise_and_a_fall() {
    let pool = best_fit_pool(MIB << 10);
    let (b, d) = two_holes_and_a_tail(&pool);
    // Rise: a block that needs a segment of its own (8 MiB: room for two, in 2 MiB units).
    let big = 3 * MIB + 100 * KIB;
    let e = pool.allocate(big, S0).unwrap();
    // Fall: e and d go, and trim gives e's segment back.
    pool.free(e, None, None).unwrap();
    pool.free(d, None, None).unwrap();
    assert_eq!(pool.trim().unwrap(), 8 * MIB);
    let s = pool.stats();
    let peak_allocated = 300 * KIB + big; // b and d live beside e
    let total_allocated = 900 * KIB + big;
    assert_eq!(s.allocated_bytes, counter(200 * KIB, peak_allocated, total_allocated, total_allocated - 200 * KIB));
    assert_eq!(s.requested_bytes, counter(200 * KIB, peak_allocated, total_allocated, total_allocated - 200 * KIB));
    assert_eq!(s.active_bytes, counter(200 * KIB, peak_allocated, total_allocated, total_allocated - 200 * KIB));
    assert_eq!(s.allocation, counter(1, 4, 5, 4), "a, b, c, d live at once; five in all");
    assert_eq!(s.reserved_bytes, counter(2 * MIB, 10 * MIB, 10 * MIB, 8 * MIB));
    assert_eq!(s.segment, counter(1, 2, 2, 1));
    assert_eq!((s.num_device_alloc, s.num_device_free, s.num_ooms, s.num_alloc_retries), (2, 1, 0, 0));
    let pairs = s.to_pairs();
    let get = |key: &str| pairs.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}")).1;
    assert_eq!(get("reserved_bytes.all.peak"), StatValue::Count(10 * MIB));
    assert_eq!(get("reserved_bytes.all.current"), StatValue::Count(2 * MIB));
    assert_eq!(get("allocated_bytes.all.peak"), StatValue::Count(peak_allocated));
    assert_eq!(get("allocation.all.peak"), StatValue::Count(4));
    assert_eq!(get("segment.all.peak"), StatValue::Count(2));
    // A reset brings every peak down to its current value, and a new rise counts from there.
    pool.reset_peak_stats();
    let s = pool.stats();
    assert_eq!((s.allocated_bytes.peak, s.reserved_bytes.peak, s.allocation.peak, s.segment.peak), (200 * KIB, 2 * MIB, 1, 1));
    let f = pool.allocate(100 * KIB, S0).unwrap();
    pool.free(f, None, None).unwrap();
    pool.free(b, None, None).unwrap();
    let s = pool.stats();
    assert_eq!((s.allocated_bytes.peak, s.allocated_bytes.current, s.allocation.peak), (300 * KIB, 0, 2));
}

#[test]
fn requested_and_allocated_differ_by_the_rounding() {
    let pool = best_fit_pool(MIB << 10);
    let a = pool.allocate(1000, S0).unwrap();
    let b = pool.allocate(100 * KIB + 1, S0).unwrap();
    let s = pool.stats();
    assert_eq!((s.requested_bytes.current, s.allocated_bytes.current), (1000 + 100 * KIB + 1, 1024 + 100 * KIB + 512));
    pool.free(a, None, None).unwrap();
    pool.free(b, None, None).unwrap();
    let s = pool.stats();
    assert_eq!(s.requested_bytes, counter(0, 1000 + 100 * KIB + 1, 1000 + 100 * KIB + 1, 1000 + 100 * KIB + 1));
    assert_eq!(s.allocated_bytes, counter(0, 1024 + 100 * KIB + 512, 1024 + 100 * KIB + 512, 1024 + 100 * KIB + 512));
}

#[test]
fn out_of_memory_report_and_message_of_a_known_layout() {
    // 16 MiB of device: the 2 MiB segment leaves 14 MiB, and a 15 MiB request needs a 16 MiB one.
    let pool = best_fit_pool(16 * MIB);
    two_holes_and_a_tail(&pool);
    let err = pool.allocate(15 * MIB, S0).unwrap_err();
    let PoolError::OutOfMemory(report) = err.clone() else { panic!("{err}") };
    let expected = OomReport {
        requested: 15 * MIB,
        block: 0,
        allocated: 300 * KIB,
        reserved: 2 * MIB,
        largest_free: 1148 * KIB,
        device_free: 14 * MIB,
        limit: None,
        arena: ArenaHeld::default(),
    };
    assert_eq!(report, expected);
    assert_eq!(
        err.to_string(),
        "out of memory: tried to allocate 15.00 MiB; pool has 300.00 KiB allocated, 2.00 MiB reserved \
         (1.71 MiB reserved but unallocated, largest free block 1.12 MiB); device reports 14.00 MiB free"
    );
    let s = pool.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
}

#[test]
fn out_of_memory_under_a_limit_names_it() {
    let device = Arc::new(SimDevice::new(MIB << 10, SimMode::AddressOnly));
    let config = PoolConfig {
        strategy: StrategyKind::BestFit,
        expandable: false,
        limit: Some(vrampool_core::Limit::Bytes(6 * MIB)),
        ..PoolConfig::default()
    };
    let pool = Pool::new(device as Arc<dyn Device>, config).unwrap();
    two_holes_and_a_tail(&pool);
    let Err(PoolError::OutOfMemory(report)) = pool.allocate(4 * MIB + 512, S0) else { panic!("a 4 MiB segment does not fit") };
    assert_eq!((report.allocated, report.reserved, report.largest_free, report.limit), (300 * KIB, 2 * MIB, 1148 * KIB, Some(6 * MIB)));
    assert!(report.to_string().contains("; limit 6.00 MiB"), "{report}");
}

#[test]
fn cached_blocks_are_no_scattered_free_memory() {
    // 2 MiB is a size class: its block stays cached when freed, and the strategy still counts it
    // taken. Its 4 MiB segment then holds a cached 2 MiB block and a free 2 MiB range.
    let pool = best_fit_pool(MIB << 10);
    let a = pool.allocate(2 * MIB, S0).unwrap();
    pool.free(a, None, None).unwrap();
    let s = pool.stats();
    assert_eq!((s.reserved_bytes.current, s.free_bytes(), s.cached_bytes), (4 * MIB, 4 * MIB, 2 * MIB));
    assert_eq!(s.largest_free_bytes, 2 * MIB);
    assert_eq!(s.fragmentation(), 0.0, "one free range beside a cached block");
    // The cached block merges back before a placement that is not of its class.
    let whole = pool.allocate(4 * MIB, S0).unwrap();
    assert_eq!((whole, pool.stats().num_device_alloc), (a, 1));
    pool.free(whole, None, None).unwrap();
    let s = pool.stats();
    assert_eq!((s.cached_bytes, s.largest_free_bytes, s.fragmentation()), (4 * MIB, 0, 0.0));
}
