//! Large parts (thousands of buffers, up to the whole of a training step or of a decoding run).
//!
//! Before the sweeps, cheaper runs (`portfolio.rs`: lowest floor first and best fit by start, with several
//! tie-breaks and first phases, in both directions of time) take the time while they beat the best so far: on
//! most graphs one of them ends within a few thousandths of the bound, where the windows would begin a step
//! above. Where sizes are ragged, best fit decreasing on size classes (`classes.rs`) goes first, as a plan
//! beside theirs. The time they leave goes first to lowering the peaks of the two best plans, the incumbent's
//! among them where fewer than two runs beat it, and of the plan on classes where it is lower still
//! (`neighbourhood.rs`; where a floor run's plan led, the squeaky wheel shakes a plan the bands cannot lower),
//! then to the sweeps. Best fit's pace, measured in the runs, paces the sweeps. Each sweep, with windows twice
//! as wide as the last, stops as soon as it cannot beat the best so far.

use std::time::Instant;

use super::classes::best_fit_in_classes;
use super::neighbourhood::lower_peaks;
use super::placed::Placed;
use super::portfolio::{best_of_runs, Runs};
use super::windows;
use crate::floors::squeaky_wheel;
use crate::instance::Instance;
use crate::trace::{Stage, Trace};

/// Runs in a row that do not beat the lowered plan before the squeaky wheel gives up shaking it: a lowered plan
/// is harder to beat than a floor run's (on the random instance of 30,000 buffers the wheel's first better
/// plan came after more than 8).
const SHAKE_PATIENCE: usize = 32;

/// The best plan of the part found before `deadline`, the runs', the lowered plans' or the sweeps', or else
/// `incumbent` (the part's plan so far, if any, whose arena the runs must beat; it is lowered as theirs are):
/// offsets (instance index, offset) and the arena; `None` if there is no incumbent and nothing was found in
/// time. `target` is the lower bound. `trace` says which stages run, and hears of each better plan.
pub(crate) fn search_large(
    inst: &Instance,
    part: &[u32],
    target: u64,
    incumbent: Option<Placed>,
    deadline: Instant,
    nodes: &mut u64,
    trace: &mut Trace,
) -> Option<Placed> {
    let order = inst.by_start(part.iter().copied());
    let ceiling = incumbent.as_ref().map_or(u64::MAX, |p| p.1);
    let stages = trace.stages;
    // Best fit on size classes first (cheap, and the runs may leave no time after them): a plan to lower beside
    // theirs, not one they must beat (`classes.rs`). A quarter of the time at most: where every buffer meets
    // thousands of others (a staircase of 60,000), best fit alone takes longer than the budget.
    let now = Instant::now();
    let classes_until = now + deadline.saturating_duration_since(now) / 4;
    let in_classes = (stages.has(Stage::Classes))
        .then(|| best_fit_in_classes(inst, part, classes_until, stages.has(Stage::Settle)))
        .flatten()
        .filter(|p| p.1 < ceiling);
    in_classes.iter().for_each(|p| trace.found(p.1));
    if in_classes.as_ref().is_some_and(|p| p.1 <= target) {
        return in_classes;
    }
    let Runs { best, runner_up, fit_seconds, floors_lead } =
        best_of_runs(inst, &order, target, ceiling, deadline, trace);
    // Where a floor run's plan led, a plan the bands cannot lower is shaken by the squeaky wheel with its
    // tie-break.
    let shake = |plan: &Placed| {
        let (tie_break, mirrored) = floors_lead.as_ref().filter(|_| stages.has(Stage::Shake))?;
        let timeline = mirrored.as_ref().unwrap_or(inst);
        let offsets = plan.0.iter().map(|&(_, o)| o).collect();
        // Half the time left at most, so that the bands go on where the wheel finds nothing.
        let now = Instant::now();
        let until = now + deadline.saturating_duration_since(now) / 2;
        let (offsets, arena) =
            squeaky_wheel(timeline, &order, *tie_break, (offsets, plan.1), (target, SHAKE_PATIENCE), until)?;
        Some((order.iter().copied().zip(offsets).collect(), arena))
    };
    // The two best plans are lowered (the incumbent is one of them where fewer than two runs beat it), and
    // best fit on size classes where it is below both.
    let mut plans: Vec<Placed> = best.into_iter().chain(runner_up).collect();
    if plans.len() < 2 {
        plans.extend(incumbent);
    }
    let lowest = plans.iter().map(|p| p.1).min().unwrap_or(u64::MAX);
    plans.extend(in_classes.filter(|p| p.1 < lowest));
    let best = if stages.has(Stage::Lowering) {
        (!plans.is_empty()).then(|| lower_peaks(inst, &order, plans, target, deadline, (nodes, trace), shake))
    } else {
        plans.into_iter().min_by_key(|p| p.1)
    };
    let fit_seconds = fit_seconds.filter(|_| stages.has(Stage::Windows));
    let Some(fit_seconds) = fit_seconds.filter(|_| best.as_ref().is_none_or(|b| b.1 > target)) else {
        return best;
    };
    windows::sweeps(inst, &order, target, (best, ceiling), fit_seconds, deadline, (nodes, trace))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::exact::checked;
    use crate::exact::placed::{arena_of, fit_before};
    use crate::random_instance;

    /// The incumbent is one of the plans lowered, and what comes back is never above it: with no time at all, it
    /// comes back as it is; with time, lower or as low.
    #[test]
    fn the_sweeps_hand_back_the_incumbent_or_a_plan_below_it() {
        let buffers = random_instance(5_000, 3);
        let inst = Instance::new(&buffers, 1).unwrap();
        let part: Vec<u32> = (0..inst.len() as u32).collect();
        let order = inst.by_start(part.iter().copied());
        let incumbent = fit_before(&inst, &order, u64::MAX, Instant::now() + Duration::from_secs(60)).0.unwrap();
        let incumbent = (incumbent.clone(), arena_of(&inst, &incumbent));
        let (target, mut nodes) = (inst.lower_bound(), 0);
        assert!(incumbent.1 > target);
        let now = Instant::now();
        assert_eq!(
            search_large(&inst, &part, target, Some(incumbent.clone()), now, &mut nodes, &mut Trace::all()),
            Some(incumbent.clone())
        );
        assert_eq!(search_large(&inst, &part, target, None, now, &mut nodes, &mut Trace::all()), None);
        let soon = Instant::now() + Duration::from_secs(2);
        let (plan, arena) =
            search_large(&inst, &part, target, Some(incumbent.clone()), soon, &mut nodes, &mut Trace::all()).unwrap();
        assert_eq!(checked(&buffers, &plan).1, arena);
        assert!(arena <= incumbent.1);
    }
}
