//! Large parts (thousands of buffers, up to the whole of a training step or of a decoding run).
//!
//! Cheaper runs first (`portfolio.rs`: lowest floor first and best fit by start, with several tie-breaks and
//! first phases, in both directions of time) take the time while they beat the best so far: on most graphs
//! one of them ends within a few thousandths of the bound. Where sizes are ragged, best fit decreasing on size
//! classes (`classes.rs`) goes first, as a plan beside theirs. The time they leave goes to lowering the peaks
//! of the two best plans, the incumbent's among them where fewer than two runs beat it, and of the plan on
//! classes where it is lower still (`lowering.rs`).

use std::time::Instant;

use super::classes::best_fit_in_classes;
use super::lowering::lower_peaks;
use super::placed::Placed;
use super::portfolio::{best_of_runs, Runs};
use crate::instance::Instance;
use crate::trace::{Stage, Trace};

/// The best plan of the part found before `deadline`, the runs' or the lowered plans', or else
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
    let Runs { best, runner_up } = best_of_runs(inst, &order, target, ceiling, deadline, trace);
    // The two best plans are lowered (the incumbent is one of them where fewer than two runs beat it), and
    // best fit on size classes where it is below both.
    let mut plans: Vec<Placed> = best.into_iter().chain(runner_up).collect();
    if plans.len() < 2 {
        plans.extend(incumbent);
    }
    let lowest = plans.iter().map(|p| p.1).min().unwrap_or(u64::MAX);
    plans.extend(in_classes.filter(|p| p.1 < lowest));
    if stages.has(Stage::Lowering) {
        (!plans.is_empty()).then(|| lower_peaks(inst, &order, plans, target, deadline, (nodes, trace)))
    } else {
        plans.into_iter().min_by_key(|p| p.1)
    }
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
    fn the_search_hands_back_the_incumbent_or_a_plan_below_it() {
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
