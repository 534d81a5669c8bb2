//! The exact search: an anytime branch and bound over canonical placements (see `search.rs`), run part by
//! part under a time budget.
//!
//! For each part it first asks whether the part fits under the lower bound of the whole instance (a quarter of
//! the part's time): that is the usual case, even on hard instances, and the bound prunes hardest there.
//! Failing that it descends from the best plan so far with many short tries under varied orders. A part is
//! solved when it fits under the lower bound, or when no plan fits one step below its best (arenas come in
//! steps of the sizes' greatest common divisor).

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

/// Solves one part. First: does it fit under `target` (the lower bound of the whole instance)? A quarter of
/// the time goes to that question. Then a descent below the best plan so far (see `descend`). Returns the best
/// plan (arena, local offsets) and whether it is solved: at most `target`, or proven optimal for the part.
fn solve_part(
    part: &Component,
    target: u64,
    incumbent: Option<(u64, Vec<u64>)>,
    deadline: Instant,
    nodes: &mut u64,
) -> (Option<(u64, Vec<u64>)>, bool) {
    if incumbent.as_ref().is_some_and(|b| b.0 <= target) {
        return (incumbent, true);
    }
    let ranks: Vec<Vec<u32>> = ORDERS.iter().map(|&o| part.ranking(o)).collect();
    let now = Instant::now();
    let quarter = now + deadline.saturating_duration_since(now) / 4;
    let mut infeasible = None::<u64>;
    match probe(part, &ranks, target, quarter, nodes) {
        Outcome::Fits(plan) => return (Some((arena_of(part, &plan), plan)), true),
        Outcome::Infeasible => infeasible = Some(target),
        Outcome::TimedOut => {}
    }
    let mut best = match incumbent {
        Some(best) => best,
        // Any plan at all, to descend from.
        None => match probe(part, &ranks, u64::MAX, deadline, nodes) {
            Outcome::Fits(plan) => (arena_of(part, &plan), plan),
            _ => return (None, false),
        },
    };
    let unit = unit_of(part);
    let infeasible = descend(part, &ranks, unit, (target, infeasible), &mut best, deadline, nodes);
    let solved = best.0 <= target || infeasible.is_some_and(|i| i + unit >= best.0);
    (Some(best), solved)
}

fn arena_of(part: &Component, plan: &[u64]) -> u64 {
    plan.iter().zip(&part.size).map(|(o, s)| o + s).max().unwrap_or(0)
}

/// The step between arenas: a canonical plan's arena is a sum of sizes, so a multiple of their greatest common
/// divisor, and so is the optimum.
fn unit_of(part: &Component) -> u64 {
    part.size.iter().fold(0, |g, &s| gcd(g, s)).max(1)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Node limit of the descent's shortest tries; Luby's sequence multiplies it.
const TRY_NODES: u64 = 1_000;
/// Tries in a row that time out before the descent moves its next capacity halfway up towards the best plan.
const PATIENCE: u32 = 12;
/// Random swaps of neighbouring ranks in each jittered order.
const SWAPS: usize = 20;

/// Lowers `best` until `deadline` with short searches (tries) below it, each with its own order and node
/// limit. `bounds` are the lower bound and the highest capacity proven infeasible so far, if any; returns
/// the latter, updated. Capacities tried are multiples of `unit` (see `unit_of`).
///
/// A try that times out proves nothing. On D, MiniMalloc's hardest challenging instance, a try that fits
/// usually does so within a few thousand nodes, and one in five tries of 20,000 nodes at 1,010 units fits. So
/// the answer is many short tries, each under another order, rather than one long search: the first tries
/// take the fixed orders, the others randomly jittered copies of MiniMalloc's TWA. The capacity tried starts
/// halfway between the lower bound and the best plan, and moves halfway up only after `PATIENCE` misses in a
/// row; so a few unlucky tries do not rule out a range for good, as the bisection this replaced did. Node
/// limits follow Luby's sequence, so that now and then a try runs long enough to prove its capacity
/// infeasible (each search is complete).
fn descend(
    part: &Component,
    ranks: &[Vec<u32>],
    unit: u64,
    (target, mut infeasible): (u64, Option<u64>),
    best: &mut (u64, Vec<u64>),
    deadline: Instant,
    nodes: &mut u64,
) -> Option<u64> {
    // ORDERS starts with TWA.
    let twa = &ranks[0];
    // Capacities worth a try are the multiples of `unit` from `low` to just below the best plan.
    let mut low = infeasible.map_or(target, |i| i + 1).div_ceil(unit) * unit;
    let (mut gap, mut misses) = (u64::MAX, 0);
    for turn in 1u64.. {
        let high = (best.0 - 1) / unit * unit;
        if high < low || Instant::now() >= deadline {
            break;
        }
        gap = gap.min((high - low) / unit / 2);
        let capacity = high - gap * unit;
        let jittered;
        let rank = match ranks.get(turn as usize - 1) {
            Some(fixed) => fixed,
            None => {
                jittered = jitter(twa, turn, SWAPS);
                &jittered
            }
        };
        let limit = nodes.saturating_add(TRY_NODES.saturating_mul(luby(turn)));
        match fits(part, rank, capacity, deadline, nodes, limit) {
            Outcome::Fits(plan) => {
                *best = (arena_of(part, &plan), plan);
                misses = 0;
            }
            Outcome::Infeasible => {
                infeasible = infeasible.max(Some(capacity));
                low = capacity + unit;
            }
            Outcome::TimedOut => {
                misses += 1;
                if misses == PATIENCE {
                    (gap, misses) = (gap / 2, 0);
                }
            }
        }
    }
    infeasible
}

/// Luby's restart sequence: 1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8, ... (`i` from 1).
fn luby(mut i: u64) -> u64 {
    loop {
        // The smallest k with i <= 2^k - 1.
        let k = 64 - i.leading_zeros() as u64;
        if i == (1 << k) - 1 {
            return 1 << (k - 1);
        }
        i -= (1 << (k - 1)) - 1;
    }
}

/// `rank` with `swaps` random swaps of neighbouring ranks (xorshift64 from `seed`).
pub(crate) fn jitter(rank: &[u32], seed: u64, swaps: usize) -> Vec<u32> {
    let n = rank.len();
    let mut by = vec![0u32; n];
    for (i, &r) in rank.iter().enumerate() {
        by[r as usize] = i as u32;
    }
    if n > 1 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..swaps {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = (state % (n as u64 - 1)) as usize;
            by.swap(k, k + 1);
        }
    }
    let mut varied = vec![0u32; n];
    for (r, &i) in by.iter().enumerate() {
        varied[i as usize] = r as u32;
    }
    varied
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luby_sequence_starts_as_published() {
        let first: Vec<u64> = (1..=15).map(luby).collect();
        assert_eq!(first, [1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8]);
    }

    #[test]
    fn a_jittered_order_is_another_ranking_of_the_same_buffers() {
        let rank: Vec<u32> = (0..50).rev().collect();
        let varied = jitter(&rank, 7, SWAPS);
        assert_ne!(varied, rank);
        let mut sorted = varied.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
        // Only neighbouring ranks swap, so no buffer moves further than the number of swaps.
        assert!(rank.iter().zip(&varied).all(|(&a, &b)| a.abs_diff(b) as usize <= SWAPS));
        assert_eq!(jitter(&[0], 7, SWAPS), [0]);
    }

    #[test]
    fn arenas_step_by_the_sizes_greatest_common_divisor() {
        let buffers = [Buffer::new(0, 0, 2, 3072), Buffer::new(1, 1, 3, 1024), Buffer::new(2, 2, 4, 2048)];
        let inst = Instance::new(&buffers, 1).unwrap();
        assert_eq!(unit_of(&Component::new(&inst, &[0, 1, 2])), 1024);
        let inst = Instance::new(&buffers, 5000).unwrap();
        assert_eq!(unit_of(&Component::new(&inst, &[0, 1, 2])), 5000);
    }
}
