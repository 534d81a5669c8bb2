//! The planner's front door: pick an algorithm, get a validated plan with its lower bound.

use std::time::{Duration, Instant};

use crate::exact::{deadline_after, exact_decide, fallback_plan, search_instance, split, Start, Verdict};
use crate::floors::{floors_by_start, floors_by_start_counted};
use crate::greedy::{
    arena_of, best_fit_by_start, best_fit_decreasing_until, greedy_by_size_of, greedy_by_size_until, greedy_is_cheap,
    overlapping_pairs, CHEAP_OVERLAPS_PER_BUFFER,
};
use crate::instance::Instance;
use crate::ring::ring_plan;
use crate::trace::{Stages, Trace};
use crate::{validate, Buffer, PlanError};

/// Which offset assignment to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Both heuristics; if neither meets the lower bound, the exact search seeded with the better one.
    #[default]
    Auto,
    /// TFLite's greedy by size.
    GreedyBySize,
    /// XLA's best fit by decreasing size.
    BestFit,
    /// The exact search alone (falls back to greedy by size for parts it cannot solve in the budget).
    Exact,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [Algorithm::Auto, Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Exact];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::GreedyBySize => "greedy-by-size",
            Algorithm::BestFit => "best-fit",
            Algorithm::Exact => "exact",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown algorithm `{s}` (expected auto, greedy-by-size, best-fit or exact)"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    pub algorithm: Algorithm,
    /// Time `plan` may take (Auto and Exact; default 5 s), the heuristics' time included. Auto spends it only
    /// when neither heuristic meets the lower bound, and all of it only when the search cannot meet it
    /// either.
    pub budget: Duration,
    /// Every offset is a multiple of this (>= 1); sizes are rounded up to it inside the planner.
    pub alignment: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { algorithm: Algorithm::Auto, budget: Duration::from_secs(5), alignment: 1 }
    }
}

/// A plan: buffer `i` lives at `offsets[i]` of an arena of `arena_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Parallel to the input buffers.
    pub offsets: Vec<u64>,
    /// The highest end of any buffer, rounded up to the alignment.
    pub arena_bytes: u64,
    /// The most (aligned) bytes live at one time: no plan needs less.
    pub lower_bound_bytes: u64,
    /// The best lower bound known: `lower_bound_bytes`, or more where the exact search proved that no plan
    /// fits below it. At most `arena_bytes`, and equal to it when the plan is optimal.
    pub best_bound_bytes: u64,
    /// The algorithm asked for.
    pub algorithm: Algorithm,
    /// Wall time spent planning (including validation).
    pub seconds: f64,
    /// Whether no plan has a smaller arena (it meets the lower bound, or the exact search proved it).
    pub optimal: bool,
}

/// Plans `buffers` with `options`. The result is checked by the independent validator before it is returned.
pub fn plan(buffers: &[Buffer], options: &PlanOptions) -> Result<Plan, PlanError> {
    planned(buffers, options, None).map(|(plan, _)| plan)
}

/// [`plan`] with the exact search's `stages` alone, and the time at which its arena was first reached (for Auto
/// and Exact): the ablation benchmark's (`examples/ablation.rs`).
#[doc(hidden)]
pub fn plan_with_stages(
    buffers: &[Buffer],
    options: &PlanOptions,
    stages: Stages,
) -> Result<(Plan, Option<Duration>), PlanError> {
    planned(buffers, options, Some(stages))
}

/// [`plan`], recording the stages' progress where `stages` are given.
fn planned(
    buffers: &[Buffer],
    options: &PlanOptions,
    stages: Option<Stages>,
) -> Result<(Plan, Option<Duration>), PlanError> {
    let start = Instant::now();
    let alignment = options.alignment;
    // The working form, checked once, for every algorithm that runs.
    let inst = Instance::new(buffers, alignment)?;
    let mut trace = match stages {
        Some(stages) => Trace::recording(stages, start, &inst, &split(&inst)),
        None => Trace::all(),
    };
    let lower_bound = inst.lower_bound();
    let arena = |offsets: &[u64]| validate(buffers, offsets, alignment);
    // A first plan's arena, and how long its check took: the search keeps that long for the check at the end.
    let timed_arena = |offsets: &[u64]| {
        let checking = Instant::now();
        arena(offsets).map(|bytes| (bytes, checking.elapsed()))
    };

    let (offsets, bound) = match options.algorithm {
        Algorithm::GreedyBySize => (greedy_by_size_of(&inst), lower_bound),
        Algorithm::BestFit => (best_fit_decreasing_until(&inst, None).expect("no deadline"), lower_bound),
        Algorithm::Exact => {
            let fallback = fallback_plan(&inst, search_deadline(start, options.budget, Duration::ZERO));
            let (_, check) = timed_arena(&fallback)?;
            let deadline = search_deadline(start, options.budget, check);
            let outcome = search_instance(&inst, deadline, Start::Fallback(fallback), &mut trace);
            (outcome.offsets, outcome.bound_bytes)
        }
        Algorithm::Auto => {
            // Cheapest first; stop as soon as a plan meets the lower bound.
            let greedy = first_plan(&inst, start, options.budget);
            trace.plan(&inst, &greedy);
            // The heuristics' time counts against the budget, and so does the check of the plan at the end.
            let (greedy_arena, check) = timed_arena(&greedy)?;
            if greedy_arena <= lower_bound {
                (greedy, lower_bound)
            } else {
                let (seed, seed_arena) = better_heuristic(
                    &inst,
                    buffers,
                    alignment,
                    greedy,
                    greedy_arena,
                    start.checked_add(options.budget / 2),
                )?;
                trace.plan(&inst, &seed);
                let deadline = search_deadline(start, options.budget, check);
                let outcome = search_instance(&inst, deadline, Start::Seed(&seed), &mut trace);
                // The search's plan only where it beats its seed: no plan Auto gives is worse than the heuristics'.
                let offsets = if arena(&outcome.offsets)? < seed_arena { outcome.offsets } else { seed };
                (offsets, outcome.bound_bytes)
            }
        }
    };
    let plan = finish(buffers, offsets, lower_bound, bound, options, start)?;
    let reached = trace.time_to(plan.arena_bytes);
    Ok((plan, reached))
}

/// How [`quick_plan`] placed the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuickPlacement {
    /// Greedy by size, where few buffers overlap each.
    GreedyBySize,
    /// Best fit in order of start, where few buffers overlap each and it does better than greedy by size.
    BestFitByStart,
    /// Round a ring, where buffers end in the order they start (`ring_plan`).
    Ring,
    /// Each buffer at its floor in order of start (`floors_by_start`).
    FloorsByStart,
}

impl QuickPlacement {
    pub fn name(self) -> &'static str {
        match self {
            QuickPlacement::GreedyBySize => "greedy-by-size",
            QuickPlacement::BestFitByStart => "best-fit-by-start",
            QuickPlacement::Ring => "ring",
            QuickPlacement::FloorsByStart => "floors-by-start",
        }
    }
}

/// A plan from [`quick_plan`], with how it was made and the work that took.
#[derive(Debug, Clone, PartialEq)]
pub struct QuickPlan {
    pub plan: Plan,
    pub placement: QuickPlacement,
    /// The placement's steps: the overlapping pairs greedy by size scans (twice that where best fit by start
    /// scans them too), the buffers the ring places, or the skyline nodes the floors visit. O(n log n) past
    /// greedy's bound; the checks around it (sorting, validation) are too.
    pub work: u64,
}

impl QuickPlan {
    /// Whether its arena is more than a `QUICK_POOR_DIVISOR`th above the lower bound.
    pub fn is_poor(&self) -> bool {
        is_poor(self.plan.arena_bytes, self.plan.lower_bound_bytes)
    }
}

fn is_poor(arena: u64, lower_bound: u64) -> bool {
    arena > lower_bound + lower_bound / QUICK_POOR_DIVISOR
}

/// The overlapping pairs up to which `quick_plan` places by greedy by size (and by start) whatever the
/// buffers (a few hundred milliseconds each at most).
const QUICK_GREEDY_PAIRS: u64 = 1 << 26;

/// `quick_plan` tries best fit by start only where greedy by size's arena is more than a sixteenth above the
/// bound. Design: training steps are within a few hundredths, where the second placement only doubled the
/// plan's time (gpt2-medium at four lengths, replayed ten times: 6.2 M to 4.5 M events/s); decodes whose caches
/// grow by copy were 1.57-1.74x, and best fit by start 1.05-1.08x.
const QUICK_POOR_DIVISOR: u64 = 16;

/// A plan in O(n log n) whatever the lifetimes, with no search and no clock: greedy by size (or best fit in
/// order of start, where that does better on a poor greedy plan) where they scan few pairs (at most 64 a
/// buffer, or 2^26 in all), else round a ring where buffers end in the order they start, else each buffer
/// at its floor in order of start. For a runtime that plans while a program waits
/// (the planned arena, at an iteration's end), where greedy alone takes 13 s on 100,000 buffers live at
/// once.
pub fn quick_plan(buffers: &[Buffer], alignment: u64) -> Result<QuickPlan, PlanError> {
    let start = Instant::now();
    let inst = Instance::new(buffers, alignment)?;
    let pairs = overlapping_pairs(&inst);
    let lower_bound = inst.lower_bound();
    let (offsets, placement, work) = if pairs <= (CHEAP_OVERLAPS_PER_BUFFER * inst.len() as u64).max(QUICK_GREEDY_PAIRS)
    {
        let greedy = greedy_by_size_of(&inst);
        let greedy_arena = arena_of(&inst, &greedy);
        match is_poor(greedy_arena, lower_bound).then(|| best_fit_by_start(&inst)) {
            Some(by_start) if arena_of(&inst, &by_start) < greedy_arena => {
                (by_start, QuickPlacement::BestFitByStart, 2 * pairs)
            }
            Some(_) => (greedy, QuickPlacement::GreedyBySize, 2 * pairs),
            None => (greedy, QuickPlacement::GreedyBySize, pairs),
        }
    } else if let Some(offsets) = ring_plan(&inst) {
        (offsets, QuickPlacement::Ring, inst.len() as u64)
    } else {
        let (offsets, visits) = floors_by_start_counted(&inst);
        (offsets, QuickPlacement::FloorsByStart, visits)
    };
    let options = PlanOptions { algorithm: Algorithm::GreedyBySize, budget: Duration::ZERO, alignment };
    let plan = finish(buffers, offsets, lower_bound, lower_bound, &options, start)?;
    Ok(QuickPlan { plan, placement, work })
}

/// The answer to "do the buffers fit in an arena of `capacity` bytes?".
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A plan whose arena is at most the capacity.
    Fits(Plan),
    /// No plan fits: the exact search proved it, or the lower bound is above the capacity.
    Infeasible,
    /// The budget ran out before a plan or a proof was found (or the algorithm, a heuristic, proves nothing).
    Unknown,
}

/// Decides whether `buffers` fit in an arena of `capacity` bytes, as MiniMalloc does: the heuristics first,
/// then (Auto and Exact) the exact search at that capacity, within `options.budget`. A plan found is checked
/// by the validator. A capacity of zero, or one below the largest (aligned) buffer, is an error rather than a
/// question: no search is needed to answer it.
pub fn decide(buffers: &[Buffer], capacity: u64, options: &PlanOptions) -> Result<Decision, PlanError> {
    let start = Instant::now();
    let alignment = options.alignment;
    let inst = Instance::new(buffers, alignment)?;
    if capacity == 0 {
        return Err(PlanError::ZeroCapacity);
    }
    if let Some(largest) = (0..inst.len()).max_by_key(|&i| inst.size[i]).filter(|&i| inst.size[i] > capacity) {
        return Err(PlanError::CapacityBelowBuffer { id: buffers[largest].id, size: inst.size[largest], capacity });
    }
    let lower_bound = inst.lower_bound();
    if lower_bound > capacity {
        return Ok(Decision::Infeasible);
    }
    let arena = |offsets: &[u64]| validate(buffers, offsets, alignment);
    let seed = match options.algorithm {
        Algorithm::GreedyBySize => greedy_by_size_of(&inst),
        Algorithm::BestFit => best_fit_decreasing_until(&inst, None).expect("no deadline"),
        Algorithm::Exact => first_plan(&inst, start, options.budget),
        Algorithm::Auto => {
            let greedy = first_plan(&inst, start, options.budget);
            let greedy_arena = arena(&greedy)?;
            if greedy_arena > capacity {
                let deadline = start.checked_add(options.budget / 2);
                better_heuristic(&inst, buffers, alignment, greedy, greedy_arena, deadline)?.0
            } else {
                greedy
            }
        }
    };
    let offsets = if arena(&seed)? <= capacity {
        seed
    } else if matches!(options.algorithm, Algorithm::Exact | Algorithm::Auto) {
        let left = search_deadline(start, options.budget, Duration::ZERO).saturating_duration_since(Instant::now());
        match exact_decide(&inst, capacity, left, &seed) {
            Verdict::Fits(offsets) => offsets,
            Verdict::Infeasible => return Ok(Decision::Infeasible),
            Verdict::Unknown => return Ok(Decision::Unknown),
        }
    } else {
        return Ok(Decision::Unknown);
    };
    Ok(Decision::Fits(finish(buffers, offsets, lower_bound, lower_bound, options, start)?))
}

/// The search's stop: `budget` after `start`, less `check` (as long as the check of the plan at the end) and a
/// hundredth of the budget, since the search looks at the clock only between placements (every 1,024 buffers
/// of a heuristic's pass, every 64 nodes of a small group): without it, `plan` on the large graphs ended up to
/// 40 ms past a 5 s budget.
fn search_deadline(start: Instant, budget: Duration, check: Duration) -> Instant {
    deadline_after(start, budget.saturating_sub(check).saturating_sub(budget / 100))
}

/// Greedy by size's plan: whole where it is cheap (`greedy_is_cheap`), whatever the budget, since the floors
/// plan can be far worse (a sliding window stacks every buffer on the last); else if done within a quarter of
/// `budget` from `start`, else the ring's where buffers end in the order they start (`ring_plan`), else each
/// buffer at its floor in order of start (`floors_by_start`); the last two take O(n log n), so that the budget
/// holds.
fn first_plan(inst: &Instance, start: Instant, budget: Duration) -> Vec<u64> {
    let deadline = if greedy_is_cheap(inst) { None } else { start.checked_add(budget / 4) };
    greedy_by_size_until(inst, deadline).or_else(|| ring_plan(inst)).unwrap_or_else(|| floors_by_start(inst))
}

/// Best fit's plan where it beats greedy by size's, with its arena. Best fit is only the search's seed, so it
/// gets half the budget: on the largest graphs its two orders alone can take longer than the whole budget.
fn better_heuristic(
    inst: &Instance,
    buffers: &[Buffer],
    alignment: u64,
    greedy: Vec<u64>,
    greedy_arena: u64,
    deadline: Option<Instant>,
) -> Result<(Vec<u64>, u64), PlanError> {
    let Some(best_fit) = best_fit_decreasing_until(inst, deadline) else { return Ok((greedy, greedy_arena)) };
    let best_fit_arena = validate(buffers, &best_fit, alignment)?;
    Ok(if best_fit_arena < greedy_arena { (best_fit, best_fit_arena) } else { (greedy, greedy_arena) })
}

/// The plan of `offsets`, validated, with its bounds.
fn finish(
    buffers: &[Buffer],
    offsets: Vec<u64>,
    lower_bound: u64,
    bound: u64,
    options: &PlanOptions,
    start: Instant,
) -> Result<Plan, PlanError> {
    let arena_bytes = validate(buffers, &offsets, options.alignment)?;
    let best_bound_bytes = bound.max(lower_bound).min(arena_bytes);
    Ok(Plan {
        offsets,
        arena_bytes,
        lower_bound_bytes: lower_bound,
        best_bound_bytes,
        algorithm: options.algorithm,
        seconds: start.elapsed().as_secs_f64(),
        optimal: arena_bytes <= best_bound_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(algorithm: Algorithm) -> PlanOptions {
        PlanOptions { algorithm, ..PlanOptions::default() }
    }

    /// Both heuristics need 13 bytes; 11 (the lower bound) is possible. Found by a random search.
    fn missed_by_the_heuristics() -> [Buffer; 6] {
        [
            Buffer::new(0, 5, 6, 5),
            Buffer::new(1, 0, 3, 5),
            Buffer::new(2, 4, 8, 4),
            Buffer::new(3, 4, 6, 2),
            Buffer::new(4, 2, 5, 2),
            Buffer::new(5, 1, 3, 2),
        ]
    }

    #[test]
    fn every_algorithm_plans_a_small_instance_at_the_lower_bound() {
        // Lower bound 12 (time 3: 4 + 8); a ladder that any sensible planner stacks tightly.
        let buffers =
            [Buffer::new(0, 0, 4, 4), Buffer::new(1, 3, 8, 8), Buffer::new(2, 6, 10, 4), Buffer::new(3, 9, 12, 8)];
        for algorithm in Algorithm::ALL {
            let plan = plan(&buffers, &options(algorithm)).unwrap();
            assert_eq!(plan.lower_bound_bytes, 12);
            assert_eq!(plan.arena_bytes, 12, "{algorithm}");
            assert!(plan.optimal);
            assert_eq!(plan.algorithm, algorithm);
            assert_eq!(validate(&buffers, &plan.offsets, 1).unwrap(), plan.arena_bytes);
        }
    }

    #[test]
    fn exact_and_auto_prove_a_tight_instance_optimal() {
        // Every moment has exactly 5 bytes live, so any plan of 5 bytes is optimal.
        let buffers = [
            Buffer::new(0, 0, 2, 3),
            Buffer::new(1, 2, 4, 3),
            Buffer::new(2, 1, 3, 2),
            Buffer::new(3, 0, 1, 2),
            Buffer::new(4, 3, 4, 2),
        ];
        let exact = plan(&buffers, &options(Algorithm::Exact)).unwrap();
        let auto = plan(&buffers, &options(Algorithm::Auto)).unwrap();
        assert_eq!((exact.arena_bytes, exact.lower_bound_bytes), (5, 5));
        assert!(exact.optimal && auto.optimal && auto.arena_bytes == 5);
    }

    #[test]
    fn exact_and_auto_beat_the_heuristics_where_they_miss() {
        let buffers = missed_by_the_heuristics();
        let arena = |algorithm| plan(&buffers, &options(algorithm)).unwrap();
        assert_eq!(arena(Algorithm::GreedyBySize).arena_bytes, 13);
        assert_eq!(arena(Algorithm::BestFit).arena_bytes, 13);
        for algorithm in [Algorithm::Exact, Algorithm::Auto] {
            let p = arena(algorithm);
            assert_eq!((p.arena_bytes, p.lower_bound_bytes, p.optimal), (11, 11, true), "{algorithm}");
        }
    }

    #[test]
    fn alignment_rounds_sizes_and_bounds() {
        let buffers = [Buffer::new(0, 0, 4, 100), Buffer::new(1, 2, 6, 100)];
        for algorithm in Algorithm::ALL {
            let options = PlanOptions { alignment: 256, ..options(algorithm) };
            let plan = plan(&buffers, &options).unwrap();
            assert!(plan.offsets.iter().all(|o| o % 256 == 0));
            assert_eq!((plan.arena_bytes, plan.lower_bound_bytes), (512, 512), "{algorithm}");
        }
    }

    #[test]
    fn empty_input_is_an_empty_plan() {
        let plan = plan(&[], &PlanOptions::default()).unwrap();
        assert_eq!((plan.arena_bytes, plan.lower_bound_bytes, plan.optimal), (0, 0, true));
    }

    #[test]
    fn bad_input_is_an_error_for_every_algorithm() {
        for algorithm in Algorithm::ALL {
            let o = options(algorithm);
            assert!(matches!(plan(&[Buffer::new(0, 2, 2, 8)], &o), Err(PlanError::EmptyLifetime { id: 0, .. })));
            assert!(matches!(plan(&[Buffer::new(4, 0, 2, 0)], &o), Err(PlanError::ZeroSize { id: 4 })));
            let twice = [Buffer::new(1, 0, 2, 8), Buffer::new(1, 2, 3, 8)];
            assert!(matches!(plan(&twice, &o), Err(PlanError::DuplicateId { id: 1 })));
            let huge = [Buffer::new(0, 0, 2, u64::MAX), Buffer::new(1, 0, 2, 1)];
            assert!(matches!(plan(&huge, &o), Err(PlanError::Overflow { .. })));
            let zero = PlanOptions { alignment: 0, ..o };
            assert!(matches!(plan(&[Buffer::new(0, 0, 2, 8)], &zero), Err(PlanError::ZeroAlignment)));
        }
    }

    #[test]
    fn decide_gives_a_plan_within_the_capacity() {
        let buffers =
            [Buffer::new(0, 0, 4, 4), Buffer::new(1, 3, 8, 8), Buffer::new(2, 6, 10, 4), Buffer::new(3, 9, 12, 8)];
        for algorithm in Algorithm::ALL {
            for capacity in [12, 13, 100] {
                let Decision::Fits(p) = decide(&buffers, capacity, &options(algorithm)).unwrap() else {
                    panic!("{algorithm} at {capacity}: no plan");
                };
                assert!(p.arena_bytes <= capacity, "{algorithm}");
                assert_eq!(validate(&buffers, &p.offsets, 1).unwrap(), p.arena_bytes);
            }
        }
    }

    #[test]
    fn decide_needs_the_search_where_the_heuristics_miss() {
        let buffers = missed_by_the_heuristics();
        for algorithm in [Algorithm::Exact, Algorithm::Auto] {
            let decision = decide(&buffers, 11, &options(algorithm)).unwrap();
            assert!(matches!(decision, Decision::Fits(ref p) if p.arena_bytes == 11), "{algorithm}: {decision:?}");
        }
        for algorithm in [Algorithm::GreedyBySize, Algorithm::BestFit] {
            assert_eq!(decide(&buffers, 12, &options(algorithm)).unwrap(), Decision::Unknown, "{algorithm}");
        }
        // Below the lower bound no plan fits, whatever the algorithm.
        for algorithm in Algorithm::ALL {
            assert_eq!(decide(&buffers, 10, &options(algorithm)).unwrap(), Decision::Infeasible, "{algorithm}");
        }
    }

    #[test]
    fn decide_by_a_heuristic_answers_with_its_plan_whatever_the_budget() {
        // 200 buffers, so that a zero budget stops the bounded greedy pass the search starts from.
        let buffers: Vec<Buffer> = (0..200).map(|i| Buffer::new(i, i % 17, i % 17 + 1 + i % 5, 1 + i % 13)).collect();
        let none = Duration::ZERO;
        for (algorithm, offsets) in [
            (Algorithm::GreedyBySize, crate::greedy_by_size(&buffers, 1).unwrap()),
            (Algorithm::BestFit, crate::best_fit_decreasing(&buffers, 1).unwrap()),
        ] {
            let arena = validate(&buffers, &offsets, 1).unwrap();
            let o = PlanOptions { budget: none, ..options(algorithm) };
            let Decision::Fits(p) = decide(&buffers, arena, &o).unwrap() else { panic!("{algorithm}: no plan") };
            assert_eq!(p.offsets, offsets, "{algorithm}");
            assert_eq!(decide(&buffers, arena - 1, &o).unwrap(), Decision::Unknown, "{algorithm}");
        }
    }

    #[test]
    fn exact_with_no_time_hands_back_its_checked_fallback() {
        // 200 buffers, so that a zero budget stops the bounded passes the fallback tries first.
        let buffers: Vec<Buffer> = (0..200).map(|i| Buffer::new(i, i % 17, i % 17 + 1 + i % 5, 1 + i % 13)).collect();
        let inst = Instance::new(&buffers, 1).unwrap();
        let p = plan(&buffers, &PlanOptions { budget: Duration::ZERO, ..options(Algorithm::Exact) }).unwrap();
        assert_eq!(p.offsets, floors_by_start(&inst));
        assert_eq!(p.arena_bytes, validate(&buffers, &p.offsets, 1).unwrap());
    }

    #[test]
    fn decide_refuses_a_capacity_no_buffer_fits() {
        let buffers = [Buffer::new(0, 0, 4, 100), Buffer::new(7, 2, 6, 300)];
        let o = PlanOptions::default();
        assert!(matches!(decide(&buffers, 0, &o), Err(PlanError::ZeroCapacity)));
        let err = decide(&buffers, 299, &o).unwrap_err();
        assert!(matches!(err, PlanError::CapacityBelowBuffer { id: 7, size: 300, capacity: 299 }), "{err}");
        // Sizes are rounded up to the alignment first.
        let aligned = PlanOptions { alignment: 256, ..o };
        assert!(matches!(decide(&buffers, 511, &aligned), Err(PlanError::CapacityBelowBuffer { size: 512, .. })));
        assert!(matches!(decide(&buffers, 300, &o), Ok(Decision::Infeasible)));
        assert!(matches!(decide(&[Buffer::new(0, 2, 2, 8)], 10, &o), Err(PlanError::EmptyLifetime { .. })));
    }

    #[test]
    fn the_best_bound_lies_between_the_lower_bound_and_the_arena() {
        let buffers = crate::packed_instance(40, 64, 16, 0, 3);
        for algorithm in Algorithm::ALL {
            let p = plan(&buffers, &PlanOptions { budget: Duration::from_millis(200), ..options(algorithm) }).unwrap();
            assert!(p.lower_bound_bytes <= p.best_bound_bytes && p.best_bound_bytes <= p.arena_bytes, "{algorithm}");
            assert_eq!(p.optimal, p.best_bound_bytes == p.arena_bytes, "{algorithm}");
        }
    }

    #[test]
    fn quick_plans_are_valid_and_their_work_grows_as_n_log_n() {
        // Everything live at once: greedy would scan n^2 / 2 pairs, so the floors place it.
        let all_live = |n: u64| (0..n).map(|i| Buffer::new(i, i, 2 * n - i, 512 * (1 + i % 7))).collect::<Vec<_>>();
        let work = |n: u64| {
            let quick = quick_plan(&all_live(n), 512).unwrap();
            assert_eq!(quick.placement, QuickPlacement::FloorsByStart);
            assert_eq!(quick.plan.arena_bytes, quick.plan.lower_bound_bytes, "all live at once: stacked is optimal");
            quick.work
        };
        let (small, large) = (work(20_000), work(200_000));
        let n_log_n = |n: f64| n * n.log2();
        assert!((large as f64) < 1.5 * small as f64 * n_log_n(2e5) / n_log_n(2e4), "{small} then {large}");
        // A sliding window: few overlaps, greedy by size.
        let window: Vec<Buffer> = (0..1000).map(|i| Buffer::new(i, i, i + 4, 1024)).collect();
        let quick = quick_plan(&window, 512).unwrap();
        assert_eq!((quick.placement, quick.plan.arena_bytes), (QuickPlacement::GreedyBySize, 4096));
    }

    #[test]
    fn caches_grown_a_token_at_a_time_by_copy_are_placed_in_order_of_start() {
        // A decode (`benches/kv_decode_trace.py`): per token and layer an activation, the key and value caches
        // each grown by a token (the new one allocated while the one it copies lives), a smaller buffer.
        let (layers, tokens, prompt, unit, activation) = (4usize, 48u64, 128u64, 4096u64, 2u64 << 20);
        let mut buffers: Vec<Buffer> = Vec::new();
        let mut time = 0u64;
        let mut event = |buffers: &mut Vec<Buffer>, alloc: Option<u64>, free: Option<usize>| {
            if let Some(size) = alloc {
                buffers.push(Buffer::new(buffers.len() as u64, time, u64::MAX, size));
            }
            if let Some(done) = free {
                buffers[done].upper = time;
            }
            time += 1;
            buffers.len() - 1
        };
        let mut caches: Vec<usize> = (0..2 * layers).map(|_| event(&mut buffers, Some(prompt * unit), None)).collect();
        for token in 1..=tokens {
            for layer in 0..layers {
                let act = event(&mut buffers, Some(activation), None);
                for cache in &mut caches[2 * layer..2 * layer + 2] {
                    let grown = event(&mut buffers, Some((prompt + token) * unit), None);
                    event(&mut buffers, None, Some(std::mem::replace(cache, grown)));
                }
                let small = event(&mut buffers, Some(activation / 4), None);
                event(&mut buffers, None, Some(act));
                event(&mut buffers, None, Some(small));
            }
        }
        for cache in caches {
            event(&mut buffers, None, Some(cache));
        }
        let quick = quick_plan(&buffers, 512).unwrap();
        let greedy = validate(&buffers, &crate::greedy_by_size(&buffers, 512).unwrap(), 512).unwrap();
        assert_eq!(quick.placement, QuickPlacement::BestFitByStart);
        let bound = quick.plan.lower_bound_bytes as f64;
        assert!(quick.plan.arena_bytes as f64 <= 1.1 * bound, "{} against {bound}", quick.plan.arena_bytes);
        assert!(greedy as f64 > 1.3 * bound, "largest first: {greedy} against {bound}");
    }

    #[test]
    fn a_long_sliding_window_is_planned_round_a_ring_within_the_budget() {
        // Issue 57: 100,000 buffers each live for the next 2,000 starts (2 * 10^8 overlapping pairs), which the
        // floors stacked to 1.999x the bound in the default 5 s.
        let buffers: Vec<Buffer> =
            (0..100_000u64).map(|i| Buffer::new(i, i, i + 2000, 512 * (1 + (i * 7919) % 13))).collect();
        let largest = 13 * 512;
        let quick = quick_plan(&buffers, 512).unwrap();
        assert_eq!(quick.placement, QuickPlacement::Ring);
        assert!(quick.plan.arena_bytes <= quick.plan.lower_bound_bytes + largest);
        let options = PlanOptions { budget: Duration::from_millis(200), alignment: 512, ..PlanOptions::default() };
        let planned = plan(&buffers, &options).unwrap();
        assert!(
            planned.arena_bytes <= planned.lower_bound_bytes + largest,
            "{} against {}",
            planned.arena_bytes,
            planned.lower_bound_bytes
        );
    }

    #[test]
    fn algorithm_names_round_trip() {
        for algorithm in Algorithm::ALL {
            assert_eq!(algorithm.name().parse::<Algorithm>().unwrap(), algorithm);
        }
        assert!("fastest".parse::<Algorithm>().is_err());
    }
}
