//! Events per second of a replay, without Python around it: the median of RUNS replays of a trace
//! CSV (`vrampool capture --output T.csv`) through one row, each on a new pool, with the first
//! run's peak and device calls (the same in every run).
//!
//! Run: `cargo run --release -p vrampool-whatif --example replay_rate -- T.csv ROW [RUNS] [PASSES]`
//! (ROW as `vrampool replay --strategy` names it: `default`, `hybrid+vm`, `best_fit`, ...).

use vrampool_whatif::replay::{events_from_buffers, read_trace_csv, replay_prepared, PreparedTrace, ReplayOptions};
use vrampool_whatif::replay_row::row_target;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, row, rest @ ..] = args.as_slice() else {
        return Err("usage: replay_rate TRACE.csv ROW [RUNS] [PASSES]".into());
    };
    let runs: usize = rest.first().map_or(Ok(21), |s| s.parse())?;
    let passes: u64 = rest.get(1).map_or(Ok(1), |s| s.parse())?;
    let buffers = read_trace_csv(&std::fs::read_to_string(path)?)?;
    let prepared = PreparedTrace::new(&events_from_buffers(&buffers)?)?;
    let target = row_target(row, "")?;
    let options = ReplayOptions { samples: 0, capacity: None, repeat: passes, trim_each_pass: false };
    let mut rates = Vec::with_capacity(runs.max(1));
    for run in 0..runs.max(1) {
        let report = replay_prepared(&prepared, &target, options)?;
        if run == 0 {
            println!(
                "{row}: peak reserved {} B, {} device allocations, {} frees",
                report.peak_reserved_bytes, report.device_allocs, report.device_frees
            );
        }
        rates.push(report.events as f64 / report.seconds / 1e6);
    }
    rates.sort_by(f64::total_cmp);
    let (low, median, high) = (rates[0], rates[rates.len() / 2], rates[rates.len() - 1]);
    println!("{row}: {median:.2} M events/s (median of {} runs of {passes} passes; {low:.2}-{high:.2})", rates.len());
    Ok(())
}
