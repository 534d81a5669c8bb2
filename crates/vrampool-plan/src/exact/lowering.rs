//! The lowering stage: large-neighbourhood search on a finished plan of a large part, lowering its peaks one
//! buffer at a time.
//!
//! A level a step below the arena is reached when every buffer ending above it is moved below it. Each such
//! buffer, highest first, is searched again together with its *band*: the buffers overlapping it in time whose
//! tops lie within some bytes below the level. The exact search (the round robin of `probe.rs`) places the
//! band below the level, clear of every other buffer, which stays fixed where it is (obstacles). A band proven
//! not to fit widens; one the search cannot decide in its time ends the level, and the step below the arena
//! halves. Bands are small (tens to hundreds of buffers), so a repair is decided in milliseconds where a window
//! of a thousand buffers around the peak is not decided in seconds (the obstacles leave its bounds weak).
//!
//! Every move keeps the plan valid and no buffer above the level it was moved for, so the arena never rises,
//! and a level given up keeps the moves made for it.

use std::time::{Duration, Instant};

use super::component::{merge_spans, Component};
use super::placed::Placed;
use super::probe::{orders, Prober};
use super::search::Outcome;
use crate::instance::{unit_of_sizes, Instance};
use crate::placed_index::canonical;
use crate::trace::{Stages, Trace};

/// The bands tried in turn for one buffer, in thousandths of the lower bound below the level; in a plan within
/// 1.1 of the bound the last takes every buffer overlapping it.
const BANDS: [u64; 8] = [10, 20, 50, 100, 200, 350, 500, 1_100];
/// Bands of more buffers are not searched: the search decides none in its time, and building one costs
/// milliseconds.
const MAX_MEMBERS: usize = 2_000;
/// The search's time for one band at first; it doubles each time the step below the arena is back at its
/// least, up to `MAX_SLICE`, after which the plan is done.
const FIRST_SLICE: Duration = Duration::from_millis(200);
const MAX_SLICE: Duration = Duration::from_millis(1_600);
/// Members whose obstacles are gathered between two looks at the clock (each visits every buffer overlapping
/// it, thousands where buffers live long).
const OBSTACLES_CLOCK_EVERY: usize = 16;

/// The lowest of `plans` (of the part `order`, sorted by start; at least one) with its arena lowered towards
/// `target` before `deadline`, by as many steps as the searches of the bands around its highest buffers find.
///
/// The plans are lowered side by side, a level at a time: the lowest so far gets two thirds of the time, the
/// others share the rest. The lowest at first is not always the lowest in the end (on serving seed 4 the
/// runs' best plan, 1.0364 of the bound, stalls at 1.0295, their second, 1.0415, goes down to 1.0252).
pub(crate) fn lower_peaks(
    inst: &Instance,
    order: &[u32],
    mut plans: Vec<Placed>,
    target: u64,
    deadline: Instant,
    (nodes, trace): (&mut u64, &mut Trace),
) -> Placed {
    // With no time left (the runs may take it all), not even the index of overlaps is built.
    if plans.iter().any(|p| p.1 <= target) || Instant::now() >= deadline {
        let lowest = (0..plans.len()).min_by_key(|&k| plans[k].1).expect("at least one plan");
        return plans.swap_remove(lowest);
    }
    let overlaps = Overlaps::new(inst, order);
    let unit = unit_of_sizes(order.iter().map(|&i| inst.size[i as usize]));
    let mut searches = Searches { nodes, setup: Duration::ZERO, stages: trace.stages };
    let mut descents: Vec<Descent> =
        plans.into_iter().map(|plan| Descent::new(inst, order, &overlaps, plan, (target, unit), deadline)).collect();
    while let Some(k) = next_descent(&descents, target) {
        if Instant::now() >= deadline {
            break;
        }
        let began = Instant::now();
        descents[k].level(&mut searches);
        descents[k].seconds += began.elapsed().as_secs_f64();
        trace.found(descents[k].arena);
    }
    let lowest = descents.into_iter().min_by_key(|d| d.arena).expect("at least one plan");
    (lowest.lowering.plan().0, lowest.arena)
}

/// The descent that tries the next level, if none has reached the target and some can go on: the time is
/// shared as between the portfolio's kinds of run (`next_kind`), the lowest plan's at half the weight; ties to
/// the lower plan, then the earlier.
fn next_descent(descents: &[Descent], target: u64) -> Option<usize> {
    let lowest = descents.iter().map(|d| d.arena).min()?;
    if lowest <= target {
        return None;
    }
    let weighted = |d: &Descent| d.seconds * if d.arena == lowest { 1.0 } else { 2.0 };
    (0..descents.len()).filter(|&k| !descents[k].done).min_by(|&a, &b| {
        weighted(&descents[a]).total_cmp(&weighted(&descents[b])).then(descents[a].arena.cmp(&descents[b].arena))
    })
}

/// One plan being lowered: the plan, the step below its arena and the band's time the next level is tried with,
/// and the time it has taken.
struct Descent<'a> {
    lowering: Lowering<'a>,
    arena: u64,
    unit: u64,
    step: u64,
    slice: Duration,
    /// Whether the steps and the slices are spent.
    done: bool,
    seconds: f64,
}

impl<'a> Descent<'a> {
    fn new(
        inst: &'a Instance,
        order: &'a [u32],
        overlaps: &'a Overlaps<'a>,
        (plan, arena): Placed,
        (target, unit): (u64, u64),
        deadline: Instant,
    ) -> Descent<'a> {
        let offset = vec![u64::MAX; inst.len()];
        let mut lowering = Lowering { inst, order, overlaps, offset, target, deadline };
        lowering.take(&plan);
        let mut descent = Descent { lowering, arena, unit, step: 0, slice: FIRST_SLICE, done: false, seconds: 0.0 };
        descent.step = descent.first_step();
        descent
    }

    fn first_step(&self) -> u64 {
        self.arena.saturating_sub(self.lowering.target).div_ceil(4).max(self.unit)
    }

    /// Tries the next level below the arena, and sets the step and the slice for the one after.
    fn level(&mut self, searches: &mut Searches) {
        let (before, target) = (self.arena, self.lowering.target);
        let reached = self.lowering.reach(before - self.step.min(before - target), self.slice, searches);
        self.arena = self.lowering.arena();
        self.done = self.arena <= target;
        if reached {
            return;
        }
        if self.step > self.unit {
            self.step = (self.step / 2).max(self.unit);
        } else if self.slice < MAX_SLICE {
            (self.step, self.slice) = (self.first_step(), self.slice * 2);
        } else {
            self.done = true;
        }
    }
}

/// A plan of a part being lowered.
struct Lowering<'a> {
    inst: &'a Instance,
    /// The part, sorted by start.
    order: &'a [u32],
    overlaps: &'a Overlaps<'a>,
    /// Offsets by instance index.
    offset: Vec<u64>,
    target: u64,
    deadline: Instant,
}

/// What the bands' searches share across the plans being lowered: the nodes they visit, and the longest a band's
/// search structures took to build so far (no band is begun with less time left).
struct Searches<'n> {
    nodes: &'n mut u64,
    setup: Duration,
    stages: Stages,
}

impl Lowering<'_> {
    fn top(&self, i: u32) -> u64 {
        self.offset[i as usize] + self.inst.size[i as usize]
    }

    fn arena(&self) -> u64 {
        self.order.iter().map(|&i| self.top(i)).max().unwrap_or(0)
    }

    /// The plan as it stands, in the part's order, and its arena.
    fn plan(&self) -> Placed {
        (self.order.iter().map(|&i| (i, self.offset[i as usize])).collect(), self.arena())
    }

    /// Moves every buffer to its offset in `plan`.
    fn take(&mut self, plan: &[(u32, u64)]) {
        for &(i, o) in plan {
            self.offset[i as usize] = o;
        }
    }

    /// Moves every buffer ending above `level` below it, highest first, each with the first of its bands that
    /// fits, a band's search stopped after `slice`; whether all went.
    fn reach(&mut self, level: u64, slice: Duration, searches: &mut Searches) -> bool {
        let mut above: Vec<u32> = self.order.iter().copied().filter(|&i| self.top(i) > level).collect();
        above.sort_by_key(|&i| (std::cmp::Reverse(self.top(i)), i));
        for peak in above {
            if self.top(peak) <= level {
                continue;
            }
            let lowered = BANDS.iter().find_map(|&thousandths| {
                let now = Instant::now();
                if now + searches.setup >= self.deadline {
                    return Some(false);
                }
                match self.repair(
                    peak,
                    level,
                    self.target * thousandths / 1_000,
                    self.deadline.min(now + slice),
                    searches,
                ) {
                    Outcome::Fits(_) => Some(true),
                    Outcome::Infeasible => None,
                    Outcome::TimedOut => Some(false),
                }
            });
            if lowered != Some(true) {
                return false;
            }
        }
        true
    }

    /// Searches `peak` and the buffers overlapping it that end above `level - band` again, below `level` and
    /// clear of every other buffer, until `stop`, and moves them there if they fit.
    fn repair(&mut self, peak: u32, level: u64, band: u64, stop: Instant, searches: &mut Searches) -> Outcome {
        let inst = self.inst;
        let began = Instant::now();
        let floor = level.saturating_sub(band);
        let mut members = Vec::new();
        self.overlaps.each(peak, |i| {
            if self.top(i) > floor {
                members.push(i);
            }
        });
        if members.len() > MAX_MEMBERS {
            return Outcome::TimedOut;
        }
        let mut comp = Component::new(inst, &members);
        if comp.load() > level {
            return Outcome::Infeasible;
        }
        let Some(obstacles) = self.obstacles(&comp.members) else {
            return Outcome::TimedOut;
        };
        comp.set_obstacles(obstacles);
        searches.setup = searches.setup.max(began.elapsed());
        let mut prober = Prober::new(&comp, level, searches.stages);
        let outcome = prober.run(&comp, &orders(&comp), stop, searches.nodes);
        if let Outcome::Fits(local) = &outcome {
            for (&i, &o) in comp.members.iter().zip(local) {
                self.offset[i as usize] = o;
            }
        }
        outcome
    }

    /// For each of `members`, the bytes of the part's other buffers that overlap it in time, merged; `None`
    /// if the deadline comes first. Most of a band's set-up is here (a band of 1,647 buffers of a pipelined
    /// step took 0.6 s, gathering and merging), and a band wider than any before can take longer than the
    /// set-up time `reach` reserves: `plan` ended 0.25-0.3 s past its budget there.
    fn obstacles(&self, members: &[u32]) -> Option<Vec<Vec<(u64, u64)>>> {
        let mut member = vec![false; self.inst.len()];
        members.iter().for_each(|&i| member[i as usize] = true);
        members
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                if k % OBSTACLES_CLOCK_EVERY == 0 && Instant::now() >= self.deadline {
                    return None;
                }
                let mut spans = Vec::new();
                self.overlaps.each(i, |j| {
                    if !member[j as usize] {
                        let o = self.offset[j as usize];
                        spans.push((o, o + self.inst.size[j as usize]));
                    }
                });
                merge_spans(&mut spans);
                Some(spans)
            })
            .collect()
    }
}

/// The part's buffers by lifetime, to find those that overlap a buffer in time: the ones live on its first
/// segment (each recorded on the canonical nodes of its lifetime, read on the path from that segment up) and
/// the ones starting after it and before its end (a range of the part sorted by start). Lifetimes do not move,
/// so one index serves every band, however the bands move the buffers.
struct Overlaps<'a> {
    inst: &'a Instance,
    order: &'a [u32],
    leaves: usize,
    /// The buffers recorded on node `k` are `live[first[k]..first[k + 1]]`.
    first: Vec<usize>,
    live: Vec<u32>,
}

impl<'a> Overlaps<'a> {
    fn new(inst: &'a Instance, order: &'a [u32]) -> Overlaps<'a> {
        let leaves = inst.segments.max(1).next_power_of_two();
        let nodes_of = |i: u32| canonical(leaves, inst.lo[i as usize], inst.hi[i as usize]);
        let mut first = vec![0usize; 2 * leaves + 1];
        for &i in order {
            nodes_of(i).for_each(|node| first[node + 1] += 1);
        }
        for k in 1..first.len() {
            first[k] += first[k - 1];
        }
        let mut filled = first.clone();
        let mut live = vec![0u32; first[2 * leaves]];
        for &i in order {
            for node in nodes_of(i) {
                live[filled[node]] = i;
                filled[node] += 1;
            }
        }
        Overlaps { inst, order, leaves, first, live }
    }

    /// Calls `visit` on every buffer of the part whose lifetime overlaps `i`'s, `i` among them, once each.
    fn each(&self, i: u32, mut visit: impl FnMut(u32)) {
        let inst = self.inst;
        let (lo, hi) = (inst.lo[i as usize], inst.hi[i as usize]);
        let mut node = lo as usize + self.leaves;
        while node >= 1 {
            self.live[self.first[node]..self.first[node + 1]].iter().for_each(|&j| visit(j));
            node >>= 1;
        }
        let from = self.order.partition_point(|&j| inst.lo[j as usize] <= lo);
        let to = from + self.order[from..].partition_point(|&j| inst.lo[j as usize] < hi);
        self.order[from..to].iter().for_each(|&j| visit(j));
    }
}

#[cfg(test)]
mod tests;
