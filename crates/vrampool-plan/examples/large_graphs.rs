//! Plans the seeded large graphs (`large_graph`) of each family and prints arena / lower bound per algorithm.
//!
//! `cargo run --release -p vrampool-plan --features generators --example large_graphs -- [--budget SECONDS] [--seeds 1,2,3]
//! [--families decoding,serving,...]`

use std::time::{Duration, Instant};

use vrampool_plan::{large_graph, lower_bound, plan, Algorithm, GraphFamily, PlanOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut budget, mut seeds, mut families) = (Duration::from_secs(5), vec![1, 2, 3], GraphFamily::ALL.to_vec());
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--budget" => budget = Duration::from_secs_f64(value.parse()?),
            "--seeds" => seeds = value.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--families" => {
                families = value
                    .split(',')
                    .map(|name| {
                        GraphFamily::ALL.into_iter().find(|f| f.name() == name).ok_or(format!("no family {name}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {arg}").into()),
        }
    }
    println!(
        "{:<14} {:>4} {:>7} {:>15} {:>15} {:>15} {:>7}",
        "family", "seed", "n", "greedy (s)", "best fit (s)", "auto (s)", "bound"
    );
    for family in families {
        for &seed in &seeds {
            let buffers = large_graph(family, seed);
            let bound = lower_bound(&buffers) as f64;
            let mut cells = Vec::new();
            let mut best_bound = 0.0;
            for algorithm in [Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Auto] {
                let start = Instant::now();
                let p = plan(&buffers, &PlanOptions { algorithm, budget, ..PlanOptions::default() })?;
                let seconds = start.elapsed().as_secs_f64();
                cells.push(format!("{:.4} ({seconds:.2})", p.arena_bytes as f64 / bound));
                best_bound = p.best_bound_bytes as f64 / bound;
            }
            println!(
                "{:<14} {seed:>4} {:>7} {:>15} {:>15} {:>15} {best_bound:>7.4}",
                family.name(),
                buffers.len(),
                cells[0],
                cells[1],
                cells[2]
            );
        }
    }
    Ok(())
}
