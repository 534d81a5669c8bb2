use super::*;
use crate::peers::{PeerConfig, PEER_NAMES};
use vrampool_core::sizes::MIB;
use vrampool_steady::AheadBuffer;

fn config(strategy: StrategyKind) -> PoolConfig {
    PoolConfig { strategy, ..PoolConfig::default() }
}

#[test]
fn replay_frees_before_allocs_at_the_same_time() {
    // 0 and 1 overlap on [1, 2); 2 starts when 0 ends, so at most two are live at once.
    let buffers = [TraceBuffer::new(0, 0, 2, 4 * MIB), TraceBuffer::new(1, 1, 3, 2 * MIB), TraceBuffer::new(2, 2, 4, 4 * MIB)];
    let events = events_from_buffers(&buffers).unwrap();
    assert_eq!(
        events,
        vec![
            TraceEvent::Alloc { id: 0, size: 4 * MIB, stream: 0 },
            TraceEvent::Alloc { id: 1, size: 2 * MIB, stream: 0 },
            TraceEvent::Free { id: 0 },
            TraceEvent::Alloc { id: 2, size: 4 * MIB, stream: 0 },
            TraceEvent::Free { id: 1 },
            TraceEvent::Free { id: 2 },
        ]
    );
}

#[test]
fn replay_hand_made_trace_has_known_peaks() {
    // Peak live: 4 + 2 MiB at time 1 and 2 + 4 MiB at time 2: 6 MiB.
    let buffers = [TraceBuffer::new(0, 0, 2, 4 * MIB), TraceBuffer::new(1, 1, 3, 2 * MIB), TraceBuffer::new(2, 2, 4, 4 * MIB)];
    let events = events_from_buffers(&buffers).unwrap();
    for strategy in ALL_STRATEGIES {
        let started = Instant::now();
        let report = replay(&events, config(strategy)).unwrap();
        let wall = started.elapsed().as_secs_f64();
        assert_eq!(report.strategy, strategy.name());
        assert_eq!(report.events, 6);
        assert_eq!(report.lower_bound_bytes, 6 * MIB, "{strategy:?}");
        // Sizes are multiples of every alignment, so no strategy pads them... except the
        // buddy, which rounds to powers of two: 4 + 2 and 2 + 4 MiB stay exact there too.
        assert_eq!(report.peak_allocated_bytes, 6 * MIB, "{strategy:?}");
        assert!(report.peak_reserved_bytes >= report.lower_bound_bytes, "{report:?}");
        assert!(report.device_allocs >= 1);
        // The loop's time lies within the call's; events per second are events over it.
        assert!(report.seconds > 0.0 && report.seconds <= wall, "{} s of {wall} s", report.seconds);
        assert!((report.events_per_s * report.seconds - 6.0).abs() < 1e-6, "{report:?}");
        assert!(report.events_per_s >= 6.0 / wall);
    }
}

#[test]
fn replay_csv_reads_streams_and_names_bad_lines() {
    let text = "id,lower,upper,size,stream\n0,0,2,4096,0\n\n1,1,3,8192,1\n";
    let buffers = read_trace_csv(text).unwrap();
    assert_eq!(buffers, vec![TraceBuffer::new(0, 0, 2, 4096), TraceBuffer { stream: 1, ..TraceBuffer::new(1, 1, 3, 8192) }]);
    let report = replay(&events_from_buffers(&buffers).unwrap(), PoolConfig::default()).unwrap();
    assert_eq!(report.lower_bound_bytes, 4096 + 8192);

    // Reordered columns are fine; a solved plan's offset column is ignored.
    let reordered = read_trace_csv("size,id,upper,lower,offset\n100,7,5,1,0\n").unwrap();
    assert_eq!(reordered, vec![TraceBuffer::new(7, 1, 5, 100)]);

    for (text, line) in [
        ("", 1),
        ("id,lower,size\n", 1),
        ("id,lower,upper,size,colour\n", 1),
        ("id,lower,upper,size\n0,0,2,10\n1,0,x,10\n", 3),
        ("id,lower,upper,size\n0,0,2,-10\n", 2),
        ("id,lower,upper,size\n0,0,2,10\n0,1,3,10\n", 3),
        ("id,lower,upper,size\n0,2,2,10\n", 2),
        ("id,lower,upper,size\n0,0,2,0\n", 2),
        ("id,lower,upper,size\n0,0,2\n", 2),
    ] {
        match read_trace_csv(text) {
            Err(ReplayError::Parse { line: got, message }) => assert_eq!(got, line, "{text:?}: {message}"),
            other => panic!("{text:?}: {other:?}"),
        }
    }
}

#[test]
fn replay_bad_trace_is_an_error_not_a_panic() {
    let free_unknown = [TraceEvent::Alloc { id: 1, size: 512, stream: 0 }, TraceEvent::Free { id: 2 }];
    assert!(matches!(replay(&free_unknown, PoolConfig::default()), Err(ReplayError::UnknownId { index: 1, id: 2 })));
    let double_free = [TraceEvent::Alloc { id: 1, size: 512, stream: 0 }, TraceEvent::Free { id: 1 }, TraceEvent::Free { id: 1 }];
    assert!(matches!(replay(&double_free, PoolConfig::default()), Err(ReplayError::UnknownId { index: 2, id: 1 })));
    let twice = [TraceEvent::Alloc { id: 1, size: 512, stream: 0 }, TraceEvent::Alloc { id: 1, size: 512, stream: 0 }];
    assert!(matches!(replay(&twice, PoolConfig::default()), Err(ReplayError::DuplicateId { index: 1, id: 1 })));
    let zero = [TraceEvent::Alloc { id: 1, size: 0, stream: 0 }];
    assert!(matches!(replay(&zero, PoolConfig::default()), Err(ReplayError::ZeroSize { index: 0, id: 1 })));
    let err = events_from_buffers(&[TraceBuffer::new(3, 5, 5, 10)]).unwrap_err();
    assert!(matches!(err, ReplayError::BadBuffer { id: 3, .. }), "{err}");
    // An id may live again once freed (traces keyed by address do this).
    let reused = [
        TraceEvent::Alloc { id: 1, size: 512, stream: 0 },
        TraceEvent::Free { id: 1 },
        TraceEvent::Alloc { id: 1, size: 1024, stream: 0 },
        TraceEvent::Free { id: 1 },
    ];
    assert_eq!(replay(&reused, PoolConfig::default()).unwrap().lower_bound_bytes, 1024);
}

#[test]
fn replay_counts_the_segments_given_back() {
    // 100 MiB freed, then 200 MiB: the pool gives the idle segment back before it grows past
    // its peak; PyTorch's caching allocator keeps it.
    let events = [
        TraceEvent::Alloc { id: 1, size: 100 * MIB, stream: 0 },
        TraceEvent::Free { id: 1 },
        TraceEvent::Alloc { id: 2, size: 200 * MIB, stream: 0 },
        TraceEvent::Free { id: 2 },
    ];
    let prepared = PreparedTrace::new(&events).unwrap();
    let options = ReplayOptions { samples: 0, capacity: None, repeat: 1, trim_each_pass: false };
    let pool = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig { expandable: false, ..PoolConfig::default() }), options).unwrap();
    assert_eq!((pool.device_allocs, pool.device_frees, pool.peak_reserved_bytes), (2, 1, 200 * MIB));
    let torch = replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), options).unwrap();
    assert_eq!((torch.device_allocs, torch.device_frees, torch.peak_reserved_bytes), (2, 0, 300 * MIB));
}

#[test]
fn replay_timeline_is_evenly_spaced_and_ends_at_the_end() {
    // 1000 buffers of 1 MiB, at most two live: 2000 events.
    let buffers: Vec<_> = (0..1000).map(|i| TraceBuffer::new(i, i, i + 2, MIB)).collect();
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    assert_eq!((prepared.len(), prepared.lower_bound_bytes()), (2000, 2 * MIB));
    for (samples, expected) in [(0, 0), (1, 1), (7, 7), (1000, 1000), (3000, 2000)] {
        let report = replay_prepared(
            &prepared,
            &ReplayTarget::Pool(config(StrategyKind::BestFit)),
            ReplayOptions { samples, capacity: None, repeat: 1, trim_each_pass: false },
        )
        .unwrap();
        let points: Vec<usize> = report.timeline.iter().map(|p| p.event).collect();
        assert_eq!(points.len(), expected, "{samples} samples");
        if let (Some(&first), Some(&last)) = (points.first(), points.last()) {
            assert_eq!(last, 2000, "{samples} samples");
            let stride = 2000usize.div_ceil(samples);
            assert_eq!(first, stride.min(2000));
            assert!(points.windows(2).all(|w| w[1] - w[0] == stride || w[1] == 2000), "{points:?}");
        }
        for p in &report.timeline {
            assert!(p.allocated_bytes <= 2 * MIB && p.reserved_bytes >= p.allocated_bytes, "{p:?}");
        }
    }
    // Mid-trace one or two buffers are live; at the end none is.
    let report = replay_prepared(
        &prepared,
        &ReplayTarget::Pool(config(StrategyKind::BestFit)),
        ReplayOptions { samples: 10, capacity: None, repeat: 1, trim_each_pass: false },
    )
    .unwrap();
    assert!(report.timeline[..9].iter().all(|p| p.allocated_bytes >= MIB), "{:?}", report.timeline);
    assert_eq!(report.timeline[9].allocated_bytes, 0);
    assert!((0.0..=1.0).contains(&report.fragmentation));
}

#[test]
fn timeline_samples_on_thousands_of_streams_visit_a_bounded_number_of_arenas_an_event() {
    // Issue 57: each sample reads the pool's stats, which visit the arena of every stream holding
    // memory. 20,000 events on 10,000 streams, each buffer on its own and all live at once, took
    // 15 s with a thousand samples, 0.2 s without: the samples, not the events, were per stream.
    let streams = 1000u64;
    let buffers: Vec<_> = (0..streams).map(|i| TraceBuffer { stream: i + 1, ..TraceBuffer::new(i, i, 2 * streams - i, 4096) }).collect();
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    for target in [ReplayTarget::Pool(PoolConfig::default()), ReplayTarget::Peer(PeerConfig::named("torch").unwrap())] {
        let report = replay_prepared(&prepared, &target, ReplayOptions::default()).unwrap();
        let points = report.timeline.len();
        // A sample visits at most every stream's arena; the last point (the end) may come early.
        assert!(
            (points - 1) * streams as usize <= SAMPLE_STREAMS_PER_EVENT * report.events,
            "{}: {points} samples of {streams} streams over {} events",
            target.name(),
            report.events
        );
        assert_eq!(report.timeline.last().unwrap().event, report.events);
        // Every stream holds one 4 KiB block in a segment of its own, mostly free.
        assert!(report.fragmentation > 0.99, "{}: {report:?}", target.name());
    }
    // A trace on a few streams keeps every sample.
    assert_eq!(replay_stride(2000, DEFAULT_SAMPLES, 8), 2);
    assert_eq!(replay_stride(2000, DEFAULT_SAMPLES, 1000), 1000usize.div_ceil(SAMPLE_STREAMS_PER_EVENT));
    assert_eq!(replay_stride(2000, 0, 1000), usize::MAX, "no samples");
}

#[test]
fn replay_runs_the_allocator_models_beside_the_pool() {
    // A 1.5 MiB request: PyTorch reserves a 20 MiB segment, the pool a 2 MiB chunk.
    let events = events_from_buffers(&[TraceBuffer::new(0, 0, 1, 3 * MIB / 2)]).unwrap();
    let prepared = PreparedTrace::new(&events).unwrap();
    let torch = replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), ReplayOptions::default()).unwrap();
    assert_eq!((torch.strategy, torch.peak_reserved_bytes, torch.device_allocs, torch.approximate), ("torch", 20 * MIB, 1, false));
    let default = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), ReplayOptions::default()).unwrap();
    assert_eq!(default.peak_reserved_bytes, 2 * MIB);
    let driver = replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("async").unwrap()), ReplayOptions::default()).unwrap();
    assert!(driver.approximate);
}

#[test]
fn a_capacity_limited_replay_stops_at_the_first_out_of_memory() {
    // 30 MiB live, then 40 MiB: with 60 MiB of device memory the plain torch model fits both
    // (its cached 30 MiB segment goes back and it retries); 90 MiB live at once fits nobody.
    let buffers = [TraceBuffer::new(0, 0, 1, 30 * MIB), TraceBuffer::new(1, 1, 3, 40 * MIB), TraceBuffer::new(2, 2, 3, 50 * MIB)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let options = ReplayOptions { samples: 10, capacity: Some(60 * MIB), repeat: 1, trim_each_pass: false };
    for target in [ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), ReplayTarget::Pool(PoolConfig::default())] {
        let report = replay_prepared(&prepared, &target, options).unwrap();
        let oom = report.out_of_memory.unwrap_or_else(|| panic!("{}: {report:?}", target.name()));
        assert_eq!((oom.event, report.events), (3, 3), "{}: the third allocation fails", target.name());
        assert_eq!(oom.report.requested, 50 * MIB);
        assert!(report.peak_reserved_bytes <= 60 * MIB);
        assert_eq!(report.timeline.last().unwrap().event, 3);
    }
    let roomy = ReplayOptions { samples: 10, capacity: Some(100 * MIB), repeat: 1, trim_each_pass: false };
    assert!(replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), roomy).unwrap().out_of_memory.is_none());
}

#[test]
fn a_buffer_larger_than_the_device_is_an_out_of_memory_in_every_row() {
    // Issue 48: past the device, the pool said "invalid size" and the whole replay stopped.
    let buffers = [TraceBuffer::new(0, 0, 1, 4096)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let mut targets: Vec<ReplayTarget> = ALL_STRATEGIES.into_iter().map(|s| ReplayTarget::Pool(config(s))).collect();
    targets.extend(PEER_NAMES.iter().map(|name| ReplayTarget::Peer(PeerConfig::named(name).unwrap())));
    for capacity in [1, 512, 4095] {
        let options = ReplayOptions { samples: 10, capacity: Some(capacity), repeat: 1, trim_each_pass: false };
        for target in &targets {
            let report = replay_prepared(&prepared, target, options).unwrap_or_else(|e| panic!("{} on {capacity} B: {e}", target.name()));
            let oom = report.out_of_memory.unwrap_or_else(|| panic!("{} on {capacity} B: {report:?}", target.name()));
            assert_eq!((oom.event, oom.report.requested), (0, 4096), "{} on {capacity} B", target.name());
        }
    }
}

#[test]
fn large_tensors_cost_the_default_pool_at_most_a_page_each() {
    // Logits-like pairs (output and gradient) of a sequence length that changes every step.
    let mut buffers = Vec::new();
    for (step, mib) in [120u64, 80, 160, 100, 140, 90].into_iter().enumerate() {
        let (t, size, id) = (step as u64 * 10, mib * MIB + 4096 * step as u64 + 1, step as u64 * 2);
        buffers.push(TraceBuffer::new(id, t, t + 3, size));
        buffers.push(TraceBuffer::new(id + 1, t + 1, t + 4, size));
    }
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let bound = prepared.lower_bound_bytes();
    let default = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), ReplayOptions::default()).unwrap();
    assert!(default.peak_allocated_bytes <= bound + 2 * 2 * MIB, "{default:?}");
    assert!(default.peak_reserved_bytes <= bound + 2 * 2 * MIB, "{default:?}");
    // A plain buddy rounds each to a power of two: 160 MiB + a bit takes 256 MiB.
    let buddy = replay_prepared(&prepared, &ReplayTarget::Pool(config(StrategyKind::Buddy)), ReplayOptions::default()).unwrap();
    assert!(buddy.peak_allocated_bytes >= 2 * 256 * MIB, "{buddy:?}");
}

/// The instances in the repository (`tests/data/static`), and those in `../shared/traces/static` beside it
/// where it is there.
fn static_traces() -> Vec<(String, Vec<TraceEvent>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    vrampool_plan::csv_files(&[root.join("tests/data/static"), root.join("../shared/traces/static")])
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let buffers = read_trace_csv(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.file_name().unwrap().to_string_lossy().into_owned(), events_from_buffers(&buffers).unwrap())
        })
        .collect()
}

#[test]
fn replay_static_instances_with_every_strategy() {
    let traces = static_traces();
    assert!(traces.len() >= 6, "the six carried in tests/data/static");
    for (name, events) in traces {
        for report in replay_all(&events, &PoolConfig::default()).unwrap() {
            assert_eq!(report.events, events.len());
            assert!(report.lower_bound_bytes > 0);
            assert!(report.peak_reserved_bytes >= report.lower_bound_bytes, "{name}: {report:?}");
            assert!(report.peak_reserved_bytes >= report.peak_allocated_bytes, "{name}: {report:?}");
            eprintln!(
                "{name:<32} {:<8} reserved/bound {:.3}  {:>12.0} events/s",
                report.strategy,
                report.peak_reserved_bytes as f64 / report.lower_bound_bytes as f64,
                report.events_per_s
            );
        }
    }
}

/// `cargo test --release -p vrampool-whatif replay_throughput -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: run in release"]
fn replay_throughput() {
    let (_, events) = static_traces()
        .into_iter()
        .find(|(n, _)| n == "somas-resnet50.csv")
        .expect("somas-resnet50.csv in ../shared/traces/static (the repository does not carry it)");
    // Repeat the trace so the loop runs long enough to time.
    let mut long = Vec::new();
    for round in 0..500u64 {
        long.extend(events.iter().map(|e| match *e {
            TraceEvent::Alloc { id, size, stream } => TraceEvent::Alloc { id: id + round * 1_000_000, size, stream },
            TraceEvent::Free { id } => TraceEvent::Free { id: id + round * 1_000_000 },
        }));
    }
    let prepared = PreparedTrace::new(&long).unwrap();
    for strategy in ALL_STRATEGIES {
        // With the plots' timeline and without: the sampling's cost shows as the difference.
        let best = |samples| {
            (0..3)
                .map(|_| {
                    replay_prepared(
                        &prepared,
                        &ReplayTarget::Pool(config(strategy)),
                        ReplayOptions { samples, capacity: None, repeat: 1, trim_each_pass: false },
                    )
                    .unwrap()
                    .events_per_s
                })
                .fold(0.0, f64::max)
        };
        let (sampled, bare) = (best(DEFAULT_SAMPLES), best(0));
        eprintln!(
            "{:<8} {:>6.2} M events/s with {DEFAULT_SAMPLES} samples, {:>6.2} M without, over {} events",
            strategy.name(),
            sampled / 1e6,
            bare / 1e6,
            long.len()
        );
    }
}

#[test]
fn a_repeated_replay_counts_every_copy_in_the_memory_of_one() {
    let buffers = [TraceBuffer::new(1, 0, 2, MIB), TraceBuffer::new(2, 1, 3, 3 * MIB)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let target = ReplayTarget::Pool(config(StrategyKind::Hybrid));
    let times = |repeat| replay_prepared(&prepared, &target, ReplayOptions { samples: 10, capacity: None, repeat, trim_each_pass: false });
    let (once, thrice) = (times(1).unwrap(), times(3).unwrap());
    assert_eq!(thrice.events, 3 * once.events);
    assert_eq!((thrice.peak_reserved_bytes, thrice.lower_bound_bytes), (once.peak_reserved_bytes, once.lower_bound_bytes));
    assert_eq!(thrice.timeline.last().unwrap().allocated_bytes, 0, "every copy frees what it allocated");
    assert!(matches!(times(u64::MAX), Err(ReplayError::Repeat { .. })));
    assert!(matches!(times(0), Err(ReplayError::Repeat { .. })));
}

#[test]
fn a_trim_between_passes_gives_back_what_each_pass_left_cached() {
    // One after another: 200 MiB and 100 MiB (the large tier), 30 MiB (the middle tier) and
    // 1 MiB (the slab tier).
    let buffers = [
        TraceBuffer::new(0, 0, 1, 200 * MIB),
        TraceBuffer::new(1, 1, 2, 100 * MIB),
        TraceBuffer::new(2, 2, 3, 30 * MIB),
        TraceBuffer::new(3, 3, 4, MIB),
    ];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let run = |target: &ReplayTarget, repeat, trim_each_pass| {
        let r = replay_prepared(&prepared, target, ReplayOptions { samples: 0, capacity: None, repeat, trim_each_pass }).unwrap();
        (r.peak_reserved_bytes / MIB, r.device_allocs, r.device_frees)
    };
    // The pool: the 100 MiB growth gives the idle 200 MiB segment back; the 100, 30 and 2 MiB
    // segments stay cached at the end of a pass, and each trim gives them back.
    let pool = ReplayTarget::Pool(PoolConfig { expandable: false, ..PoolConfig::default() });
    assert_eq!(run(&pool, 1, false), (200, 4, 1));
    assert_eq!(run(&pool, 3, true), (200, 3 * 4, 3 + 2 * 3), "each pass grows as the first");
    // PyTorch's model serves the three large requests from one 200 MiB segment and the 1 MiB
    // one from a 2 MiB segment; it keeps both untrimmed and gives both back at each `empty_cache`.
    let torch = ReplayTarget::Peer(PeerConfig::named("torch").unwrap());
    assert_eq!(run(&torch, 3, false), (202, 2, 0));
    assert_eq!(run(&torch, 3, true), (202, 3 * 2, 2 * 2));
}

#[test]
fn a_csv_error_quotes_at_most_a_hundred_bytes_of_its_input() {
    let field = "9".repeat(1 << 20) + "x";
    for text in
        [format!("id,lower,upper,size\n1,0,1,{field}\n"), format!("id,lower,upper,{field}\n"), "id,lower,upper\u{e9},size\n".to_string()]
    {
        let message = read_trace_csv(&text).unwrap_err().to_string();
        assert!(message.len() < 250, "{} bytes: {}", message.len(), &message[..250.min(message.len())]);
    }
}

#[test]
fn a_huge_request_costs_every_model_its_events_not_its_bytes() {
    // One buffer of 2^50 B (the default device's whole memory) and one of 2^63 B: a model that
    // kept a record per page would need billions of them. Every model and pool answers at once:
    // out of memory, or (a pool whose blocks cannot be that large) an error at that event.
    let buffers = [TraceBuffer::new(0, 0, 2, 1 << 50), TraceBuffer::new(1, 1, 3, 1 << 63)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let mut targets: Vec<ReplayTarget> =
        crate::peers::PEER_NAMES.iter().map(|name| ReplayTarget::Peer(PeerConfig::named(name).unwrap())).collect();
    targets.extend(ALL_STRATEGIES.iter().map(|&strategy| ReplayTarget::Pool(config(strategy))));
    for target in &targets {
        for capacity in [None, Some(1 << 40)] {
            let options = ReplayOptions { samples: 10, capacity, repeat: 1, trim_each_pass: false };
            match replay_prepared(&prepared, target, options) {
                Ok(report) => {
                    let oom = report.out_of_memory.unwrap_or_else(|| panic!("{}: {report:?}", target.name()));
                    assert!(oom.report.requested >= 1 << 50, "{}: {oom:?}", target.name());
                }
                Err(ReplayError::Pool { source: PoolError::InvalidSize { size, .. }, .. }) => assert!(size >= 1 << 50),
                Err(e) => panic!("{}: {e}", target.name()),
            }
        }
    }
}

#[test]
fn a_request_past_the_pools_largest_block_on_a_smaller_device_is_an_out_of_memory() {
    // Issue 57: `fit` of activations past 128 TiB answered "invalid size: larger than one block
    // can be", where the answer is that the step does not fit the device.
    let huge = vrampool_core::sizes::MAX_REQUEST + 1;
    let buffers = [TraceBuffer::new(0, 0, 3, 4096), TraceBuffer::new(1, 1, 2, huge)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let mut targets: Vec<ReplayTarget> = ALL_STRATEGIES.into_iter().map(|s| ReplayTarget::Pool(config(s))).collect();
    targets.push(ReplayTarget::Pool(PoolConfig::default()));
    let limited = ReplayOptions { samples: 10, capacity: Some(80 << 30), repeat: 1, trim_each_pass: false };
    for target in &targets {
        let report = replay_prepared(&prepared, target, limited).unwrap_or_else(|e| panic!("{}: {e}", target.name()));
        let oom = report.out_of_memory.unwrap_or_else(|| panic!("{}: {report:?}", target.name()));
        assert_eq!((oom.event, oom.report.requested, report.events), (1, huge, 1), "{}", target.name());
        assert!(oom.report.allocated >= 4096, "{}: {oom:?}", target.name());
        // Without a capacity (a device of 1 PiB), the pool's own limit stays the error it is.
        let err = replay_prepared(&prepared, target, ReplayOptions::default()).unwrap_err();
        assert!(matches!(err, ReplayError::Pool { index: 1, source: PoolError::InvalidSize { .. } }), "{}: {err}", target.name());
    }
    // A plan made ahead whose arena is past it: out of memory at the first event.
    let step = [AheadBuffer::new(StreamId(0), huge, 0, 1)];
    let plan = AheadPlan::plan(&step, 512, std::time::Duration::from_millis(10)).unwrap();
    let ahead = crate::replay_row::ahead_target("", Arc::new(plan)).unwrap();
    let report = replay_prepared(&prepared, &ahead, limited).unwrap();
    assert_eq!(report.out_of_memory.map(|oom| oom.event), Some(0));
}

#[test]
fn live_bytes_past_u64_make_the_bound_the_largest_count_not_a_panic() {
    let buffers = [TraceBuffer::new(0, 0, 2, 1 << 63), TraceBuffer::new(1, 1, 3, 1 << 63), TraceBuffer::new(2, 4, 5, 1)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    assert_eq!(prepared.lower_bound_bytes(), u64::MAX);
    let report = replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), ReplayOptions::default()).unwrap();
    assert_eq!(report.out_of_memory.map(|oom| oom.event), Some(0));
}

/// A transformer-like training step at sequence length `seq` from time `*t` (as the runtime's own
/// tests make them): activations kept for the backward, a temporary per layer, the loss, then a
/// gradient per activation. Appends its buffers (ids from `buffers.len()`) and moves `*t` past it.
fn var_step(seq: u64, layers: u64, t: &mut u64, buffers: &mut Vec<TraceBuffer>) {
    const UNIT: u64 = 64 << 10;
    let mut buffer = |lower: u64, upper: u64, size: u64| {
        buffers.push(TraceBuffer::new(buffers.len() as u64, lower, upper, size));
    };
    let start = *t;
    // Layer l's activation lives from 3l until its gradient's turn; its temporary for one tick.
    let backward = start + 3 * layers + 1;
    for l in 0..layers {
        buffer(start + 3 * l, backward + 2 * (layers - l), seq * UNIT * (1 + l % 2));
        buffer(start + 3 * l + 1, start + 3 * l + 2, seq * seq * UNIT / 4 + UNIT);
    }
    buffer(backward - 1, backward + 2 * layers + 1, seq * UNIT); // the loss
    for l in (0..layers).rev() {
        let at = backward + 2 * (layers - 1 - l);
        buffer(at, at + 2, seq * UNIT); // a gradient
    }
    *t = backward + 2 * layers + 2;
}

/// A run of steps at the lengths `seqs`, a step marker after each, and its largest step's buffers
/// as a plan made ahead takes them.
fn var_run(seqs: &[u64]) -> (Vec<TraceBuffer>, Vec<u64>, Vec<AheadBuffer>) {
    let (mut t, mut buffers, mut markers) = (0, Vec::new(), Vec::new());
    for &seq in seqs {
        var_step(seq, 6, &mut t, &mut buffers);
        markers.push(t);
        t += 1;
    }
    let (mut largest, mut t) = (Vec::new(), 0);
    var_step(*seqs.iter().max().unwrap(), 6, &mut t, &mut largest);
    largest.sort_by_key(|b| (b.lower, b.id));
    let step = largest.iter().map(|b| AheadBuffer::new(StreamId(b.stream), b.size, b.lower, b.upper)).collect();
    (buffers, markers, step)
}

/// The `ahead` row with a plan of `step`, at the pool's alignment.
fn ahead_of(step: &[AheadBuffer]) -> ReplayTarget {
    let plan = AheadPlan::plan(step, 512, std::time::Duration::from_millis(100)).unwrap();
    crate::replay_row::ahead_target("", Arc::new(plan)).unwrap()
}

#[test]
fn the_ahead_row_serves_a_var_length_run_from_one_arena_below_the_default_rows_peak() {
    let (buffers, markers, step) = var_run(&[3, 8, 5, 1, 7, 8, 2, 6]);
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let prepared = prepared.with_steps(&step_positions(&buffers, &markers));
    let ahead = ahead_of(&step);
    let ReplayTarget::Ahead(_, plan) = &ahead else { unreachable!("the ahead row") };
    let (bound, arena_bytes) = (prepared.lower_bound_bytes(), plan.arena_bytes());
    for repeat in [1, 10] {
        let options = ReplayOptions { samples: 10, capacity: None, repeat, trim_each_pass: false };
        // In a debug build, `run` checks that no two live buffers share a byte, in every row.
        let report = replay_prepared(&prepared, &ahead, options).unwrap();
        let default = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), options).unwrap();
        assert_eq!(report.strategy, "ahead");
        assert!(report.peak_reserved_bytes <= default.peak_reserved_bytes, "{report:?}\n{default:?}");
        // The target: within 2% and 2 MiB of the bound.
        assert!(report.peak_reserved_bytes <= bound + bound / 50 + 2 * MIB, "{} of {bound}", report.peak_reserved_bytes);
        assert_eq!(report.first_pass_peak_reserved_bytes, report.peak_reserved_bytes);
        // Step 0 runs on the pool, the plan is set at its marker: from then on the arena's one
        // region (mapped in 2 MiB chunks) serves every step, and each copy after the first sets the
        // plan again with no device call.
        assert_eq!(report.peak_reserved_bytes, arena_bytes.next_multiple_of(2 * MIB));
        assert!(report.device_allocs + report.device_frees <= 64, "{report:?}");
        let last_pass_calls = report.last_pass_device_allocs + report.last_pass_device_frees;
        assert!(repeat == 1 || last_pass_calls == 0, "{report:?}");
    }
    // Without the markers the plan is set at the first allocation, and the steps still end, each
    // once everything it allocated is freed: the arena's region, and no other device call.
    let auto = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let report = replay_prepared(&auto, &ahead, ReplayOptions::default()).unwrap();
    let chunks = arena_bytes.div_ceil(2 * MIB);
    assert_eq!((report.peak_reserved_bytes, report.device_allocs, report.device_frees), (chunks * 2 * MIB, chunks, 0));
}

#[test]
fn weights_made_before_the_plan_is_set_stay_in_the_pool_and_every_step_is_served() {
    // Weights (live throughout) made at the start, and state made in the first step that lives on:
    // the plan is set at the first marker, so none of them sits in its bytes.
    let (mut buffers, markers, step) = var_run(&[8, 3, 5, 8, 2]);
    let end = markers.last().unwrap() + 1;
    for (i, size) in [2 * MIB, 4 * MIB, 6 * MIB].into_iter().enumerate() {
        buffers.push(TraceBuffer::new(1000 + i as u64, 0, end, size));
        buffers.push(TraceBuffer::new(2000 + i as u64, markers[0] - 1, end, size));
    }
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap().with_steps(&step_positions(&buffers, &markers));
    let options = ReplayOptions { samples: 0, capacity: None, repeat: 3, trim_each_pass: false };
    let ahead = replay_prepared(&prepared, &ahead_of(&step), options).unwrap();
    let default = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), options).unwrap();
    let bound = prepared.lower_bound_bytes();
    assert!(ahead.peak_reserved_bytes <= default.peak_reserved_bytes.min(bound + bound / 50 + 2 * MIB), "{ahead:?}");
    assert_eq!(ahead.last_pass_device_allocs + ahead.last_pass_device_frees, 0);
}

#[test]
fn an_ahead_row_whose_arena_does_not_fit_runs_out_at_the_first_event() {
    let (buffers, _, step) = var_run(&[8, 4]);
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let ahead = ahead_of(&step);
    let options = ReplayOptions { samples: 10, capacity: Some(prepared.lower_bound_bytes() / 2), repeat: 1, trim_each_pass: false };
    let report = replay_prepared(&prepared, &ahead, options).unwrap();
    let oom = report.out_of_memory.expect("the arena is larger than the device");
    assert_eq!((oom.event, report.events), (0, 0));
    assert!(oom.report.requested >= prepared.lower_bound_bytes(), "{oom:?}");
}

#[test]
fn step_markers_fall_before_the_events_at_their_time() {
    // 0 lives on [0, 1), 1 on [3, 4): alloc 0, free 0, alloc 1, free 1.
    let buffers = [TraceBuffer::new(0, 0, 1, 512), TraceBuffer::new(1, 3, 4, 512)];
    assert_eq!(step_positions(&buffers, &[0, 1, 2, 3, 10]), [0, 1, 2, 2, 4]);
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap().with_steps(&[9, 2, 2, 0]);
    assert_eq!(prepared.steps, [0, 2, 4]);
}

/// Hands out every buffer at the same address.
struct Overlapping;

impl Replayed for Overlapping {
    fn allocate(&mut self, _: u64, _: u64) -> Result<u64, PoolError> {
        Ok(4096)
    }
    fn free(&mut self, _: u64) -> Result<(), PoolError> {
        Ok(())
    }
    fn now(&self) -> (u64, u64, f64) {
        (0, 0, 0.0)
    }
    fn totals(&self) -> (u64, u64, u64, u64) {
        (0, 0, 0, 0)
    }
    fn trim(&mut self) -> Result<(), PoolError> {
        Ok(())
    }
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "shares bytes with the live buffer")]
fn a_replay_in_a_debug_build_catches_two_live_buffers_sharing_a_byte() {
    let buffers = [TraceBuffer::new(0, 0, 2, 512), TraceBuffer::new(1, 1, 3, 512)];
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let _ = run(&prepared, &mut Overlapping, ReplayOptions::default());
}

/// 0, 1 and 2 side by side, then 0 and 2 go and 3 comes: the most allocated (1 and 3) comes with
/// the freed holes, where each allocator's fragmentation shows (`tests/test_figures.py` has it too).
fn scattered() -> PreparedTrace {
    const KIB: u64 = 1024;
    let buffers = [
        TraceBuffer::new(0, 0, 3, 300 * KIB),
        TraceBuffer::new(1, 1, 9, 200 * KIB),
        TraceBuffer::new(2, 2, 3, 300 * KIB),
        TraceBuffer::new(3, 3, 9, 700 * KIB),
    ];
    PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap()
}

#[test]
fn every_rows_figures_on_a_small_trace_are_the_ones_worked_out_by_hand() {
    // Issue 57: the columns of the replay table a mutation could change unnoticed (a model's
    // fragmentation returning 0 failed no test). In KiB, at the moment 1 (200) and 3 (700) are live:
    // - best fit, PyTorch's small pool and the driver's pool (one 2 MiB segment or page, best fit
    //   with the rest split off): 0, 1, 2 at 0, 300, 500; freed, 2 merges with the tail into
    //   [500, 2048), 3 goes at 500: free [0, 300) and [1200, 2048): 1 - 848 / 1148.
    // - the slab (slab, hybrid and default: the small tier): classes of four steps per power of two
    //   (320, 224, 768) in runs carved by first fit: 3 at 544, the tail [1312, 2048) of 736 holds
    //   the 640 class at most; 1 - 640 / (2048 - 992).
    // - the buddy: 512, 256, 512 and 1024 blocks; 0's 512 stays apart from its buddy (1's half),
    //   2's merges and 3 takes [1024, 2048): free 512 and 256: 1 - 512 / 768.
    // - CuPy: exact 512 B multiples, one device allocation each, chunks never merge across them:
    //   300 + 200 + 300 + 700; free 300 and 300: 1 - 300 / 600.
    // - RMM (no initial pool without a capacity): growths of max(request, pool): 300, 300 (100
    //   left), 600 (300 left), 1200 (500 left) for 3; free 300, 100, 600, 500: 1 - 600 / 1500.
    const KIB: u64 = 1024;
    let prepared = scattered();
    let pool = |s| ReplayTarget::Pool(config(s));
    let peer = |name| ReplayTarget::Peer(PeerConfig::named(name).unwrap());
    let best_fit = (2048, 900, 1, 1.0 - 848.0 / 1148.0);
    let slab = (2048, 992, 1, 1.0 - 640.0 / 1056.0);
    for (target, expected) in [
        (pool(StrategyKind::BestFit), best_fit),
        (pool(StrategyKind::Slab), slab),
        (pool(StrategyKind::Hybrid), slab),
        (ReplayTarget::Pool(PoolConfig::default()), slab),
        (pool(StrategyKind::Buddy), (2048, 1280, 1, 1.0 - 512.0 / 768.0)),
        (peer("torch"), best_fit),
        (peer("torch+expandable"), best_fit),
        (peer("async"), best_fit),
        (peer("cupy"), (1500, 900, 4, 0.5)),
        (peer("rmm"), (2400, 900, 4, 0.6)),
    ] {
        let r = replay_prepared(&prepared, &target, ReplayOptions::default()).unwrap();
        let (reserved, allocated, allocs, fragmentation) = expected;
        let name = target.name();
        assert_eq!(
            (r.peak_reserved_bytes, r.peak_allocated_bytes, r.lower_bound_bytes),
            (reserved * KIB, allocated * KIB, 900 * KIB),
            "{name}"
        );
        assert_eq!((r.device_allocs, r.device_frees, r.first_pass_peak_reserved_bytes), (allocs, 0, reserved * KIB), "{name}");
        assert!((r.fragmentation - fragmentation).abs() < 1e-12, "{name}: fragmentation {} for {fragmentation}", r.fragmentation);
        // A second pass finds every block it needs cached: no device call.
        let twice = replay_prepared(&prepared, &target, ReplayOptions { repeat: 2, ..ReplayOptions::default() }).unwrap();
        assert_eq!(
            (twice.last_pass_device_allocs, twice.last_pass_device_frees, twice.peak_reserved_bytes),
            (0, 0, reserved * KIB),
            "{name}"
        );
    }
}

#[test]
fn the_idle_bytes_of_a_serving_arena_are_no_fragmentation() {
    // Issue 57: the default row (the pool under its planned steps) and the ahead row counted the
    // arena's idle bytes as free memory in no free range: fragmentation 1.0 whenever the arena
    // served the moment of most allocated. Eight buffers of k x 1.25 MiB, all live at once: 45 MiB,
    // in 2 MiB chunks mapped as the pool grows (23 of them: 46 MiB, its one free range the last
    // chunk's 1 MiB). The second pass is served from an arena of those 46 MiB, where that 1 MiB
    // waits, idle, for the next step: no range of the pool is free.
    let buffers: Vec<_> = (1..=8u64).map(|k| TraceBuffer::new(k, k, 20, (k * 1280) << 10)).collect();
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
    let default = ReplayTarget::Pool(PoolConfig::default());
    let once = replay_prepared(&prepared, &default, ReplayOptions::default()).unwrap();
    assert_eq!((once.peak_reserved_bytes, once.peak_allocated_bytes, once.device_allocs), (46 * MIB, 45 * MIB, 23));
    assert_eq!(once.fragmentation, 0.0, "one free range");
    let twice = replay_prepared(&prepared, &default, ReplayOptions { repeat: 2, ..ReplayOptions::default() }).unwrap();
    // The peak allocated is the buffers', not the region's 46 MiB.
    assert_eq!(
        (twice.peak_reserved_bytes, twice.peak_allocated_bytes, twice.device_allocs, twice.device_frees),
        (46 * MIB, 45 * MIB, 23, 0)
    );
    assert_eq!((twice.last_pass_device_allocs, twice.last_pass_device_frees), (0, 0));
    assert_eq!(twice.fragmentation, 0.0, "the arena's idle bytes are not scattered memory");
    // The ahead row on the small trace: the plan's arena (900 KiB in a 2 MiB region) serves it all.
    let step: Vec<_> = [(0, 3, 300u64), (1, 9, 200), (2, 3, 300), (3, 9, 700)]
        .iter()
        .map(|&(lower, upper, kib)| AheadBuffer::new(StreamId(0), kib << 10, lower, upper))
        .collect();
    let ahead = replay_prepared(&scattered(), &ahead_of(&step), ReplayOptions::default()).unwrap();
    assert_eq!((ahead.peak_reserved_bytes, ahead.device_allocs, ahead.fragmentation), (2 * MIB, 1, 0.0));
}
