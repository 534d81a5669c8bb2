//! The 90 squares of BENCHMARKS.md's wider set (`packed_instance`, seeds 100-109, 200-209 and 300-309, three a
//! seed: 150-300 rectangles whole, or with one rectangle in ten or in five left out), each decided at 1 MiB or
//! planned within a budget; one line per square and a count. With `--csv DIR` it only writes them as
//! `DIR/sq-SEED-DROP.csv` (`id,lower,upper,size`, MiniMalloc's input format), to time another solver on them.
//!
//! `cargo run --release -p vrampool-plan --example packed_squares -- (decide | plan) [BUDGET_SECONDS]`
//! `cargo run --release -p vrampool-plan --example packed_squares -- --csv DIR`
use std::time::{Duration, Instant};
use vrampool_plan::{decide, packed_instance, plan, Algorithm, Buffer, Decision, PlanOptions};

const SIDE: u64 = 1 << 20;

/// The squares: (name, buffers).
fn squares() -> Vec<(String, Vec<Buffer>)> {
    let seeds = (100..110).chain(200..210).chain(300..310);
    seeds
        .flat_map(|seed: u64| {
            [(0, 150 + (seed * 37) % 150), (10, 170 + (seed * 53) % 130), (5, 200 + (seed * 29) % 100)]
                .map(|(drop, n)| (format!("sq-{seed}-{drop}"), packed_instance(n as usize, 1024, 1024, drop, seed)))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("decide");
    if mode == "--csv" {
        let dir = args.get(1).ok_or("--csv needs a folder")?;
        for (name, buffers) in squares() {
            let rows: String =
                buffers.iter().map(|b| format!("{},{},{},{}\n", b.id, b.lower, b.upper, b.size)).collect();
            std::fs::write(format!("{dir}/{name}.csv"), format!("id,lower,upper,size\n{rows}"))?;
        }
        return Ok(());
    }
    let budget = Duration::from_secs_f64(args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(5.0));
    let options = PlanOptions { algorithm: Algorithm::Auto, budget, ..PlanOptions::default() };
    let mut met = 0;
    let all = squares();
    for (name, buffers) in &all {
        let start = Instant::now();
        let (fits, outcome) = match mode {
            "decide" => match decide(buffers, SIDE, &options)? {
                Decision::Fits(_) => (true, "fits".to_string()),
                Decision::Infeasible => (false, "proven infeasible".to_string()),
                Decision::Unknown => (false, "undecided".to_string()),
            },
            "plan" => {
                let p = plan(buffers, &options)?;
                (
                    p.arena_bytes <= SIDE,
                    format!("arena {} ({:.4} of 1 MiB)", p.arena_bytes, p.arena_bytes as f64 / SIDE as f64),
                )
            }
            other => return Err(format!("unknown mode {other:?}: decide, plan or --csv").into()),
        };
        met += usize::from(fits);
        println!("{name} {} buffers: {outcome} in {:.3} s", buffers.len(), start.elapsed().as_secs_f64());
    }
    println!("{met} of {} at 1 MiB or below", all.len());
    Ok(())
}
