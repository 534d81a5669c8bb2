//! The static instances (MiniMalloc's in `tests/data/static`, ResNet-50's in `../shared/traces/static` beside
//! the repository): every algorithm gives a valid plan, and Auto reaches the lower bound where it is known to be
//! reachable.
//!
//! The exact search is much slower in a debug build, so reaching the bound is asserted in release builds only
//! (`cargo test --release -p vrampool-plan`); a debug build checks validity with a 1 s budget.

use std::path::PathBuf;
use std::time::Duration;

use vrampool_plan::{plan, read_csv, read_plan_csv, validate, Algorithm, Buffer, PlanOptions};
use vrampool_shared_traces::needs_shared_traces;

/// The repository's folder of instances, and the shared one beside the repository.
fn instance_dirs() -> [PathBuf; 2] {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    [root.join("tests/data/static"), root.join("../shared/traces/static")]
}

/// An instance from the repository's folder, else from the shared one.
fn load(name: &str) -> Vec<Buffer> {
    let [carried, shared] = instance_dirs();
    let path = if carried.join(name).exists() { carried.join(name) } else { shared.join(name) };
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    read_csv(file).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs every algorithm on an instance; returns Auto's plan.
fn check(name: &str, budget: Duration) -> vrampool_plan::Plan {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let buffers = load(name);
    let mut auto = None;
    for algorithm in Algorithm::ALL {
        let options = PlanOptions { algorithm, budget, alignment: 1 };
        let plan = plan(&buffers, &options).unwrap_or_else(|e| panic!("{name} {algorithm}: {e}"));
        assert_eq!(validate(&buffers, &plan.offsets, 1).unwrap(), plan.arena_bytes, "{name} {algorithm}");
        assert!(plan.arena_bytes >= plan.lower_bound_bytes, "{name} {algorithm}");
        if algorithm == Algorithm::Auto {
            auto = Some(plan);
        }
    }
    auto.expect("Auto is in Algorithm::ALL")
}

/// In release builds, Auto must meet the lower bound (and say so).
fn assert_reaches_bound(name: &str, plan: &vrampool_plan::Plan) {
    if cfg!(debug_assertions) {
        return;
    }
    assert_eq!(plan.arena_bytes, plan.lower_bound_bytes, "{name}: arena above the lower bound");
    assert!(plan.optimal, "{name}");
}

/// The exact search's budget for Exact and Auto. The search stops as soon as it meets the lower bound (under a
/// second for each instance that it meets, see BENCHMARKS.md), so in release the budget is generous, so that a
/// busy machine does not fail the test; a debug build only checks validity.
const BUDGET: Duration = Duration::from_secs(if cfg!(debug_assertions) { 1 } else { 20 });

/// The tests take turns, so that their searches do not compete for the CPU.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn reads_every_instance() {
    let [carried, shared] = instance_dirs();
    let csv_names = |dir: &PathBuf| -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".csv")).collect()
    };
    let carried_names = csv_names(&carried);
    assert_eq!(carried_names.len(), 6, "{carried_names:?}");
    for name in carried_names.iter().chain(&csv_names(&shared)) {
        assert!(!load(name).is_empty(), "{name}");
    }
}

#[test]
fn challenging_a() {
    let plan = check("minimalloc-challenging-A.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 1_048_576);
    assert_reaches_bound("A", &plan);
}

#[test]
fn challenging_b() {
    let plan = check("minimalloc-challenging-B.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 1_048_576);
    assert_reaches_bound("B", &plan);
}

#[test]
fn challenging_c() {
    // The lower bound is below the best known 1,048,576, and reachable.
    let plan = check("minimalloc-challenging-C.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 1_039_360);
    assert_reaches_bound("C", &plan);
}

#[test]
fn challenging_d() {
    // The lower bound (986,112) is not reached; the best known is 1,048,576, and the search does better.
    // The search cannot meet the bound and spends its whole budget. With 5 s (the targets' budget, measured
    // in benches/planner.rs) it goes below 1 MiB on an idle machine but not on one whose two cores are busy
    // elsewhere; the test's generous budget does on both.
    let plan = check("minimalloc-challenging-D.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 986_112);
    if !cfg!(debug_assertions) {
        assert!(plan.arena_bytes <= 1_048_576, "D: {} above the best known", plan.arena_bytes);
    }
}

/// D's best plan known, 1,003,520 bytes (980 units of 1,024 against the bound's 963), found by searches at fixed
/// capacities with jittered orders (`exact::restarts::descend_on_d`, ignored): the buffers must be D's, and the
/// plan valid.
#[test]
fn challenging_d_stored_plan() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/minimalloc-challenging-D-plan.csv");
    let (buffers, offsets) = read_plan_csv(std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(buffers, load("minimalloc-challenging-D.csv"));
    let offsets = offsets.expect("an offset column");
    assert_eq!(validate(&buffers, &offsets, 1).unwrap(), 1_003_520);
}

#[test]
fn challenging_e() {
    let plan = check("minimalloc-challenging-E.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 1_048_576);
    assert_reaches_bound("E", &plan);
}

#[test]
fn challenging_f() {
    let plan = check("minimalloc-challenging-F.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 1_048_576);
    assert_reaches_bound("F", &plan);
}

#[needs_shared_traces]
#[test]
fn somas_resnet50() {
    let plan = check("somas-resnet50.csv", BUDGET);
    assert_eq!(plan.lower_bound_bytes, 1_515_472_556);
    // Its time (0.2 s on the development machine) is a benchmark figure, not asserted: tests share the CPU.
    assert_reaches_bound("resnet50", &plan);
}
