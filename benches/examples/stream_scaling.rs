//! Replay time against the number of streams: a trace of 10,000 buffers (20,000 events) whose
//! allocations spread over S streams round robin, replayed by every pool strategy and model;
//! with S = 10,000 every allocation has a stream of its own. The cost should grow linearly in
//! S: a time that quadruples when S doubles is a scan of every stream per event.
//! `cargo run --release -p vrampool-benches --example stream_scaling -- [STREAMS...] [--runs N] [--only NAME]`
//! (default streams 1000 2000 4000 10000, 3 runs; prints the median seconds of each).
use std::time::Instant;

use vrampool_benches::xorshift;
use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::PoolConfig;
use vrampool_whatif::peers::{PeerConfig, PEER_NAMES};
use vrampool_whatif::replay::{
    events_from_buffers, replay_prepared, PreparedTrace, ReplayOptions, ReplayTarget, TraceBuffer, ALL_STRATEGIES,
};

const BUFFERS: u64 = 10_000;

fn trace(streams: u64) -> PreparedTrace {
    let mut random = xorshift(0x9e3779b97f4a7c15);
    let buffers: Vec<TraceBuffer> = (0..BUFFERS)
        .map(|id| {
            let size = match random() % 3 {
                0 => 1 + random() % (64 * KIB),
                1 => 1 + random() % (4 * MIB),
                _ => 1 + random() % (64 * MIB),
            };
            TraceBuffer { stream: id % streams, ..TraceBuffer::new(id, id, id + 1 + random() % 64, size) }
        })
        .collect();
    PreparedTrace::new(&events_from_buffers(&buffers).expect("a well-formed trace")).expect("a well-formed trace")
}

fn main() {
    let (mut streams, mut runs, mut only) = (Vec::new(), 3usize, None::<String>);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).filter(|&n| n > 0).expect("--runs takes a positive number"),
            "--only" => only = Some(args.next().expect("--only takes a strategy or model name")),
            n => streams.push(n.parse::<u64>().ok().filter(|&n| n > 0).expect("streams are positive numbers")),
        }
    }
    if streams.is_empty() {
        streams = vec![1000, 2000, 4000, 10_000];
    }
    let mut targets: Vec<ReplayTarget> =
        ALL_STRATEGIES.iter().map(|&strategy| ReplayTarget::Pool(PoolConfig { strategy, ..PoolConfig::default() })).collect();
    targets.extend(PEER_NAMES.iter().map(|name| ReplayTarget::Peer(PeerConfig::named(name).expect("a model name"))));
    targets.retain(|t| only.as_deref().is_none_or(|name| t.name() == name));
    print!("{:<18}", "streams");
    for s in &streams {
        print!("{s:>10}");
    }
    println!("   (median seconds of {runs} runs)");
    let traces: Vec<PreparedTrace> = streams.iter().map(|&s| trace(s)).collect();
    for target in &targets {
        print!("{:<18}", target.name());
        for prepared in &traces {
            let mut times: Vec<f64> = (0..runs)
                .map(|_| {
                    let started = Instant::now();
                    replay_prepared(prepared, target, ReplayOptions { samples: 0, ..ReplayOptions::default() }).expect("the replay runs");
                    started.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            print!("{:>10.3}", times[runs / 2]);
        }
        println!();
    }
}
