//! Fuzzing the planner by long proptest runs: random interval sets (valid and not) through every
//! algorithm, with the validator and a pair-by-pair check as the oracles. A valid set must give a
//! valid plan whose arena is at least the lower bound; an invalid one must give an error, never
//! a panic. `VRAMPOOL_FUZZ_CASES` sets the number of sets (default 96: a few seconds in debug),
//! drawn from one run seed that a failure prints (`VRAMPOOL_FUZZ_SEED=N` draws them again), after
//! the failing cases kept in `tests/fuzz.proptest-regressions` (commit that file);
//! `cargo test --release -p vrampool-plan --test fuzz -- --nocapture` prints the figures.

use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};
use vrampool_plan::{
    best_fit_decreasing, exact_search, greedy_by_size, lower_bound, plan, validate, Algorithm, Buffer, PlanError,
    PlanOptions,
};

/// Short enough that thousands of exact searches fit in a run; what it cannot solve in time it
/// hands to the fallback, which must be valid too.
const EXACT_BUDGET: Duration = Duration::from_millis(20);

/// Inputs per test, unless `VRAMPOOL_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u32 = 96;

/// Lifetimes of several shapes: dense short ones, long nested ones, all at the same time, and
/// times near the top of u64.
fn lifetime() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        4 => (0u64..40, 1u64..6).prop_map(|(lo, len)| (lo, lo + len)),
        2 => (0u64..10, 10u64..60).prop_map(|(lo, len)| (lo, lo + len)),
        1 => Just((5u64, 9u64)),
        1 => (0u64..4, 1u64..4).prop_map(|(back, len)| (u64::MAX - back - len, u64::MAX - back)),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1u64..=256,
        2 => 1u64..(1 << 30),
        1 => (0u32..40).prop_map(|p| 1u64 << p),
    ]
}

fn valid_set() -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((lifetime(), size()), 1..40).prop_map(|rows| {
        rows.into_iter()
            .enumerate()
            .map(|(id, ((lo, hi), size))| Buffer::new(id as u64 * 7 + 3, lo, hi, size))
            .collect()
    })
}

/// A valid set spoiled in one way every planner must refuse.
#[derive(Debug, Clone, Copy)]
enum Spoil {
    ZeroSize,
    EmptyLifetime,
    BackwardsLifetime,
    DuplicateId,
    /// Sizes whose total (or whose rounding up to the alignment) overflows 64 bits.
    Overflowing,
}

fn spoiled_set() -> impl Strategy<Value = (Vec<Buffer>, Spoil, usize)> {
    let spoil = prop_oneof![
        Just(Spoil::ZeroSize),
        Just(Spoil::EmptyLifetime),
        Just(Spoil::BackwardsLifetime),
        Just(Spoil::DuplicateId),
        Just(Spoil::Overflowing)
    ];
    (valid_set(), spoil, any::<usize>()).prop_map(|(mut set, spoil, at)| {
        let i = at % set.len();
        match spoil {
            Spoil::ZeroSize => set[i].size = 0,
            Spoil::EmptyLifetime => set[i].upper = set[i].lower,
            Spoil::BackwardsLifetime => (set[i].lower, set[i].upper) = (set[i].upper, set[i].lower),
            Spoil::DuplicateId => {
                let copy = Buffer { id: set[i].id, ..set[(i + 1) % set.len()] };
                set.push(copy);
            }
            Spoil::Overflowing => {
                let copy = Buffer { id: u64::MAX, size: u64::MAX - 1, ..set[i] };
                set.push(copy);
                set[i].size = u64::MAX / 2 + 1;
            }
        }
        (set, spoil, i)
    })
}

fn alignment() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(1u64), 3 => (0u32..13).prop_map(|p| 1u64 << p), 1 => 1u64..1000]
}

/// Whether two buffers live at one moment share a byte, by every pair.
fn conflict(buffers: &[Buffer], offsets: &[u64]) -> Option<(u64, u64)> {
    for i in 0..buffers.len() {
        for j in 0..i {
            let (a, b) = (&buffers[i], &buffers[j]);
            let bytes_meet =
                offsets[i] < offsets[j].saturating_add(b.size) && offsets[j] < offsets[i].saturating_add(a.size);
            if a.overlaps(b) && bytes_meet {
                return Some((a.id, b.id));
            }
        }
    }
    None
}

/// Checks one algorithm's offsets with both oracles; returns the arena.
fn check(name: &str, buffers: &[Buffer], offsets: &[u64], alignment: u64) -> Result<u64, TestCaseError> {
    let arena = validate(buffers, offsets, alignment)
        .map_err(|e| TestCaseError::fail(format!("{name}: the validator refused its plan: {e}")))?;
    if let Some((a, b)) = conflict(buffers, offsets) {
        return Err(TestCaseError::fail(format!(
            "{name}: buffers {a} and {b} share bytes, yet the validator passed the plan"
        )));
    }
    let top = buffers.iter().zip(offsets).map(|(b, &o)| o + b.size).max().unwrap_or(0);
    prop_assert!(arena >= top, "{}: arena {} below the highest end {}", name, arena, top);
    prop_assert!(
        arena >= lower_bound(buffers),
        "{}: arena {} below the lower bound {}",
        name,
        arena,
        lower_bound(buffers)
    );
    Ok(arena)
}

fn plans_valid_sets((buffers, alignment): (Vec<Buffer>, u64)) -> Result<(), TestCaseError> {
    let greedy = greedy_by_size(&buffers, alignment).map_err(|e| TestCaseError::fail(format!("greedy: {e}")))?;
    let greedy_arena = check("greedy-by-size", &buffers, &greedy, alignment)?;
    let best_fit =
        best_fit_decreasing(&buffers, alignment).map_err(|e| TestCaseError::fail(format!("best fit: {e}")))?;
    check("best-fit", &buffers, &best_fit, alignment)?;
    let exact = exact_search(&buffers, alignment, EXACT_BUDGET, None)
        .map_err(|e| TestCaseError::fail(format!("exact: {e}")))?;
    check("exact", &buffers, &exact.offsets, alignment)?;
    let seeded = exact_search(&buffers, alignment, EXACT_BUDGET, Some(&greedy))
        .map_err(|e| TestCaseError::fail(format!("seeded exact: {e}")))?;
    let seeded_arena = check("exact seeded with greedy", &buffers, &seeded.offsets, alignment)?;
    prop_assert!(
        seeded_arena <= greedy_arena,
        "the seeded search got worse than its seed: {} > {}",
        seeded_arena,
        greedy_arena
    );
    for algorithm in Algorithm::ALL {
        let options = PlanOptions { algorithm, budget: EXACT_BUDGET, alignment };
        let p = plan(&buffers, &options).map_err(|e| TestCaseError::fail(format!("plan {algorithm}: {e}")))?;
        let arena = check(algorithm.name(), &buffers, &p.offsets, alignment)?;
        prop_assert_eq!(arena, p.arena_bytes, "{}: the plan misreports its arena", algorithm);
        prop_assert!(
            p.arena_bytes >= p.lower_bound_bytes && p.lower_bound_bytes >= lower_bound(&buffers),
            "{}: bounds",
            algorithm
        );
        prop_assert!(
            !p.optimal || p.arena_bytes <= seeded_arena,
            "{}: called optimal, yet a better plan exists",
            algorithm
        );
    }
    // The validator is not vacuous: moving a buffer onto one it meets in time is caught.
    let meeting =
        (0..buffers.len()).flat_map(|i| (0..i).map(move |j| (i, j))).find(|&(i, j)| buffers[i].overlaps(&buffers[j]));
    if let Some((i, j)) = meeting {
        let mut bad = greedy.clone();
        bad[i] = bad[j];
        prop_assert!(validate(&buffers, &bad, alignment).is_err(), "the validator passed two buffers at one offset");
    }
    Ok(())
}

fn refuses_spoiled_sets(
    (buffers, spoil, at): (Vec<Buffer>, Spoil, usize),
    alignment: u64,
) -> Result<(), TestCaseError> {
    let ctx = format!("{spoil:?} at {at}");
    let expected = |r: Result<(), PlanError>, who: &str| -> Result<(), TestCaseError> {
        match r {
            Err(PlanError::ZeroSize { .. }) => {
                prop_assert!(matches!(spoil, Spoil::ZeroSize), "{}: {}: zero size", ctx, who)
            }
            Err(PlanError::EmptyLifetime { .. }) => {
                prop_assert!(matches!(spoil, Spoil::EmptyLifetime | Spoil::BackwardsLifetime), "{}: {}", ctx, who)
            }
            Err(PlanError::DuplicateId { .. }) => prop_assert!(matches!(spoil, Spoil::DuplicateId), "{}: {}", ctx, who),
            Err(PlanError::Overflow { .. }) => prop_assert!(matches!(spoil, Spoil::Overflowing), "{}: {}", ctx, who),
            Err(e) => prop_assert!(false, "{}: {}: unexpected error {}", ctx, who, e),
            Ok(()) => prop_assert!(false, "{}: {} accepted a spoiled set", ctx, who),
        }
        Ok(())
    };
    expected(greedy_by_size(&buffers, alignment).map(drop), "greedy")?;
    expected(best_fit_decreasing(&buffers, alignment).map(drop), "best fit")?;
    expected(exact_search(&buffers, alignment, EXACT_BUDGET, None).map(drop), "exact")?;
    for algorithm in Algorithm::ALL {
        expected(
            plan(&buffers, &PlanOptions { algorithm, budget: EXACT_BUDGET, alignment }).map(drop),
            algorithm.name(),
        )?;
    }
    expected(validate(&buffers, &vec![0; buffers.len()], alignment).map(drop), "validate")?;
    Ok(())
}

/// Runs `test` over the run's inputs; prints the executions and time, and the shrunk input on a
/// failure.
fn fuzz<S: Strategy>(name: &str, input: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let seed = vrampool_fuzz::run_seed();
    let mut runner = vrampool_fuzz::runner(env!("CARGO_MANIFEST_DIR"), vrampool_fuzz::cases(DEFAULT_CASES), seed);
    let (started, runs) = (Instant::now(), Cell::new(0u64));
    let result = runner.run(&input, |value| {
        runs.set(runs.get() + 1);
        test(value)
    });
    match result {
        Ok(()) => eprintln!("fuzz {name}: {} inputs in {:.1} s", runs.get(), started.elapsed().as_secs_f64()),
        Err(TestError::Fail(why, minimal)) => {
            panic!("{}", vrampool_fuzz::failure_report(name, &why, seed, &format!("minimal input: {minimal:?}")))
        }
        Err(e) => panic!("{name}, run seed {seed}: {e}"),
    }
}

#[test]
fn every_algorithm_plans_random_sets_validly_and_never_below_the_bound() {
    fuzz("valid interval sets", (valid_set(), alignment()), plans_valid_sets);
}

#[test]
fn every_algorithm_refuses_spoiled_sets_with_the_right_error() {
    fuzz("spoiled interval sets", (spoiled_set(), alignment()), |(set, alignment)| {
        refuses_spoiled_sets(set, alignment)
    });
}
