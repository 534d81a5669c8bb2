//! The exact search: an anytime branch and bound over canonical placements (see `search.rs`), run part by
//! part under a time budget, either to minimise the arena (`exact_search`, see `minimise.rs`) or to decide
//! one capacity (`exact_decide`). Both search each capacity with MiniMalloc's round robin of orders
//! (`probe.rs`). A part is solved when it fits under the lower bound, or when no plan fits one step below its
//! best (arenas come in steps of the sizes' greatest common divisor).

mod classes;
mod component;
mod deepest_boost;
mod descent;
mod jitter;
mod large;
mod lowering;
mod minimise;
mod placed;
mod portfolio;
mod probe;
#[cfg(test)]
mod restarts;
mod search;

use std::time::{Duration, Instant};

use crate::floors::floors_by_start;
use crate::greedy::{best_fit_decreasing_until, greedy_by_size_until};
use crate::instance::Instance;
use crate::trace::{Stages, Trace};
use crate::{validate, Buffer, PlanError};
pub(crate) use component::split;
use component::write_part;
use component::Component;
use minimise::minimise;
use probe::{orders, Prober};
use search::{Outcome, Ranking};

/// Parts whose search structures (overlapping pairs plus section memberships) would exceed this many entries
/// are not searched whole (`decide` answers unknown for them).
const MAX_ENTRIES: u64 = 20_000_000;
/// Nor are parts of more buffers than this: each node of the search scans its group, so one descent costs
/// O(n^2), and the search recurses once per placement.
const MAX_BUFFERS: usize = 20_000;
/// Parts of more buffers than this are planned as large parts (`large.rs`): a round robin over thousands
/// of buffers at once gets nowhere in a budget of seconds.
const WINDOWS_ABOVE: usize = 4_000;
const STACK_BYTES: usize = 64 << 20;

/// What the exact search found.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactOutcome {
    /// Offsets parallel to the input buffers.
    pub offsets: Vec<u64>,
    /// Whether no plan has a smaller arena: it meets the lower bound, or the search below it was exhausted.
    pub optimal: bool,
    /// The best lower bound known on the optimum: the most bytes live at once, or more where the search
    /// proved that a part fits in no smaller arena.
    pub bound_bytes: u64,
    /// Placements tried.
    pub nodes: u64,
}

/// Branch and bound within `budget`, starting from `seed` (offsets of a valid plan, e.g. a heuristic's) when
/// given. Returns the best plan found, never worse than the seed. Without a seed, parts the search could not
/// solve in time fall back to greedy by size (see [`fallback_plan`]).
pub fn exact_search(
    buffers: &[Buffer],
    alignment: u64,
    budget: Duration,
    seed: Option<&[u64]>,
) -> Result<ExactOutcome, PlanError> {
    let deadline = deadline_after(Instant::now(), budget);
    let inst = Instance::new(buffers, alignment)?;
    let start = match seed {
        Some(seed) => {
            validate(buffers, seed, alignment)?;
            Start::Seed(seed)
        }
        None => Start::Fallback(fallback_plan(&inst, deadline)),
    };
    Ok(search_instance(&inst, deadline, start, &mut Trace::all()))
}

/// What the search starts from: a valid plan in either case.
pub(crate) enum Start<'a> {
    /// A plan to beat: its parts at the lower bound are kept, and the others' searches start below them.
    Seed(&'a [u64]),
    /// A plan kept only for the parts the search leaves unsolved.
    Fallback(Vec<u64>),
}

/// The plan of the parts an unseeded search may leave: greedy by size's or else best fit's, each if done in an
/// eighth of the time to `deadline` (where buffers overlap by the ten thousand, either can take longer than the
/// budget), or else every buffer at its floor by start.
pub(crate) fn fallback_plan(inst: &Instance, deadline: Instant) -> Vec<u64> {
    let eighth = |now: Instant| Some(now + deadline.saturating_duration_since(now) / 8);
    greedy_by_size_until(inst, eighth(Instant::now()))
        .or_else(|| best_fit_decreasing_until(inst, eighth(Instant::now())))
        .unwrap_or_else(|| floors_by_start(inst))
}

/// [`exact_search`] on the checked instance, until `deadline`, with the stages of `trace`, which records the
/// parts' progress.
pub(crate) fn search_instance(inst: &Instance, deadline: Instant, start: Start, trace: &mut Trace) -> ExactOutcome {
    let target = inst.lower_bound();
    let (mut offsets, seed) = match start {
        Start::Seed(seed) => (seed.to_vec(), Some(seed)),
        Start::Fallback(fallback) => (fallback, None),
    };
    let needy = |part: &[u32]| seed.is_none_or(|s| part_arena(inst, part, s) > target);
    let mut nodes = 0;
    let bound = on_search_thread(|| {
        let mut bound = target;
        let mut parts: Vec<Vec<u32>> = component::split(inst).into_iter().filter(|p| needy(p)).collect();
        parts.sort_by_key(|p| p.len());
        let mut incumbents = seed.is_some();
        // Each round searches the parts in turn, small ones first (they are usually solved at once and leave
        // their time to the large ones), each with a share of the time left. Time a part left goes back to the
        // small parts not solved in the round, from their best plans: with equal shares, a part that timed out
        // before another was solved at once would leave the rest of the budget unused.
        while !parts.is_empty() && Instant::now() < deadline {
            let mut unsolved = Vec::new();
            let mut left = parts.len() as u32;
            for part in parts {
                let now = Instant::now();
                let part_deadline = now + deadline.saturating_duration_since(now) / left;
                left -= 1;
                let incumbent = incumbents.then_some(offsets.as_slice());
                trace.part_of(part[0]);
                if part.len() > WINDOWS_ABOVE {
                    let incumbent = incumbent.map(|s| part_plan(inst, &part, s));
                    if let Some((placed, _)) =
                        large::search_large(inst, &part, target, incumbent, part_deadline, &mut nodes, trace)
                    {
                        placed.into_iter().for_each(|(i, offset)| offsets[i as usize] = offset);
                    }
                    continue;
                }
                if !searchable(inst, &part) {
                    continue;
                }
                let comp = Component::new(inst, &part);
                let seeded = incumbent.map(|s| (part_arena(inst, &part, s), local(&comp, s)));
                let found = minimise(&comp, target, seeded, part_deadline, &mut nodes, trace);
                bound = bound.max(found.bound);
                if let Some((arena, local)) = found.plan {
                    write_part(&mut offsets, &comp.members, local.into_iter());
                    if arena > target && arena > found.bound {
                        unsolved.push(part);
                    }
                }
            }
            parts = unsolved;
            incumbents = true;
        }
        bound
    })
    .unwrap_or(target);

    let arena = (0..inst.len()).map(|i| offsets[i] + inst.size[i]).max().unwrap_or(0);
    ExactOutcome { offsets, optimal: arena <= bound, bound_bytes: bound.min(arena), nodes }
}

/// The exact search's answer at a fixed capacity.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Offsets, parallel to the buffers, of a plan whose arena is at most the capacity.
    Fits(Vec<u64>),
    /// No plan fits.
    Infeasible,
    /// The budget ran out first.
    Unknown,
}

/// Whether the instance's buffers fit in `capacity` bytes, within `budget`; `seed` is a valid plan to keep
/// where its parts already fit. The parts that need the search take turns, each with a share of the time
/// left, until all fit, one is proven not to, or the time is up; a part's round robin goes on where it
/// stopped.
pub(crate) fn exact_decide(inst: &Instance, capacity: u64, budget: Duration, seed: &[u64]) -> Verdict {
    let deadline = deadline_after(Instant::now(), budget);
    let (large, parts): (Vec<Vec<u32>>, Vec<Vec<u32>>) = component::split(inst)
        .into_iter()
        .filter(|part| part_arena(inst, part, seed) > capacity)
        .partition(|part| part.len() > WINDOWS_ABOVE);
    if parts.iter().any(|part| !searchable(inst, part)) {
        return Verdict::Unknown;
    }
    let verdict = on_search_thread(|| {
        let (mut offsets, mut nodes) = (seed.to_vec(), 0);
        // Large parts as `plan` searches them, aiming at the capacity, each part with its share of the time
        // (the small ones together count as one); a plan within the capacity or none: the search proves nothing.
        // The arena to beat is the seed's, not the capacity: the portfolio's runs end a few percent above the
        // bound and only their lowering comes down to it, so runs cut at the capacity would find nothing.
        for (k, part) in large.iter().enumerate() {
            let now = Instant::now();
            let left = (large.len() - k + usize::from(!parts.is_empty())) as u32;
            let part_deadline = now + deadline.saturating_duration_since(now) / left;
            let incumbent = Some(part_plan(inst, part, seed));
            let found =
                large::search_large(inst, part, capacity, incumbent, part_deadline, &mut nodes, &mut Trace::all());
            let Some((placed, _)) = found.filter(|&(_, arena)| arena <= capacity) else {
                return Verdict::Unknown;
            };
            for (i, offset) in placed {
                offsets[i as usize] = offset;
            }
        }
        let mut open: Vec<(Component, Vec<Ranking>, Prober)> = Vec::with_capacity(parts.len());
        for part in &parts {
            let comp = Component::new(inst, part);
            if comp.load() > capacity {
                return Verdict::Infeasible;
            }
            let (orders, prober) = (orders(&comp), Prober::new(&comp, capacity, Stages::ALL));
            open.push((comp, orders, prober));
        }
        while !open.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return Verdict::Unknown;
            }
            let share = now + deadline.saturating_duration_since(now) / open.len() as u32;
            let mut k = 0;
            while k < open.len() {
                let (comp, orders, prober) = &mut open[k];
                match prober.run(comp, orders, share, &mut nodes) {
                    Outcome::Fits(local) => {
                        write_part(&mut offsets, &comp.members, local.into_iter());
                        open.swap_remove(k);
                    }
                    Outcome::Infeasible => return Verdict::Infeasible,
                    Outcome::TimedOut => k += 1,
                }
            }
        }
        Verdict::Fits(offsets)
    });
    verdict.unwrap_or(Verdict::Unknown)
}

/// The arena the part's buffers take at `offsets` (parallel to the instance's buffers).
fn part_arena(inst: &Instance, part: &[u32], offsets: &[u64]) -> u64 {
    part.iter().map(|&i| offsets[i as usize] + inst.size[i as usize]).max().unwrap_or(0)
}

/// The part's plan at `offsets` (parallel to the instance's buffers), with its arena.
fn part_plan(inst: &Instance, part: &[u32], offsets: &[u64]) -> placed::Placed {
    (part.iter().map(|&i| (i, offsets[i as usize])).collect(), part_arena(inst, part, offsets))
}

/// `plan`'s offsets parallel to the buffers, checked by the validator (every buffer placed once), and its arena.
#[cfg(test)]
pub(crate) fn checked(buffers: &[Buffer], plan: &[(u32, u64)]) -> (Vec<u64>, u64) {
    let mut offsets = vec![u64::MAX; buffers.len()];
    plan.iter().for_each(|&(i, o)| offsets[i as usize] = o);
    assert!(offsets.iter().all(|&o| o != u64::MAX), "every buffer placed once");
    let arena = validate(buffers, &offsets, 1).unwrap();
    (offsets, arena)
}

/// Whether the search takes on a part (see `MAX_BUFFERS` and `MAX_ENTRIES`).
fn searchable(inst: &Instance, part: &[u32]) -> bool {
    part.len() <= MAX_BUFFERS && component::cost(inst, part) <= MAX_ENTRIES
}

/// `budget` after `start`; a year on where that would overflow (an unlimited budget).
pub(crate) fn deadline_after(start: Instant, budget: Duration) -> Instant {
    start.checked_add(budget).unwrap_or(start + Duration::from_secs(365 * 86_400))
}

/// Runs `search` on a thread with a stack to match the search's recursion (once per placement); `None` if no
/// such thread can be started.
fn on_search_thread<T: Send>(search: impl FnOnce() -> T + Send) -> Option<T> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("vrampool-plan-exact".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, search)
            .map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .ok()
    })
}

/// A plan's offsets of the part's buffers, in local order.
fn local(part: &Component, plan: &[u64]) -> Vec<u64> {
    part.members.iter().map(|&i| plan[i as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_a_part_leaves_goes_back_to_the_parts_not_solved() {
        // The smaller part of a square with one rectangle in ten left out, not solved in the budget, then, after
        // its end, a larger part that is solved at once: the square's search goes on into the time it leaves.
        let square = crate::packed_instance(245, 1024, 1024, 10, 208);
        let parts = component::split(&Instance::new(&square, 1).unwrap());
        let hard = parts.iter().min_by_key(|p| p.len()).unwrap();
        let mut buffers: Vec<Buffer> = hard.iter().map(|&i| square[i as usize]).collect();
        let end = buffers.iter().map(|b| b.upper).max().unwrap();
        buffers.extend((0..2 * hard.len() as u64).map(|i| Buffer::new(1_000 + i, end + 1, end + 2, 1024)));
        let budget = Duration::from_millis(600);
        let began = Instant::now();
        let outcome = exact_search(&buffers, 1, budget, None).unwrap();
        assert!(outcome.optimal || began.elapsed() >= budget * 9 / 10, "{:?} of {budget:?}", began.elapsed());
    }

    #[test]
    fn arenas_step_by_the_sizes_greatest_common_divisor() {
        let buffers = [Buffer::new(0, 0, 2, 3072), Buffer::new(1, 1, 3, 1024), Buffer::new(2, 2, 4, 2048)];
        let inst = Instance::new(&buffers, 1).unwrap();
        assert_eq!(minimise::unit_of(&Component::new(&inst, &[0, 1, 2])), 1024);
        let inst = Instance::new(&buffers, 5000).unwrap();
        assert_eq!(minimise::unit_of(&Component::new(&inst, &[0, 1, 2])), 5000);
    }
}
