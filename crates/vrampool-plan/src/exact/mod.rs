//! The exact search: an anytime branch and bound over canonical placements (see `search.rs`), run part by
//! part under a time budget.
//!
//! For each part it first asks whether the part fits under the lower bound of the whole instance (half the
//! part's time): that is the usual case, even on hard instances, and the bound prunes hardest there. Failing
//! that it bisects on the capacity between the lower bound and the best plan so far. A part is solved when it
//! fits under the lower bound, or when no plan fits one byte below its best.

mod component;
#[cfg(test)]
mod restarts;
mod search;

use std::time::{Duration, Instant};

use crate::bound::lower_bound_of;
use crate::instance::Instance;
use crate::{greedy_by_size, validate, Buffer, PlanError};
use component::{Component, Order};
use search::{fits, Outcome};

/// Parts whose search structures (overlapping pairs plus section memberships) would exceed this many entries
/// are not searched; they keep the seed's plan (or greedy by size's).
const MAX_ENTRIES: u64 = 20_000_000;
/// Nor are parts of more buffers than this: each node of the search scans its group, so one descent costs
/// O(n^2), and the search recurses once per placement.
const MAX_BUFFERS: usize = 20_000;
const STACK_BYTES: usize = 64 << 20;

/// What the exact search found.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactOutcome {
    /// Offsets parallel to the input buffers.
    pub offsets: Vec<u64>,
    /// Whether no plan has a smaller arena: it meets the lower bound, or the search below it was exhausted.
    pub optimal: bool,
    /// Placements tried.
    pub nodes: u64,
}

/// Branch and bound within `budget`, starting from `seed` (offsets of a valid plan, e.g. a heuristic's) when
/// given. Returns the best plan found, never worse than the seed. Without a seed, parts the search could not
/// solve in time fall back to greedy by size.
pub fn exact_search(
    buffers: &[Buffer],
    alignment: u64,
    budget: Duration,
    seed: Option<&[u64]>,
) -> Result<ExactOutcome, PlanError> {
    let start = Instant::now();
    let deadline = start.checked_add(budget).unwrap_or(start + Duration::from_secs(365 * 86_400));
    let inst = Instance::new(buffers, alignment)?;
    if let Some(seed) = seed {
        validate(buffers, seed, alignment)?;
    }
    let target = lower_bound_of((0..inst.len()).map(|i| (inst.lo[i] as u64, inst.hi[i] as u64, inst.size[i])));

    // The search recurses once per placement: it runs on a thread with a stack to match. A thread that cannot
    // be started leaves every part to the fallback.
    let (searched, nodes) = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("vrampool-plan-exact".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, || search_parts(&inst, seed, target, deadline))
            .map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
    .unwrap_or_else(|_| (component::split(&inst).into_iter().map(PartResult::unsearched).collect(), 0));

    // Parts the search did not solve keep the seed's plan, or greedy by size's.
    let mut fallback: Option<Vec<u64>> = seed.map(<[u64]>::to_vec);
    let mut offsets = vec![0u64; inst.len()];
    let mut arenas: Vec<(u64, bool)> = Vec::with_capacity(searched.len());
    for part in searched {
        match part.plan {
            Some((arena, local)) => {
                write_part(&mut offsets, &part.members, local.into_iter());
                arenas.push((arena, part.solved));
            }
            None => {
                if fallback.is_none() {
                    fallback = Some(greedy_by_size(buffers, alignment)?);
                }
                let plan = fallback.as_deref().expect("set above");
                write_part(&mut offsets, &part.members, part.members.iter().map(|&i| plan[i as usize]));
                let arena = part.members.iter().map(|&i| plan[i as usize] + inst.size[i as usize]).max();
                arenas.push((arena.unwrap_or(0), false));
            }
        }
    }
    // Optimal if a part with the largest arena is solved: no plan of that part alone is smaller.
    let arena = arenas.iter().map(|a| a.0).max().unwrap_or(0);
    let optimal = arena <= target || arenas.iter().any(|&(a, solved)| a == arena && solved);
    Ok(ExactOutcome { offsets, optimal, nodes })
}

/// One part's outcome: its buffers (instance indices), its best plan (arena and offsets parallel to
/// `members`) if the search ran, and whether that plan is at the target or proven optimal.
struct PartResult {
    members: Vec<u32>,
    plan: Option<(u64, Vec<u64>)>,
    solved: bool,
}

impl PartResult {
    fn unsearched(members: Vec<u32>) -> Self {
        PartResult { members, plan: None, solved: false }
    }
}

/// Searches every part that needs it, sharing the time left among them. Returns the parts and the nodes.
fn search_parts(inst: &Instance, seed: Option<&[u64]>, target: u64, deadline: Instant) -> (Vec<PartResult>, u64) {
    let part_arena =
        |part: &[u32], plan: &[u64]| part.iter().map(|&i| plan[i as usize] + inst.size[i as usize]).max().unwrap_or(0);
    let needy = |part: &[u32]| seed.is_none_or(|s| part_arena(part, s) > target);
    // Small parts first: they are usually solved at once, and the time they leave goes to the large ones.
    let mut parts = component::split(inst);
    parts.sort_by_key(|p| p.len());
    let mut left = parts.iter().filter(|p| needy(p)).count();
    let mut nodes = 0;
    let mut results = Vec::with_capacity(parts.len());
    for part in parts {
        if !needy(&part) {
            let plan = seed.expect("only seeded parts are not needy");
            let local = part.iter().map(|&i| plan[i as usize]).collect();
            results.push(PartResult { plan: Some((part_arena(&part, plan), local)), members: part, solved: true });
            continue;
        }
        let now = Instant::now();
        let part_deadline = now + deadline.saturating_duration_since(now) / left.max(1) as u32;
        left -= 1;
        if part.len() > MAX_BUFFERS || component::cost(inst, &part) > MAX_ENTRIES {
            results.push(PartResult::unsearched(part));
            continue;
        }
        let comp = Component::new(inst, &part);
        let incumbent = seed.map(|s| (part_arena(&part, s), comp.members.iter().map(|&i| s[i as usize]).collect()));
        let (plan, solved) = solve_part(&comp, target, incumbent, part_deadline, &mut nodes);
        results.push(PartResult { members: comp.members, plan, solved });
    }
    (results, nodes)
}

fn write_part(offsets: &mut [u64], members: &[u32], values: impl Iterator<Item = u64>) {
    for (&i, v) in members.iter().zip(values) {
        offsets[i as usize] = v;
    }
}

/// Solves one part. First: does it fit under `target` (the lower bound of the whole instance)? Half the time
/// goes to that question. Then a bisection on the capacity between the target and the best plan so far, each
/// probe with a share of what is left. Returns the best plan (arena, local offsets) and whether it is solved:
/// at most `target`, or proven optimal for the part.
fn solve_part(
    part: &Component,
    target: u64,
    incumbent: Option<(u64, Vec<u64>)>,
    deadline: Instant,
    nodes: &mut u64,
) -> (Option<(u64, Vec<u64>)>, bool) {
    let arena = |plan: &[u64]| plan.iter().zip(&part.size).map(|(o, s)| o + s).max().unwrap_or(0);
    let mut best = incumbent;
    if best.as_ref().is_some_and(|b| b.0 <= target) {
        return (best, true);
    }
    let ranks: Vec<Vec<u32>> = ORDERS.iter().map(|&o| part.ranking(o)).collect();
    let now = Instant::now();
    let halfway = now + deadline.saturating_duration_since(now) / 2;
    // Capacities up to `infeasible` are proven too small; `low` is where the bisection looks next.
    let mut infeasible = None::<u64>;
    match probe(part, &ranks, target, halfway, nodes) {
        Outcome::Fits(plan) => return (Some((arena(&plan), plan)), true),
        Outcome::Infeasible => infeasible = Some(target),
        Outcome::TimedOut => {}
    }
    if best.is_none() {
        // Any plan at all, to bisect below.
        match probe(part, &ranks, u64::MAX, deadline, nodes) {
            Outcome::Fits(plan) => best = Some((arena(&plan), plan)),
            _ => return (None, false),
        }
    }
    let mut low = target + 1;
    loop {
        let high = best.as_ref().map_or(u64::MAX, |b| b.0 - 1);
        if low > high {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        // Probe the middle with a quarter of the time left (all of it once the range is one value).
        let capacity = low + (high - low) / 2;
        let share = if low == high { 1 } else { 4 };
        let until = now + deadline.saturating_duration_since(now) / share;
        match probe(part, &ranks, capacity, until, nodes) {
            Outcome::Fits(plan) => best = Some((arena(&plan), plan)),
            Outcome::Infeasible => {
                infeasible = infeasible.max(Some(capacity));
                low = capacity + 1;
            }
            // Unproven: look higher, which is where plans are found quickly.
            Outcome::TimedOut => low = capacity + 1,
        }
    }
    let solved = best.as_ref().is_some_and(|b| b.0 <= target || infeasible.is_some_and(|i| i + 1 >= b.0));
    (best, solved)
}

/// The orders the search takes turns with.
const ORDERS: [Order; 6] = [Order::Twa, Order::Taw, Order::Wat, Order::Size, Order::Time, Order::Area];

/// Does the part fit under `capacity`? A search with one order can stall in a bad early choice that another
/// order avoids, so the orders take turns with node limits that double each round (restarts), until `until`.
/// Each search is complete, so one that ends without a plan proves there is none.
fn probe(part: &Component, ranks: &[Vec<u32>], capacity: u64, until: Instant, nodes: &mut u64) -> Outcome {
    let mut limit = 4_096u64;
    loop {
        for rank in ranks {
            let start = *nodes;
            match fits(part, rank, capacity, until, nodes, start.saturating_add(limit)) {
                Outcome::TimedOut if Instant::now() < until => {}
                outcome => return outcome,
            }
        }
        limit = limit.saturating_mul(2);
    }
}
