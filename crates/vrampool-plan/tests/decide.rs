//! `decide` at MiniMalloc's capacity on its challenging instances (`tests/data/static`): each fits in
//! 1 MiB, the best arena known for all of them. The search is much slower in a debug build, so there a
//! decision may be "unknown"; a plan, whenever one comes, must be valid and within the capacity.

use std::path::PathBuf;
use std::time::Duration;

use vrampool_plan::{decide, read_csv, validate, Algorithm, Decision, PlanOptions};

const CAPACITY: u64 = 1 << 20;

#[test]
fn every_challenging_instance_fits_in_one_mib() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/static");
    let budget = Duration::from_secs(if cfg!(debug_assertions) { 1 } else { 20 });
    for name in ["A", "B", "C", "D", "E", "F"] {
        let path = dir.join(format!("minimalloc-challenging-{name}.csv"));
        let buffers =
            read_csv(std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
        let options = PlanOptions { algorithm: Algorithm::Auto, budget, alignment: 1 };
        match decide(&buffers, CAPACITY, &options).unwrap() {
            Decision::Fits(plan) => {
                assert!(plan.arena_bytes <= CAPACITY, "{name}: {}", plan.arena_bytes);
                assert_eq!(validate(&buffers, &plan.offsets, 1).unwrap(), plan.arena_bytes, "{name}");
            }
            Decision::Infeasible => panic!("{name}: a plan at 1 MiB is known"),
            Decision::Unknown if cfg!(debug_assertions) => {}
            Decision::Unknown => panic!("{name}: no plan at 1 MiB in {budget:?}"),
        }
        // Below the lower bound it is infeasible at once.
        let below = vrampool_plan::lower_bound(&buffers) - 1;
        assert_eq!(decide(&buffers, below, &options).unwrap(), Decision::Infeasible, "{name}");
    }
}
