//! Static planner benchmarks: every algorithm on every shared instance (`shared/traces/static`, one level above
//! the repository) and on 60,000 seeded random buffers.
//!
//! `cargo bench -p vrampool-benches --bench planner` first prints, once, a table of arena and time per
//! algorithm (the exact search with a 5 s budget, the targets' budget), then runs criterion with a 1 s budget
//! so that an instance whose lower bound is out of reach costs 1 s an iteration rather than 5.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::Criterion;
use vrampool_plan::{plan, random_instance, read_csv, Algorithm, Buffer, PlanOptions};

/// Columns of the table and criterion's functions, in this order.
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::GreedyBySize,
    Algorithm::BestFit,
    Algorithm::Exact,
    Algorithm::Auto,
];
const RANDOM_BUFFERS: usize = 60_000;
const RANDOM_SEED: u64 = 42;

fn instances() -> Vec<(String, Vec<Buffer>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/static");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let name = path
                .file_stem()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let file =
                std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (
                name,
                read_csv(file).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            )
        })
        .collect()
}

fn options(algorithm: Algorithm, budget: Duration) -> PlanOptions {
    PlanOptions {
        algorithm,
        budget,
        alignment: 1,
    }
}

/// One run of every algorithm on every instance, as a Markdown table.
fn print_table(cases: &[(String, Vec<Buffer>)]) {
    let budget = Duration::from_secs(5);
    println!("\nStatic planner: arena in bytes (seconds); * = proven optimal; exact search budget {budget:?}\n");
    let heads: Vec<String> = ALGORITHMS.iter().map(|a| a.name().to_string()).collect();
    println!(
        "| instance | buffers | lower bound | {} |",
        heads.join(" | ")
    );
    println!(
        "| --- | ---: | ---: |{}",
        " ---: |".repeat(ALGORITHMS.len())
    );
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
        println!(
            "| {name} | {} | {} | {} |",
            group_digits(buffers.len() as u64),
            group_digits(bound),
            cells.join(" | ")
        );
    }
    println!();
}

/// 1048576 -> "1,048,576".
fn group_digits(value: u64) -> String {
    let reversed: Vec<char> = value.to_string().chars().rev().collect();
    let groups: Vec<String> = reversed
        .chunks(3)
        .map(|c| c.iter().rev().collect())
        .collect();
    groups.into_iter().rev().collect::<Vec<_>>().join(",")
}

fn bench(c: &mut Criterion, cases: &[(String, Vec<Buffer>)]) {
    let budget = Duration::from_secs(1);
    for (name, buffers) in cases {
        let mut group = c.benchmark_group(format!("planner/{name}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for algorithm in ALGORITHMS {
            // Beyond the shared instances, the exact search alone is not worth timing: it skips parts that
            // large and returns greedy by size's plan.
            if name.starts_with("random") && algorithm == Algorithm::Exact {
                continue;
            }
            let options = options(algorithm, budget);
            group.bench_function(algorithm.name(), |b| {
                b.iter(|| plan(black_box(buffers), &options).expect("plan"))
            });
        }
        group.finish();
    }
}

fn main() {
    let mut cases = instances();
    cases.push((
        format!("random-{RANDOM_BUFFERS}-seed-{RANDOM_SEED}"),
        random_instance(RANDOM_BUFFERS, RANDOM_SEED),
    ));
    // `cargo bench` passes --bench; `cargo test --benches` does not, and then only criterion's quick check runs.
    if std::env::args().any(|a| a == "--bench") {
        print_table(&cases);
    }
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion, &cases);
    criterion.final_summary();
}
