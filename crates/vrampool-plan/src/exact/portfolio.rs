//! The runs a large part gets before the lowering (`large.rs`): lowest floor first (`floors/`) with each
//! tie-break, and best fit in order of start with the gap chosen by the neighbours' ends or with a few first
//! phases, each in both directions of time (a plan of the mirrored part is one of the part). A run stops
//! as soon as it cannot beat the best plan so far, so the losing ones cost little.
//!
//! Best fit by start is the best plan there is in the budget where the floors pack badly (serving with continuous
//! batching), the more so with the gap chosen by the neighbours' ends (`portfolio/aligned.rs`) rather than by its
//! size alone; and a first phase placed before the rest changes it much: the longest-lived buffers first stack
//! before the short ones fragment the bytes under them (KV caches grown by concatenation, a pipelined step's saved
//! activations), the largest first keep their slots clear of the small ones (the few of a share of the bound, a
//! step's logits, clear of the many caches). Which split wins, and in which direction of time, differs
//! from graph to graph and none wins on most, so each kind of run tries its variants in turn, and the two kinds
//! share the time (`next_kind`). When all have run, if a floor run's plan is the best, the squeaky wheel
//! (`portfolio/squeaky.rs`) runs lowest floor first again from it, with the buffers that ended highest placed first
//! (where the floors' best is 1-2% above the bound, on the random instances, it lowered 5 of the 13 plans of seeds
//! 1-6 that were above the bound).

use std::time::Instant;

mod aligned;
mod first_phases;
mod floor_runs;
mod squeaky;

use super::placed::{arena_of, fit_before, Placed};
use crate::floors::lowest_floor_first;
use crate::instance::Instance;
use crate::order::Order;
use crate::trace::{Stage, Stages, Trace};
use aligned::aligned_fit_before;
pub(crate) use first_phases::{fit_order, First};
use floor_runs::FLOOR_RUNS;
use squeaky::{squeaky_wheel, PATIENCE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    Floors(Order),
    Fit(First),
    /// Best fit by start with the gap chosen by the neighbours' ends (`portfolio/aligned.rs`), among the gaps at
    /// most this many times the smallest, with a first phase.
    Aligned(u64, First),
}

impl Run {
    /// The stages the run belongs to.
    fn stages(self) -> Vec<Stage> {
        let first = |first: First| match first {
            First::Nothing => vec![],
            _ => vec![Stage::FirstPhases],
        };
        match self {
            Run::Floors(_) => vec![Stage::FloorRuns],
            Run::Fit(f) => first(f),
            Run::Aligned(_, f) => [vec![Stage::Aligned], first(f)].concat(),
        }
    }
}

/// Best fit by start's runs: the gaps chosen by the neighbours' ends first, backwards first (the best plans of
/// serving with continuous batching), with factors 4 and 16 both ways, then 8 and 12 backwards (which factor packs
/// best varies from seed to seed by up to 1% of the bound, with no trend); then the same with the buffers of 2% of
/// the bound or more first, factors 16 and 4 (on serving seeds 1-24, factor 16 with them first packs below best
/// fit and factor 16 without them, both ways, on 13 seeds, by up to 4% of the bound); then the splits, backwards
/// first (they win more often that way). Plain best fit by start, the allocator's replay, is not among them: it
/// changed no arena but pipelined-seed-5's, by that instance's timing (`docs/perf-log.md`, the planner
/// ablation of 14 stages).
const FIT_RUNS: [(Run, bool); 18] = {
    use First::*;
    use Run::{Aligned, Fit};
    [
        (Aligned(4, Nothing), true),
        (Aligned(4, Nothing), false),
        (Aligned(16, Nothing), true),
        (Aligned(16, Nothing), false),
        (Aligned(8, Nothing), true),
        (Aligned(12, Nothing), true),
        (Aligned(16, Bytes(20)), true),
        (Aligned(16, Bytes(20)), false),
        (Aligned(4, Bytes(20)), true),
        (Aligned(4, Bytes(20)), false),
        (Fit(Longest(50)), true),
        (Fit(Largest(5)), true),
        (Fit(Largest(20)), true),
        (Fit(Largest(20)), false),
        (Fit(Longest(20)), false),
        (Fit(Longest(5)), true),
        (Fit(Largest(5)), false),
        (Fit(Longest(20)), true),
    ]
};

/// One kind of run: its runs in turn, where it has got to, the time it has taken and the best arena it found.
struct Queue {
    runs: Vec<(Run, bool)>,
    next: usize,
    seconds: f64,
    best: u64,
}

impl Queue {
    /// The runs of `runs` whose stages run.
    fn new(runs: &[(Run, bool)], stages: Stages) -> Queue {
        let runs = runs.iter().copied().filter(|&(run, _)| run.stages().into_iter().all(|s| stages.has(s))).collect();
        Queue { runs, next: 0, seconds: 0.0, best: u64::MAX }
    }

    fn done(&self) -> bool {
        self.next == self.runs.len()
    }
}

/// The kind that runs next: the kinds share the time, and the one that found the better plan gets two thirds
/// of it (which kind wins differs from graph to graph, and by far: on serving graphs no floor run beats best
/// fit, on the random instance no best fit comes near the floors); lowest floor first on a tie.
fn next_kind(floors: &Queue, fits: &Queue) -> Option<usize> {
    match (floors.done(), fits.done()) {
        (true, true) => None,
        (true, false) => Some(1),
        (false, true) => Some(0),
        (false, false) => {
            let weight = |own: &Queue, other: &Queue| if own.best < other.best { 1.0 } else { 2.0 };
            Some(usize::from(fits.seconds * weight(fits, floors) < floors.seconds * weight(floors, fits)))
        }
    }
}

/// The share of the part's time within which a run may begin (one begun may go on to the deadline). On serving
/// with continuous batching, where every run comes close to the best, the runs alone can take all of the time,
/// and the bands, which take their best plan down by 0.5-1.7% of the bound, would get none.
const RUNS_SHARE: (u32, u32) = (2, 3);

/// What the runs found: the best plan and the one it replaced.
pub(crate) struct Runs {
    pub best: Option<Placed>,
    pub runner_up: Option<Placed>,
}

/// The best plan of `order` (the part, sorted by start) the runs find before `deadline` that beats `ceiling`,
/// stopping early at one that meets `target`; no run begins after `RUNS_SHARE` of the time. The runs are those of
/// `trace`'s stages, which hears of each better plan.
pub(crate) fn best_of_runs(
    inst: &Instance,
    order: &[u32],
    target: u64,
    ceiling: u64,
    deadline: Instant,
    trace: &mut Trace,
) -> Runs {
    let mirrored = inst.mirrored();
    let (mut best, mut runner_up): (Option<Placed>, Option<Placed>) = (None, None);
    // The last floor run kept (the best of those kept, its arena the floors' queue's best): tie-break, direction
    // of time and offsets (parallel to `order`).
    let mut best_floors: Option<(Order, bool, Vec<u64>)> = None;
    let mut kinds = [Queue::new(&FLOOR_RUNS, trace.stages), Queue::new(&FIT_RUNS, trace.stages)];
    let now = Instant::now();
    let last_start = now + deadline.saturating_duration_since(now) * RUNS_SHARE.0 / RUNS_SHARE.1;
    while let Some(kind) = next_kind(&kinds[0], &kinds[1]) {
        let beat = best.as_ref().map_or(ceiling, |b| b.1).saturating_sub(1);
        if beat < target || Instant::now() >= last_start {
            break;
        }
        let queue = &mut kinds[kind];
        let (run, backwards) = queue.runs[queue.next];
        queue.next += 1;
        let began = Instant::now();
        let timeline = if backwards { &mirrored } else { inst };
        let plan = match run {
            Run::Floors(tie_break) => lowest_floor_first(timeline, order, tie_break, beat, deadline).map(|offsets| {
                let plan = order.iter().copied().zip(offsets.iter().copied()).collect::<Vec<_>>();
                best_floors = Some((tie_break, backwards, offsets));
                plan
            }),
            Run::Fit(first) => fit_before(timeline, &fit_order(timeline, order, first), beat, deadline).0,
            Run::Aligned(factor, first) => {
                aligned_fit_before(timeline, &fit_order(timeline, order, first), factor, beat, deadline).0
            }
        };
        queue.seconds += began.elapsed().as_secs_f64();
        if let Some(plan) = plan {
            let arena = arena_of(inst, &plan);
            queue.best = arena;
            trace.found(arena);
            runner_up = best.replace((plan, arena));
        }
    }
    // The runs are done (or the time is up): the squeaky wheel on the best floor run, if it has its turn.
    let turn = wheel_s_turn(best.as_ref().map(|b| b.1), kinds[0].best, target);
    if let Some((tie_break, backwards, offsets)) = best_floors.filter(|_| turn) {
        let timeline = if backwards { &mirrored } else { inst };
        let floors_best = (offsets, kinds[0].best);
        // The wheel's plans beat the floors' best, which is the best of all when it has its turn.
        if let Some((offsets, arena)) = trace
            .stages
            .has(Stage::Squeaky)
            .then(|| squeaky_wheel(timeline, order, tie_break, floors_best, (target, PATIENCE), deadline))
            .flatten()
        {
            trace.found(arena);
            runner_up = best.replace((order.iter().copied().zip(offsets).collect(), arena));
        }
    }
    Runs { best, runner_up }
}

/// Whether the squeaky wheel runs, given the best arena of all runs and of the floor runs: only where a floor
/// run's plan is the best and above the bound. Where best fit's is the better (serving), the wheel's runs must
/// beat it from a worse plan; there they took 1.1-1.5 s and beat nothing, and the bands are owed that time.
fn wheel_s_turn(best: Option<u64>, floors_best: u64, target: u64) -> bool {
    best.is_some_and(|best| best > target && best == floors_best)
}

#[cfg(test)]
mod tests;
