//! What the crates' fuzz tests (`tests/fuzz.rs`, long proptest runs) share: how many inputs a
//! run draws, the seed it draws them from, a runner that keeps the failing cases in the crate's
//! `tests/fuzz.proptest-regressions`, and the report of a failure. Each crate keeps its own
//! default number of inputs, its strategies and what it prints of a run.
//!
//! ```no_run
//! # use proptest::test_runner::TestError;
//! let seed = vrampool_fuzz::run_seed();
//! let mut runner = vrampool_fuzz::runner(env!("CARGO_MANIFEST_DIR"), vrampool_fuzz::cases(32), seed);
//! match runner.run(&(0u64..100), |_| Ok(())) {
//!     Ok(()) => {}
//!     Err(TestError::Fail(why, minimal)) => {
//!         panic!("{}", vrampool_fuzz::failure_report("numbers", &why, seed, &format!("minimal input: {minimal}")))
//!     }
//!     Err(e) => panic!("numbers, run seed {seed}: {e}"),
//! }
//! ```

use std::fmt::Display;
use std::hash::{BuildHasher, RandomState};
use std::time::Instant;

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed, TestRunner};

/// Where a crate keeps its fuzz tests' failing cases, from its manifest's directory (commit it).
pub const REGRESSIONS: &str = "tests/fuzz.proptest-regressions";

/// How many inputs a fuzz test draws: `VRAMPOOL_FUZZ_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("VRAMPOOL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The seed a run draws its inputs from: `VRAMPOOL_FUZZ_SEED`, else a new one.
pub fn run_seed() -> u64 {
    std::env::var("VRAMPOOL_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| RandomState::new().hash_one(Instant::now()))
}

/// A runner that first replays the failing cases kept in [`REGRESSIONS`] under `manifest_dir`
/// (the crate's `CARGO_MANIFEST_DIR`), then draws `cases` inputs from `seed`, and keeps a new
/// failing case in that file.
pub fn runner(manifest_dir: &str, cases: u32, seed: u64) -> TestRunner {
    // proptest takes the file as a `&'static str`: one small path leaked per run.
    let regressions: &'static str = Box::leak(format!("{manifest_dir}/{REGRESSIONS}").into_boxed_str());
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..Config::default()
    })
}

/// The report of a run from `seed` in which `case` failed for `why`: how to draw the same inputs
/// again, where the case is kept, and `minimal`, the caller's account of the shrunk input.
pub fn failure_report(case: &str, why: &dyn Display, seed: u64, minimal: &str) -> String {
    format!("{case}: {why}\nrun seed {seed} (VRAMPOOL_FUZZ_SEED={seed} draws it again; the case is kept in {REGRESSIONS})\n{minimal}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_keeps_failing_cases_in_the_crates_regressions_file() {
        let runner = runner("/crate", 7, 42);
        let config = runner.config();
        assert_eq!((config.cases, config.rng_seed), (7, RngSeed::Fixed(42)));
        let persistence = config.failure_persistence.as_ref().unwrap().as_any().downcast_ref::<FileFailurePersistence>();
        assert_eq!(persistence, Some(&FileFailurePersistence::Direct("/crate/tests/fuzz.proptest-regressions")));
    }

    #[test]
    fn a_failure_report_says_how_to_draw_the_case_again() {
        let report = failure_report("sets", &"too big", 9, "minimal input: 3");
        assert_eq!(
            report,
            "sets: too big\nrun seed 9 (VRAMPOOL_FUZZ_SEED=9 draws it again; the case is kept in \
             tests/fuzz.proptest-regressions)\nminimal input: 3"
        );
    }
}
