//! Window sweeps of a large part (`large.rs`): decompose by time, search windows, stitch.
//!
//! The buffers are taken in order of their start, a window at a time. Each window is searched as a part of
//! its own, with the buffers of earlier windows that are still live fixed where they were put (obstacles, see
//! `search.rs`), at a capacity that starts at the lower bound and rises only when the window does not fit in
//! one round of the round robin. A window's buffers that outlive it are then fixed for the next windows. So
//! the exact search sees a few hundred buffers at a time, and the plan stays as close to the bound as the
//! windows allow.
//!
//! Wider windows see further ahead but cost more a node (a node scans its group, and each placement updates
//! every section its neighbours span). So the width follows the clock: it halves while the sweep is behind
//! its share of the time and doubles while well ahead. Buffers left when the sweep's time is up are placed by
//! best fit among those placed, which gives up at the deadline or at the arena to beat, so a sweep ends on
//! time, with a plan or with none (the best so far stands).
//!

use std::time::{Duration, Instant};

use super::component::Component;
use super::placed::{arena_of, fit_onto, Placed};
use super::probe::{orders, Prober};
use super::search::Outcome;
use crate::instance::Instance;
use crate::placed_index::PlacedIndex;
use crate::trace::{Stages, Trace};

/// Buffers in the first sweep's first window, and the fewest and most in any.
const FIRST_WINDOW: usize = 400;
const MIN_WINDOW: usize = 50;
const MAX_WINDOW: usize = 3_200;
/// Rounds of the round robin a window gets at one capacity before the capacity rises.
const ROUNDS: u64 = 2;
/// The capacity's first rise, as a fraction of the bound; each further rise within a window is half as large
/// again.
const RISES_PER_BOUND: u64 = 1_024;

/// Window sweeps of `order` (the part, sorted by start) before `deadline`, each with windows twice as wide as the
/// last, paced by best fit's `fit_seconds` a buffer; each stops as soon as it cannot beat `best` (or else
/// `ceiling`). The best plan, `best` where no sweep beats it; `trace` hears of each better plan.
pub(crate) fn sweeps(
    inst: &Instance,
    order: &[u32],
    target: u64,
    (mut best, ceiling): (Option<Placed>, u64),
    fit_seconds: f64,
    deadline: Instant,
    (nodes, trace): (&mut u64, &mut Trace),
) -> Option<Placed> {
    let stages = trace.stages;
    let mut pace = Pace { fit_seconds, window: Duration::ZERO };
    let mut width = FIRST_WINDOW;
    // A sweep begins only with time for a window and for a fit of every buffer after it.
    while Instant::now() + pace.window + pace.fitting(order.len()) < deadline {
        let ceiling = best.as_ref().map_or(ceiling, |b: &Placed| b.1);
        let Some(offsets) = sweep(inst, order, (target, ceiling), width, deadline, &mut pace, (nodes, stages)) else {
            break;
        };
        let arena = arena_of(inst, &offsets);
        if arena < ceiling {
            trace.found(arena);
            best = Some((offsets, arena));
        }
        if arena <= target {
            break;
        }
        width = (width * 2).min(MAX_WINDOW);
        // Wider windows take longer each.
        pace.window *= 2;
    }
    best
}

/// What the clock has shown so far: seconds a buffer takes to place by best fit, and the time the last
/// window took.
struct Pace {
    fit_seconds: f64,
    window: Duration,
}

impl Pace {
    /// Time to place `buffers` by best fit, with half as much again for a fit slower than the last measured.
    fn fitting(&self, buffers: usize) -> Duration {
        Duration::from_secs_f64(1.5 * self.fit_seconds * buffers as f64)
    }
}

/// One sweep over `order` (sorted by start) with windows of `width` buffers to begin with, between the lower
/// bound and the arena to beat; `None` if its capacity or a buffer's top reaches the latter, or the deadline
/// comes first. No window is begun unless one as long as the last would still leave time to place the rest by
/// best fit (`pace`).
fn sweep(
    inst: &Instance,
    order: &[u32],
    (target, ceiling): (u64, u64),
    width: usize,
    deadline: Instant,
    pace: &mut Pace,
    (nodes, stages): (&mut u64, Stages),
) -> Option<Vec<(u32, u64)>> {
    let start = Instant::now();
    let mut capacity = target;
    let mut placed = PlacedIndex::new(inst.segments);
    let mut offsets: Vec<(u32, u64)> = Vec::with_capacity(order.len());
    let (mut done, mut width) = (0, width);
    while done < order.len() {
        let now = Instant::now();
        let windows_end = deadline.checked_sub(pace.fitting(order.len() - done));
        let Some(windows_end) = windows_end.filter(|&end| now + pace.window < end) else {
            break;
        };
        let spent = (now - start).as_secs_f64() / (windows_end - start).as_secs_f64().max(1e-9);
        let share = done as f64 / order.len() as f64;
        if spent > share + 0.05 {
            width = (width / 2).max(MIN_WINDOW);
        } else if spent < share / 2.0 {
            width = (width * 2).min(MAX_WINDOW);
        }
        let window = &order[done..(done + width).min(order.len())];
        let Some(local) = search_window(inst, window, &placed, (&mut capacity, target), windows_end, (nodes, stages))
        else {
            break;
        };
        pace.window = now.elapsed();
        if capacity >= ceiling {
            return None;
        }
        for (i, offset) in local {
            let i_ = i as usize;
            placed.insert((offset, offset + inst.size[i_]), inst.lo[i_], inst.hi[i_]);
            offsets.push((i, offset));
        }
        done += window.len();
    }
    // The rest by best fit, given up at the deadline or the arena to beat: the best plan so far stands then.
    fit_onto(inst, (placed, offsets), &order[done..], ceiling.saturating_sub(1), deadline).0
}

/// The window's buffers placed clear of `placed`, at `capacity` or as little above it as the search finds
/// (raising `capacity` to it); `None` if the deadline comes first.
fn search_window(
    inst: &Instance,
    window: &[u32],
    placed: &PlacedIndex,
    (capacity, target): (&mut u64, u64),
    deadline: Instant,
    (nodes, stages): (&mut u64, Stages),
) -> Option<Vec<(u32, u64)>> {
    let mut comp = Component::new(inst, window);
    let mut spans = Vec::new();
    let obstacles = comp
        .members
        .iter()
        .map(|&i| {
            spans.clear();
            placed.overlapping(inst.lo[i as usize], inst.hi[i as usize], &mut spans);
            spans.clone()
        })
        .collect();
    comp.set_obstacles(obstacles);
    let orders = orders(&comp);
    let mut rise = (target / RISES_PER_BOUND).max(1);
    loop {
        let mut prober = Prober::new(&comp, *capacity, stages);
        while prober.rounds < ROUNDS {
            if let Outcome::Fits(local) = prober.step(&comp, &orders, deadline, nodes) {
                return Some(comp.members.iter().copied().zip(local).collect());
            }
            // Each step sets up its search before it looks at the clock: on a window of thousands, 0.1 s for
            // the steps left in the round.
            if Instant::now() >= deadline {
                return None;
            }
        }
        *capacity = capacity.saturating_add(rise);
        rise = rise.saturating_add(rise / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::checked;
    use crate::exact::placed::fit_before;
    use crate::random_instance;

    /// A sweep with no time for windows is best fit by start alone, which gives way to the deadline and to the
    /// arena to beat as the portfolio's runs do.
    #[test]
    fn a_sweep_s_last_fit_stops_at_the_deadline_and_at_the_arena_to_beat() {
        let buffers = random_instance(2_000, 5);
        let inst = Instance::new(&buffers, 1).unwrap();
        let order = inst.by_start(0..inst.len() as u32);
        let target = inst.lower_bound();
        // Fitting every buffer would take 3 s at this pace, more than the deadlines below leave for windows.
        let mut pace = Pace { fit_seconds: 1e-3, window: Duration::ZERO };
        let mut nodes = 0;
        let mut sweep_until = |deadline, ceiling| {
            sweep(&inst, &order, (target, ceiling), 400, deadline, &mut pace, (&mut nodes, Stages::ALL))
        };
        assert_eq!(sweep_until(Instant::now(), u64::MAX), None);
        let soon = Instant::now() + Duration::from_secs(2);
        let plan = sweep_until(soon, u64::MAX).expect("time for best fit");
        assert_eq!(Some(&plan), fit_before(&inst, &order, u64::MAX, soon).0.as_ref());
        let arena = checked(&buffers, &plan).1;
        assert_eq!(sweep_until(soon, arena + 1), Some(plan));
        assert_eq!(sweep_until(soon, arena), None);
        assert_eq!(nodes, 0, "no window searched");
    }
}
