//! The smallest arena of one part within a deadline.
//!
//! Most parts fit under the lower bound, and there the section and level bounds prune hardest; a few percent
//! above the optimum, no search decides anything quickly. So the time does not go to creeping down from the
//! heuristic's plan through that band: at least half the nodes go to the question "does the part fit at the
//! best bound?" (MiniMalloc's round robin, kept going with doubling limits), and the rest to a descent below
//! the best plan, for parts whose optimum lies above the bound. The descent's share shrinks while its tries
//! miss (`descent.rs`): most parts' optimum is the bound, where only the prober ends the search. A
//! capacity proven infeasible raises the bound; the bound's prober then moves up to it.

use std::time::Instant;

use super::component::Component;
use super::descent::Descent;
use super::probe::{orders, Prober};
use super::search::Outcome;
use crate::instance::unit_of_sizes;
use crate::trace::{Stage, Trace};

/// One part's result: its best plan (arena, offsets in local order), if any, and the highest capacity not
/// proven infeasible (a multiple of the part's step, so a lower bound on its optimum).
pub(crate) struct Minimised {
    pub plan: Option<(u64, Vec<u64>)>,
    pub bound: u64,
}

/// Lowers the part's arena until it is at most `target` (the lower bound of the whole instance), proven
/// optimal, or `deadline` comes. `incumbent` is a plan to start from (arena, local offsets). `trace` says whether
/// the descent runs, and hears of each better plan.
pub(crate) fn minimise(
    part: &Component,
    target: u64,
    incumbent: Option<(u64, Vec<u64>)>,
    deadline: Instant,
    nodes: &mut u64,
    trace: &mut Trace,
) -> Minimised {
    let unit = unit_of(part);
    let mut low = part.load().div_ceil(unit) * unit;
    if incumbent.as_ref().is_some_and(|b| b.0 <= target) {
        return Minimised { plan: incumbent, bound: low };
    }
    let orders = orders(part);
    let stages = trace.stages;
    let mut best = match incumbent {
        Some(best) => best,
        // Any plan at all, to descend from.
        None => match Prober::new(part, u64::MAX, stages).run(part, &orders, deadline, nodes) {
            Outcome::Fits(plan) => {
                let arena = arena_of(part, &plan);
                trace.found(arena);
                (arena, plan)
            }
            _ => return Minimised { plan: None, bound: low },
        },
    };
    // A plan at `goal` is at most `target`: arenas come in steps of `unit`.
    let goal = target / unit * unit;
    let mut bound = Prober::new(part, goal.max(low), stages);
    let mut descent = Descent::new();
    let (mut bound_nodes, mut descent_nodes) = (0u64, 0u64);
    while best.0 > goal && best.0 > low && Instant::now() < deadline {
        let before = *nodes;
        match descent.capacity(unit, best.0, bound.capacity).filter(|_| stages.has(Stage::Descent)) {
            Some(capacity) if descent_nodes.saturating_mul(descent.share()) < bound_nodes => {
                let outcome = descent.try_at(part, &orders, capacity, deadline, nodes);
                descent_nodes += *nodes - before;
                match outcome {
                    Outcome::Fits(plan) => best = (arena_of(part, &plan), plan),
                    Outcome::Infeasible => low = capacity + unit,
                    Outcome::TimedOut => {}
                }
            }
            _ => {
                let outcome = bound.step(part, &orders, deadline, nodes);
                bound_nodes += *nodes - before;
                match outcome {
                    Outcome::Fits(plan) => best = (arena_of(part, &plan), plan),
                    Outcome::Infeasible => low = bound.capacity + unit,
                    Outcome::TimedOut => {}
                }
            }
        }
        trace.found(best.0);
        if bound.capacity < low {
            bound = Prober::new(part, low, stages);
        }
    }
    Minimised { bound: low.min(best.0), plan: Some(best) }
}

pub(crate) fn arena_of(part: &Component, plan: &[u64]) -> u64 {
    plan.iter().zip(&part.size).map(|(o, s)| o + s).max().unwrap_or(0)
}

/// The step between arenas: a canonical plan's arena is a sum of sizes, so a multiple of their greatest common
/// divisor, and so is the optimum.
pub(crate) fn unit_of(part: &Component) -> u64 {
    unit_of_sizes(part.size.iter().copied())
}
