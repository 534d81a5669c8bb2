//! Plans MiniMalloc CSV instances with every algorithm and prints a table.
//!
//! `cargo run --release -p vrampool-plan --example plan_csv -- [--budget SECONDS] [--alignment BYTES] FILE...`

use std::time::Duration;

use vrampool_plan::{plan, read_csv, Algorithm, PlanOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut files = Vec::new();
    let mut options = PlanOptions { budget: Duration::from_secs(5), ..PlanOptions::default() };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--budget" => options.budget = Duration::from_secs_f64(args.next().ok_or("--budget SECONDS")?.parse()?),
            "--alignment" => options.alignment = args.next().ok_or("--alignment BYTES")?.parse()?,
            _ => files.push(arg),
        }
    }
    println!(
        "{:<34} {:>6} {:>14} {:>4} {:>16} {:>9} {:>8}",
        "instance", "n", "lower bound", "", "algorithm", "arena", "seconds"
    );
    for file in files {
        let buffers = read_csv(std::fs::File::open(&file)?)?;
        let name = std::path::Path::new(&file).file_stem().and_then(|s| s.to_str()).unwrap_or(&file).to_string();
        for algorithm in [Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Exact, Algorithm::Auto] {
            let p = plan(&buffers, &PlanOptions { algorithm, ..options })?;
            println!(
                "{:<34} {:>6} {:>14} {:>4} {:>16} {:>14} {:>8.3}{}",
                name,
                buffers.len(),
                p.lower_bound_bytes,
                "",
                algorithm.name(),
                p.arena_bytes,
                p.seconds,
                if p.optimal { " optimal" } else { "" }
            );
        }
    }
    Ok(())
}
