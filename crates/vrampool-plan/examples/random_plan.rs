//! Plans a seeded random instance with every algorithm and prints arena, lower bound and time.
//!
//! `cargo run --release -p vrampool-plan --features generators --example random_plan -- [N] [BUDGET_SECONDS] [SEED]` (seed 42 unless
//! given)
use std::time::Duration;
use vrampool_plan::{plan, random_instance, Algorithm, PlanOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(60_000);
    let budget: f64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1.0);
    let seed: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(42);
    let buffers = random_instance(n, seed);
    for algorithm in [Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Auto, Algorithm::Exact] {
        let options = PlanOptions { algorithm, budget: Duration::from_secs_f64(budget), alignment: 1 };
        let p = plan(&buffers, &options)?;
        println!(
            "{n} buffers seed {seed} {:>15}: arena {} lower bound {} ({:+.3}%) {:.3}s{}",
            algorithm.name(),
            p.arena_bytes,
            p.lower_bound_bytes,
            100.0 * (p.arena_bytes as f64 / p.lower_bound_bytes as f64 - 1.0),
            p.seconds,
            if p.optimal { " optimal" } else { "" }
        );
    }
    Ok(())
}
