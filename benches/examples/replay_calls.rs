//! Device calls of trace replays on the simulated device, `default` beside the models of
//! PyTorch's caching allocator:
//! `cargo run --release -p vrampool-benches --example replay_calls -- TRACE.csv... [--repeat N] [--trim-each-pass] [--conf TEXT]`.
//! A trace is the `id,lower,upper,size[,stream]` CSV (`vrampool capture --output t.csv`, or
//! `vrampool.whatif.traces.read(path).write("t.csv")`). Prints each row's peak reserved over the lower
//! bound, device allocations (segments, or map calls) and device frees (frees, or unmaps);
//! `--repeat` replays the trace that many times back to back on one pool; `--trim-each-pass`
//! gives every cached byte back between them (`empty_cache` at each step's end); `--conf` applies
//! `VRAMPOOL_CONF` text over `default`.
use vrampool_core::PoolConfig;
use vrampool_whatif::peers::PeerConfig;
use vrampool_whatif::replay::{events_from_buffers, read_trace_csv, replay_prepared, PreparedTrace, ReplayOptions, ReplayTarget};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut traces, mut repeat, mut conf, mut trim_each_pass) = (Vec::new(), 1, String::new(), false);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--repeat" => repeat = args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| fail("--repeat takes a number")),
            "--trim-each-pass" => trim_each_pass = true,
            "--conf" => conf = args.next().unwrap_or_else(|| fail("--conf takes key:value text")),
            _ => traces.push(arg),
        }
    }
    if traces.is_empty() {
        fail("usage: replay_calls TRACE.csv... [--repeat N] [--trim-each-pass] [--conf TEXT]");
    }
    let mut config = PoolConfig::default();
    config.apply_text(&conf).unwrap_or_else(|e| fail(&e.to_string()));
    let targets = [
        ("default", ReplayTarget::Pool(config)),
        ("torch", ReplayTarget::Peer(PeerConfig::named("torch").expect("a model"))),
        ("torch+expandable", ReplayTarget::Peer(PeerConfig::named("torch+expandable").expect("a model"))),
    ];
    println!(
        "{:<16} {:>9} {:<17} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}",
        "trace", "bound MiB", "row", "pass 1", "reserved", "allocs", "frees", "last alloc", "last frees"
    );
    for path in traces {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        let buffers = read_trace_csv(&text).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        let events = events_from_buffers(&buffers).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        let prepared = PreparedTrace::new(&events).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        let name = std::path::Path::new(&path).file_stem().map_or(path.clone(), |s| s.to_string_lossy().into_owned());
        for (row, target) in &targets {
            let options = ReplayOptions { samples: 0, capacity: None, repeat, trim_each_pass };
            let r = replay_prepared(&prepared, target, options).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
            let ratio = |bytes: u64| bytes as f64 / r.lower_bound_bytes as f64;
            let (first, last) = (ratio(r.first_pass_peak_reserved_bytes), ratio(r.peak_reserved_bytes));
            let bound = r.lower_bound_bytes >> 20;
            println!(
                "{name:<16} {bound:>9} {row:<17} {first:>8.3} {last:>8.3} {:>8} {:>8} {:>10} {:>10}",
                r.device_allocs, r.device_frees, r.last_pass_device_allocs, r.last_pass_device_frees
            );
        }
    }
}

fn fail(message: &str) -> ! {
    eprintln!("replay_calls: {message}");
    std::process::exit(2);
}
