//! MiniMalloc CSV instances recast in ways that keep their best known plan: mirrored in time, rows and ids
//! shuffled, sizes tripled, times stretched, one buffer in twenty left out (`--drops` draws, 2 unless told).
//! Each variant is decided at the best known capacity (1 MiB unless told) and planned within the budget
//! (figures as fractions of that capacity); a search tuned to one form of an instance misses the others, so
//! this checks that a result carries over to instances not seen. With `--csv DIR`
//! it only writes them as `DIR/NAME-VARIANT.csv`, to time another solver on them.
//!
//! `cargo run --release -p vrampool-plan --example variants -- [--budget SECONDS] [--capacity BYTES] [--drops COUNT] [--csv DIR] FILE...`
use std::time::{Duration, Instant};

use vrampool_plan::{decide, plan, read_csv, Algorithm, Buffer, Decision, PlanOptions};

/// A small deterministic generator (xorshift*), so each variant is the same from run to run.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The variants of `buffers` with the capacity each keeps feasible: (name, buffers, capacity).
fn variants(buffers: &[Buffer], capacity: u64, drops: u64) -> Vec<(String, Vec<Buffer>, u64)> {
    let end = buffers.iter().map(|b| b.upper).max().unwrap_or(0);
    let mirrored: Vec<Buffer> =
        buffers.iter().map(|b| Buffer { lower: end - b.upper, upper: end - b.lower, ..*b }).collect();
    let shuffled = |from: &[Buffer], seed: u64| {
        let mut draw = Draw(seed);
        let mut rows = from.to_vec();
        draw.shuffle(&mut rows);
        let mut ids: Vec<u64> = rows.iter().map(|b| b.id).collect();
        draw.shuffle(&mut ids);
        rows.iter().zip(ids).map(|(b, id)| Buffer { id, ..*b }).collect::<Vec<_>>()
    };
    let dropped = |seed: u64| {
        let mut draw = Draw(seed);
        buffers.iter().filter(|_| draw.below(20) != 0).copied().collect::<Vec<_>>()
    };
    let mut all = vec![
        ("as given".into(), buffers.to_vec(), capacity),
        ("mirrored".into(), mirrored.clone(), capacity),
        ("shuffled 1".into(), shuffled(buffers, 0x9e37_79b9), capacity),
        ("shuffled 2".into(), shuffled(buffers, 0x7f4a_7c15), capacity),
        ("mirrored, shuffled".into(), shuffled(&mirrored, 0x1234_5678), capacity),
        ("sizes x3".into(), buffers.iter().map(|b| Buffer { size: b.size * 3, ..*b }).collect(), capacity * 3),
        (
            "times x7 + 5".into(),
            buffers.iter().map(|b| Buffer { lower: b.lower * 7 + 5, upper: b.upper * 7 + 5, ..*b }).collect(),
            capacity,
        ),
    ];
    all.extend((1..=drops).map(|k| (format!("1 in 20 out, {k}"), dropped(0x9e37_79b9_7f4a_7c15 ^ k), capacity)));
    all
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut files, mut budget, mut capacity, mut csv, mut drops) = (Vec::new(), 5.0, 1u64 << 20, None, 2);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--budget" => budget = args.next().ok_or("--budget SECONDS")?.parse()?,
            "--capacity" => capacity = args.next().ok_or("--capacity BYTES")?.parse()?,
            "--drops" => drops = args.next().ok_or("--drops COUNT")?.parse()?,
            "--csv" => csv = Some(args.next().ok_or("--csv DIR")?),
            _ => files.push(arg),
        }
    }
    let options =
        PlanOptions { algorithm: Algorithm::Auto, budget: Duration::from_secs_f64(budget), ..PlanOptions::default() };
    let (mut decided, mut planned, mut all, mut written) = (0, 0, 0, 0);
    for file in files {
        let name = std::path::Path::new(&file).file_stem().and_then(|s| s.to_str()).unwrap_or(&file).to_string();
        for (variant, buffers, capacity) in variants(&read_csv(std::fs::File::open(&file)?)?, capacity, drops) {
            if let Some(dir) = &csv {
                let rows: String =
                    buffers.iter().map(|b| format!("{},{},{},{}\n", b.id, b.lower, b.upper, b.size)).collect();
                let variant = variant.replace([',', ' '], "");
                std::fs::write(format!("{dir}/{name}-{variant}.csv"), format!("id,lower,upper,size\n{rows}"))?;
                written += 1;
                continue;
            }
            let start = Instant::now();
            let decision = match decide(&buffers, capacity, &options)? {
                Decision::Fits(_) => "fits",
                Decision::Infeasible => "proven infeasible",
                Decision::Unknown => "undecided",
            };
            let decide_s = start.elapsed().as_secs_f64();
            let p = plan(&buffers, &options)?;
            all += 1;
            decided += usize::from(decision == "fits");
            planned += usize::from(p.arena_bytes <= capacity);
            println!(
                "{name} {variant:<20} bound {:.4}; decide: {decision} in {decide_s:.3} s; plan: {:.4} in {:.3} s{}",
                p.lower_bound_bytes as f64 / capacity as f64,
                p.arena_bytes as f64 / capacity as f64,
                p.seconds,
                if p.optimal { " optimal" } else { "" }
            );
        }
    }
    match csv {
        Some(dir) => println!("wrote {written} variants to {dir}"),
        None => println!("{decided} of {all} decided at the capacity, {planned} of {all} planned within it"),
    }
    Ok(())
}
