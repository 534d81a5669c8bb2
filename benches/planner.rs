//! Static planner benchmarks: every algorithm on every static instance (`tests/data/static` in the repository,
//! and `../shared/traces/static` beside it where it is there), on large LLM-like graphs and on 60,000 seeded random buffers.
//!
//! `cargo bench -p vrampool-benches --bench planner` first prints, once:
//! - per MiniMalloc challenging instance, our time to its best known arena (1 MiB) beside MiniMalloc's
//!   (`decide` at 1 MiB, MiniMalloc's own question; the median of three runs), and what `plan` gives in 5 s;
//! - squares cut into rectangles (`packed_instance`), decided at their side: instances the search was not
//!   tuned on;
//! - the large graphs (three seeds of each family of `large_graph`, two training steps, two decoding runs, the
//!   random instance): arena / bound and time per algorithm;
//! - a table of arena and time per algorithm on every instance (the exact search with a 5 s budget);
//!
//! then runs criterion with a 1 s budget, so that an instance whose lower bound is out of reach costs 1 s an
//! iteration rather than 5.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::Criterion;
use vrampool_plan::{
    csv_files, decide, large_graph, llm_decoding_instance, llm_training_instance, packed_instance, plan, random_instance, read_csv,
    Algorithm, Buffer, Decision, GraphFamily, PlanOptions,
};

/// Columns of the table and criterion's functions, in this order.
const ALGORITHMS: [Algorithm; 4] = [Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Exact, Algorithm::Auto];
const RANDOM_BUFFERS: usize = 60_000;
const RANDOM_SEED: u64 = 42;
/// The best arena known for every MiniMalloc challenging instance.
const BEST_KNOWN: u64 = 1 << 20;
/// MiniMalloc's seconds to decide 1 MiB, built from its source and run once each on this 2-core machine at
/// `--capacity=1048576` (issue 19's figures).
const MINIMALLOC_SECONDS: [(&str, f64); 6] = [("A", 7.4), ("B", 4.7), ("C", 0.9), ("D", 4.4), ("E", 6.8), ("F", 9.8)];

/// Seeds of each family of `large_graph` in the large graphs' table.
const FAMILY_SEEDS: [u64; 3] = [1, 2, 3];

/// The large graphs: seeds of every family of `large_graph`, then a training step over micro-batches and
/// decoding with KV caches grown by concatenation.
fn large_graphs() -> Vec<(String, Vec<Buffer>)> {
    let families = GraphFamily::ALL
        .into_iter()
        .flat_map(|family| FAMILY_SEEDS.map(|seed| (format!("{}-seed-{seed}", family.name()), large_graph(family, seed))));
    families
        .chain([
            ("llm-training-64x10".into(), llm_training_instance(64, 10, 4096, 1)),
            ("llm-training-96x20".into(), llm_training_instance(96, 20, 4096, 2)),
            ("llm-decoding-24x120".into(), llm_decoding_instance(24, 512, 120, 8192)),
            ("llm-decoding-32x150".into(), llm_decoding_instance(32, 256, 150, 8192)),
        ])
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Per MiniMalloc instance: our time to decide the best known arena, MiniMalloc's, and `plan` in 5 s.
fn print_minimalloc(cases: &[(String, Vec<Buffer>)]) {
    println!("\nMiniMalloc's challenging instances: seconds to a plan at the best known arena (1,048,576 B)\n");
    println!("| instance | buffers | lower bound | decide at 1 MiB, s (median of 3) | MiniMalloc, s | MiniMalloc / ours | plan in 5 s | plan, s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, minimalloc) in MINIMALLOC_SECONDS {
        let Some((_, buffers)) = cases.iter().find(|(n, _)| *n == format!("minimalloc-challenging-{name}")) else {
            continue;
        };
        let options = options(Algorithm::Auto, Duration::from_secs(20));
        let times: Vec<f64> = (0..3)
            .map(|_| {
                let start = std::time::Instant::now();
                let decision = decide(buffers, BEST_KNOWN, &options).expect("decide");
                assert!(matches!(decision, Decision::Fits(_)), "{name}: {decision:?}");
                start.elapsed().as_secs_f64()
            })
            .collect();
        let ours = median(times);
        let p = plan(buffers, &options_5s()).expect("plan");
        println!(
            "| {name} | {} | {} | {ours:.3} | {minimalloc} | {:.0}x | {}{} | {:.3} |",
            buffers.len(),
            group_digits(p.lower_bound_bytes),
            minimalloc / ours,
            group_digits(p.arena_bytes),
            if p.optimal { "*" } else { "" },
            p.seconds
        );
    }
}

fn options_5s() -> PlanOptions {
    options(Algorithm::Auto, Duration::from_secs(5))
}

/// Squares cut into rectangles, decided at their side within 3 s each.
fn print_packed() {
    let budget = Duration::from_secs(3);
    println!("\nSquares of 1 MiB by 1,048,576 steps cut into 200 rectangles (packed_instance, seeds 0-11), decided at");
    println!("1 MiB within {budget:?} each\n");
    let mut solved = Vec::new();
    for seed in 0..12 {
        let buffers = packed_instance(200, 1024, 1024, 0, seed);
        let start = std::time::Instant::now();
        let decision = decide(&buffers, BEST_KNOWN, &options(Algorithm::Auto, budget)).expect("decide");
        if matches!(decision, Decision::Fits(_)) {
            solved.push(start.elapsed().as_secs_f64());
        }
    }
    let times = if solved.is_empty() { "-".to_string() } else { format!("{:.3}", median(solved.clone())) };
    println!("decided: {} of 12; median seconds of those decided: {times}\n", solved.len());
}

/// Arena / bound and seconds per algorithm on the large graphs and the random instance.
fn print_large(cases: &[(String, Vec<Buffer>)]) {
    println!("\nLarge graphs: arena / lower bound (seconds), budget 5 s\n");
    let heads: Vec<&str> = [Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Auto].iter().map(|a| a.name()).collect();
    println!("| graph | buffers | {} |", heads.join(" | "));
    println!("| --- | ---: |{}", " ---: |".repeat(heads.len()));
    for (name, buffers) in cases {
        let cells: Vec<String> = [Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Auto]
            .iter()
            .map(|&algorithm| {
                let p = plan(buffers, &options(algorithm, Duration::from_secs(5))).expect("plan");
                format!("{:.4} ({:.2})", p.arena_bytes as f64 / p.lower_bound_bytes as f64, p.seconds)
            })
            .collect();
        println!("| {name} | {} | {} |", group_digits(buffers.len() as u64), cells.join(" | "));
    }
    println!();
}

fn instances() -> Vec<(String, Vec<Buffer>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    csv_files(&[root.join("tests/data/static"), root.join("../shared/traces/static")])
        .into_iter()
        .map(|path| {
            let name = path.file_stem().expect("file name").to_string_lossy().into_owned();
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name, read_csv(file).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        })
        .collect()
}

fn options(algorithm: Algorithm, budget: Duration) -> PlanOptions {
    PlanOptions { algorithm, budget, alignment: 1 }
}

/// One run of every algorithm on every instance, as a Markdown table.
fn print_table(cases: &[(String, Vec<Buffer>)]) {
    let budget = Duration::from_secs(5);
    println!("\nStatic planner: arena in bytes (seconds); * = proven optimal; exact search budget {budget:?}\n");
    let heads: Vec<String> = ALGORITHMS.iter().map(|a| a.name().to_string()).collect();
    println!("| instance | buffers | lower bound | {} |", heads.join(" | "));
    println!("| --- | ---: | ---: |{}", " ---: |".repeat(ALGORITHMS.len()));
    for (name, buffers) in cases {
        let cells: Vec<String> = ALGORITHMS
            .iter()
            .map(|&algorithm| {
                let p = plan(buffers, &options(algorithm, budget)).expect("plan");
                let star = if p.optimal { "*" } else { "" };
                format!("{}{star} ({:.4})", group_digits(p.arena_bytes), p.seconds)
            })
            .collect();
        let bound = vrampool_plan::lower_bound(buffers);
        println!("| {name} | {} | {} | {} |", group_digits(buffers.len() as u64), group_digits(bound), cells.join(" | "));
    }
    println!();
}

/// 1048576 -> "1,048,576".
fn group_digits(value: u64) -> String {
    let reversed: Vec<char> = value.to_string().chars().rev().collect();
    let groups: Vec<String> = reversed.chunks(3).map(|c| c.iter().rev().collect()).collect();
    groups.into_iter().rev().collect::<Vec<_>>().join(",")
}

fn bench(c: &mut Criterion, cases: &[(String, Vec<Buffer>)]) {
    let budget = Duration::from_secs(1);
    for (name, buffers) in cases {
        let mut group = c.benchmark_group(format!("planner/{name}"));
        group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
        for algorithm in ALGORITHMS {
            // Beyond the shared instances, the exact search alone is not worth timing: it skips parts that
            // large and returns greedy by size's plan.
            if name.starts_with("random") && algorithm == Algorithm::Exact {
                continue;
            }
            let options = options(algorithm, budget);
            group.bench_function(algorithm.name(), |b| b.iter(|| plan(black_box(buffers), &options).expect("plan")));
        }
        group.finish();
    }
}

fn main() {
    let mut cases = instances();
    let random = (format!("random-{RANDOM_BUFFERS}-seed-{RANDOM_SEED}"), random_instance(RANDOM_BUFFERS, RANDOM_SEED));
    // `cargo bench` passes --bench; `cargo test --benches` does not, and then only criterion's quick check runs.
    if std::env::args().any(|a| a == "--bench") {
        print_minimalloc(&cases);
        print_packed();
        let mut large = large_graphs();
        large.push(random.clone());
        print_large(&large);
        cases.push(random);
        print_table(&cases);
    } else {
        cases.push(random);
    }
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion, &cases);
    criterion.final_summary();
}
