//! Shapes of instance where best fit scans thousands of gaps for every buffer, so that greedy by size alone
//! can take longer than the budget; prints, per shape, `plan`'s seconds and arena / lower bound for `auto` and
//! `exact`.
//!
//! `cargo run --release -p vrampool-plan --example budget_shapes -- [N] [BUDGET_SECONDS]` (60,000 and 5 unless
//! given)

use std::time::{Duration, Instant};

use vrampool_plan::{plan, Algorithm, Buffer, PlanOptions};

/// A seeded stream (xorshift64*): the same shapes on every run.
struct Draw(u64);

impl Draw {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    }
}

/// `n` buffers, the `i`-th with the lifetime and size `buffer` draws for it.
fn shape(n: u64, draw: &mut Draw, mut buffer: impl FnMut(u64, &mut Draw) -> (u64, u64, u64)) -> Vec<Buffer> {
    (0..n)
        .map(|i| {
            let (lower, upper, size) = buffer(i, draw);
            Buffer::new(i, lower, upper, size)
        })
        .collect()
}

fn shapes(n: u64) -> Vec<(&'static str, Vec<Buffer>)> {
    let mut draw = Draw(0x5EED);
    let d = &mut draw;
    vec![
        // Each buffer starts one step after the last and lives n steps: every one meets every other.
        ("staircase", shape(n, d, |i, d| (i, i + n, 1 + d.below(1 << 20)))),
        // Each lives from a step in the first 1,000 to one of the last 100,000 of 200,000.
        ("long-lived", shape(n, d, |_, d| (d.below(1_000), 100_000 + d.below(100_000), 1 + d.below(1 << 16)))),
        // Seven lifetimes in all, three steps each, every buffer 4 KiB.
        ("seven-lifetimes", shape(n, d, |i, _| (i % 7, i % 7 + 3, 4_096))),
        // Powers of two from 256 B to 64 MiB, living 1, 3, 1,000 or 30,000 of 200,000 steps.
        (
            "powers-of-two",
            shape(n, d, |_, d| {
                let lower = d.below(200_000);
                (lower, lower + [1, 3, 1_000, 30_000][d.below(4) as usize], 1 << (8 + d.below(19)))
            }),
        ),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(60_000);
    let budget = Duration::from_secs_f64(args.next().map(|a| a.parse()).transpose()?.unwrap_or(5.0));
    println!("{:<16} {:>7} {:>18} {:>18}", "shape", "n", "auto (s)", "exact (s)");
    for (name, buffers) in shapes(n) {
        let mut cells = Vec::new();
        for algorithm in [Algorithm::Auto, Algorithm::Exact] {
            let began = Instant::now();
            let p = plan(&buffers, &PlanOptions { algorithm, budget, alignment: 1 })?;
            let ratio = p.arena_bytes as f64 / p.lower_bound_bytes as f64;
            cells.push(format!("{ratio:.4} ({:.2})", began.elapsed().as_secs_f64()));
        }
        println!("{name:<16} {n:>7} {:>18} {:>18}", cells[0], cells[1]);
    }
    Ok(())
}
