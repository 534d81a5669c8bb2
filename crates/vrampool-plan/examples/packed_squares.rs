//! The 90 squares of BENCHMARKS.md's wider set (`packed_instance`, seeds 100-109, 200-209 and 300-309, three a
//! seed: 150-300 rectangles whole, or with one rectangle in ten or in five left out), each decided at 1 MiB or
//! planned within a budget; one line per square and a count. With `--csv DIR` it only writes them as
//! `DIR/sq-SEED-DROP.csv` (`id,lower,upper,size`, MiniMalloc's input format), to time another solver on them.
//!
//! With `--anchored`, 30 other squares (seeds 400-429) with one rectangle in ten left out among those not live
//! at one moment drawn per square, so that at that moment the rectangles still fill the whole 1 MiB: the
//! bound stays at 1 MiB, as on MiniMalloc's challenging instances, with slack elsewhere (`--csv` writes them as
//! `DIR/anchored-SEED.csv`).
//!
//! `cargo run --release -p vrampool-plan --features generators --example packed_squares -- [--anchored] (decide | plan) [BUDGET_SECONDS]`
//! `cargo run --release -p vrampool-plan --features generators --example packed_squares -- [--anchored] --csv DIR`
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

/// The anchored squares: (name, buffers), each with a bound of exactly 1 MiB.
fn anchored_squares() -> Vec<(String, Vec<Buffer>)> {
    (400..430u64)
        .map(|seed| {
            let whole = packed_instance(150 + (seed * 41 % 150) as usize, 1024, 1024, 0, seed);
            // xorshift64: the moment, then one draw per rectangle not live at it.
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut draw = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let moment = draw() % SIDE;
            let kept = whole
                .into_iter()
                .filter(|b| (b.lower <= moment && moment < b.upper) || draw() % 10 != 0)
                .enumerate()
                .map(|(id, b)| Buffer { id: id as u64, ..b })
                .collect();
            (format!("anchored-{seed}"), kept)
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let anchored = args.first().is_some_and(|a| a == "--anchored");
    if anchored {
        args.remove(0);
    }
    let all = if anchored { anchored_squares() } else { squares() };
    let mode = args.first().map(String::as_str).unwrap_or("decide");
    if mode == "--csv" {
        let dir = args.get(1).ok_or("--csv needs a folder")?;
        for (name, buffers) in &all {
            let rows: String =
                buffers.iter().map(|b| format!("{},{},{},{}\n", b.id, b.lower, b.upper, b.size)).collect();
            std::fs::write(format!("{dir}/{name}.csv"), format!("id,lower,upper,size\n{rows}"))?;
        }
        return Ok(());
    }
    let budget = Duration::from_secs_f64(args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(5.0));
    let options = PlanOptions { algorithm: Algorithm::Auto, budget, ..PlanOptions::default() };
    let mut met = 0;
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
