//! Replay's figures against values worked out by hand on a known trace: the lower bound, the peaks,
//! the device allocations, the timeline and the fragmentation at the most allocated moment.
//!
//! The sizes are chosen to be no size class (a freed block of a class size stays cached, out of
//! its strategy), so that each free goes straight back to best fit and the layout is known.

use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::PoolConfig;
use vrampool_whatif::replay::{events_from_buffers, replay, replay_prepared, PreparedTrace, ReplayOptions, ReplayTarget, TraceBuffer};

#[test]
fn replay_figures_of_a_known_trace() {
    // 3 MiB + 100 KiB blocks (no size class): 0 and 1 overlap, 2 reuses 0's place.
    let big = 3 * MIB + 100 * KIB;
    let buffers = [TraceBuffer::new(0, 0, 2, big), TraceBuffer::new(1, 1, 3, big), TraceBuffer::new(2, 2, 4, big)];
    let events = events_from_buffers(&buffers).unwrap();
    let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: false, ..PoolConfig::default() };
    let report = replay(&events, config.clone()).unwrap();
    assert_eq!(report.events, 6);
    assert_eq!(report.lower_bound_bytes, 2 * big);
    assert_eq!(report.peak_allocated_bytes, 2 * big);
    // The first block's segment (8 MiB) holds the second too: one device allocation.
    assert_eq!((report.peak_reserved_bytes, report.device_allocs), (8 * MIB, 1));
    // The timeline: alloc 0, alloc 1, free 0, alloc 2, free 1, free 2.
    let allocated: Vec<u64> = report.timeline.iter().map(|p| p.allocated_bytes).collect();
    assert_eq!(allocated, [big, 2 * big, big, 2 * big, big, 0]);
    assert!(report.timeline.iter().all(|p| p.reserved_bytes == 8 * MIB));
    // At the most allocated sample (the last of the two), 0's old place is taken again by 2:
    // the free memory is the one tail range, so nothing is scattered.
    assert_eq!(report.fragmentation, 0.0);
    // Events per second are the events over the loop's time.
    assert!(report.seconds > 0.0 && (report.events_per_s * report.seconds - 6.0).abs() < 1e-6, "{report:?}");
    let bare = replay_prepared(
        &PreparedTrace::new(&events).unwrap(),
        &ReplayTarget::Pool(config),
        ReplayOptions { samples: 0, capacity: None, repeat: 1, trim_each_pass: false },
    )
    .unwrap();
    assert!(bare.timeline.is_empty() && bare.fragmentation == 0.0 && bare.peak_reserved_bytes == 8 * MIB);
}

#[test]
fn replay_fragmentation_is_read_where_the_most_is_allocated() {
    // 0, 1, 2 side by side; 0 and 2 are freed and 3 (smaller) is allocated: at that moment, the
    // most bytes are allocated (1 and 3) and the free memory is scattered over two ranges.
    let kib = |n: u64| n * KIB;
    let buffers = [
        TraceBuffer::new(0, 0, 3, kib(300)),
        TraceBuffer::new(1, 1, 9, kib(200)),
        TraceBuffer::new(2, 2, 3, kib(300)),
        TraceBuffer::new(3, 3, 9, kib(700)),
    ];
    let events = events_from_buffers(&buffers).unwrap();
    let config = PoolConfig { strategy: StrategyKind::BestFit, expandable: false, ..PoolConfig::default() };
    let report = replay(&events, config).unwrap();
    assert_eq!(report.peak_allocated_bytes, kib(900));
    // At the peak (200 + 700 allocated): 2's range merged with the tail into [500, 2048) KiB,
    // where 3 went, leaving [0, 300) and [1200, 2048): 1148 KiB free, the largest 848.
    assert!((report.fragmentation - 300.0 / 1148.0).abs() < 1e-12, "{}", report.fragmentation);
}
