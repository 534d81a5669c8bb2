//! Large parts (thousands of buffers, up to the whole of a training step or of a decoding run): decompose by
//! time, search windows, stitch.
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
//! best fit among those placed, so a sweep always ends with a plan, on time.
//!
//! Before the sweeps, lowest floor first (`floors/`) runs once per tie-break and direction of time while it
//! beats the best so far, each run stopping as soon as it cannot: on most graphs it ends within a few
//! thousandths of the bound, where the windows would begin a step above. Best fit in order of start (what a
//! dynamic allocator replaying the run would do) comes after the first run, by start, the cheapest good one:
//! it costs about one pass of the heuristics, and where lowest floor first packs badly (serving with
//! continuous batching) it is the best plan there is in the budget; it also gives the sweeps their pace.
//! Each sweep, with windows twice as wide as the last, stops as soon as it cannot beat the best so far.

use std::time::{Duration, Instant};

use super::component::{Component, Order};
use super::probe::{orders, Prober};
use super::search::Outcome;
use crate::floors::lowest_floor_first;
use crate::greedy::best_fit;
use crate::instance::Instance;
use crate::placed_index::PlacedIndex;

/// The tie-breaks lowest floor first is run with, cheapest first (by start comes close to the bound on most
/// graphs in a fraction of the others' time; longest first is the best on decoding runs).
const FLOOR_ORDERS: [Order; 5] = [Order::Time, Order::Wat, Order::Taw, Order::Area, Order::Twa];
/// Buffers placed between looks at the clock.
const CLOCK_EVERY: usize = 1_024;
/// Buffers in the first sweep's first window, and the fewest and most in any.
const FIRST_WINDOW: usize = 400;
const MIN_WINDOW: usize = 50;
const MAX_WINDOW: usize = 3_200;
/// Rounds of the round robin a window gets at one capacity before the capacity rises.
const ROUNDS: usize = 2;
/// The capacity's first rise, as a fraction of the bound; each further rise within a window is half as large
/// again.
const RISES_PER_BOUND: u64 = 1_024;

/// The best plan the sweeps find for the part before `deadline`, if one beats `ceiling` (the arena to beat):
/// offsets (instance index, offset) and the arena. `target` is the lower bound.
pub(crate) fn sweeps(
    inst: &Instance,
    part: &[u32],
    target: u64,
    ceiling: u64,
    deadline: Instant,
    nodes: &mut u64,
) -> Option<(Vec<(u32, u64)>, u64)> {
    let mut order = part.to_vec();
    order.sort_unstable_by_key(|&i| (inst.lo[i as usize], i));
    let arena = |offsets: &[(u32, u64)]| offsets.iter().map(|&(i, o)| o + inst.size[i as usize]).max().unwrap_or(0);
    let mut best: Option<(Vec<(u32, u64)>, u64)> = None;
    let mut pace = None;
    // Time run backwards is another source of variety: a plan of the mirrored part is one of the part.
    let mirrored = inst.mirrored();
    for (k, (tie_break, timeline)) in FLOOR_ORDERS.into_iter().flat_map(|o| [(o, inst), (o, &mirrored)]).enumerate() {
        let beat = |best: &Option<(Vec<(u32, u64)>, u64)>| best.as_ref().map_or(ceiling, |b| b.1).saturating_sub(1);
        if beat(&best) < target || Instant::now() >= deadline {
            return best;
        }
        // Best fit by start after the first run: the fallback where the floors pack badly, which leaves that
        // run, the cheapest good one, the head start.
        if k == 1 {
            pace = fit_by_start(inst, &order, ceiling, deadline, &mut best);
            if pace.is_none() || beat(&best) < target {
                return best;
            }
        }
        let beat = beat(&best);
        if let Some(offsets) = lowest_floor_first(timeline, &order, tie_break, beat, deadline) {
            let offsets: Vec<(u32, u64)> = order.iter().copied().zip(offsets).collect();
            let arena = arena(&offsets);
            best = Some((offsets, arena));
        }
    }
    let Some(mut pace) = pace else {
        return best;
    };
    let mut width = FIRST_WINDOW;
    // A sweep begins only with time for a window and for a fit of every buffer after it.
    while Instant::now() + pace.window + pace.fitting(order.len()) < deadline {
        let ceiling = best.as_ref().map_or(ceiling, |b: &(Vec<(u32, u64)>, u64)| b.1);
        let Some(offsets) = sweep(inst, &order, (target, ceiling), width, deadline, &mut pace, nodes) else {
            break;
        };
        let arena = arena(&offsets);
        if arena < ceiling {
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

/// Best fit in `order` (by start), kept in `best` where it beats `ceiling` and the plan there, and the pace it
/// set; `None` if the deadline comes first.
fn fit_by_start(
    inst: &Instance,
    order: &[u32],
    ceiling: u64,
    deadline: Instant,
    best: &mut Option<(Vec<(u32, u64)>, u64)>,
) -> Option<Pace> {
    let fitting = Instant::now();
    let by_start = fit_before(inst, order, deadline)?;
    let pace =
        Pace { fit_seconds: fitting.elapsed().as_secs_f64() / order.len().max(1) as f64, window: Duration::ZERO };
    let by_start_arena = by_start.iter().map(|&(i, o)| o + inst.size[i as usize]).max().unwrap_or(0);
    if by_start_arena < best.as_ref().map_or(ceiling, |b| b.1) {
        *best = Some((by_start, by_start_arena));
    }
    Some(pace)
}

/// `order` placed by best fit, if done before `deadline`.
fn fit_before(inst: &Instance, order: &[u32], deadline: Instant) -> Option<Vec<(u32, u64)>> {
    let (mut placed, mut spans) = (PlacedIndex::new(inst.segments), Vec::new());
    let mut offsets = Vec::with_capacity(order.len());
    for (k, &i) in order.iter().enumerate() {
        if k % CLOCK_EVERY == 0 && Instant::now() >= deadline {
            return None;
        }
        offsets.push((i, best_fit(inst, &mut placed, i, &mut spans)));
    }
    Some(offsets)
}

/// `offsets` and the rest of `order` after them placed by best fit among `placed`.
fn fit_rest(inst: &Instance, rest: &[u32], mut placed: PlacedIndex, mut offsets: Vec<(u32, u64)>) -> Vec<(u32, u64)> {
    let mut spans = Vec::new();
    for &i in rest {
        offsets.push((i, best_fit(inst, &mut placed, i, &mut spans)));
    }
    offsets
}

/// One sweep over `order` (sorted by start) with windows of `width` buffers to begin with, between the lower
/// bound and the arena to beat; `None` if its capacity reaches the latter. No window is begun unless one as
/// long as the last would still leave time to place the rest by best fit (`pace`).
fn sweep(
    inst: &Instance,
    order: &[u32],
    (target, ceiling): (u64, u64),
    width: usize,
    deadline: Instant,
    pace: &mut Pace,
    nodes: &mut u64,
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
        let Some(local) = search_window(inst, window, &placed, &mut capacity, target, windows_end, nodes) else {
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
    Some(fit_rest(inst, &order[done..], placed, offsets))
}

/// The window's buffers placed clear of `placed`, at `capacity` or as little above it as the search finds
/// (raising `capacity` to it); `None` if the deadline comes first.
fn search_window(
    inst: &Instance,
    window: &[u32],
    placed: &PlacedIndex,
    capacity: &mut u64,
    target: u64,
    deadline: Instant,
    nodes: &mut u64,
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
        let mut prober = Prober::new(&comp, *capacity);
        for _ in 0..orders.len() * ROUNDS {
            if let Outcome::Fits(local) = prober.step(&comp, &orders, deadline, nodes) {
                return Some(comp.members.iter().copied().zip(local).collect());
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        *capacity = capacity.saturating_add(rise);
        rise = rise.saturating_add(rise / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{random_instance, validate};

    #[test]
    fn best_fit_by_start_gives_way_to_the_deadline() {
        let buffers = random_instance(3_000, 9);
        let inst = Instance::new(&buffers, 1).unwrap();
        let mut order: Vec<u32> = (0..inst.len() as u32).collect();
        order.sort_unstable_by_key(|&i| (inst.lo[i as usize], i));
        assert_eq!(fit_before(&inst, &order, Instant::now()), None);
        let placed = fit_before(&inst, &order, Instant::now() + Duration::from_secs(60)).unwrap();
        let mut offsets = vec![0; inst.len()];
        placed.iter().for_each(|&(i, o)| offsets[i as usize] = o);
        let arena = placed.iter().map(|&(i, o)| o + inst.size[i as usize]).max().unwrap();
        assert_eq!(validate(&buffers, &offsets, 1).unwrap(), arena);
    }

    #[test]
    fn best_fit_by_start_is_kept_only_where_it_beats_the_ceiling_and_the_best_so_far() {
        let buffers = random_instance(3_000, 4);
        let inst = Instance::new(&buffers, 1).unwrap();
        let mut order: Vec<u32> = (0..inst.len() as u32).collect();
        order.sort_unstable_by_key(|&i| (inst.lo[i as usize], i));
        let far = Instant::now() + Duration::from_secs(60);
        let mut best = None;
        assert!(fit_by_start(&inst, &order, u64::MAX, far, &mut best).is_some());
        let (plan, arena) = best.clone().unwrap();
        assert_eq!(plan, fit_before(&inst, &order, far).unwrap());
        let mut offsets = vec![0; inst.len()];
        plan.iter().for_each(|&(i, o)| offsets[i as usize] = o);
        assert_eq!(validate(&buffers, &offsets, 1).unwrap(), arena);
        // No better than the ceiling, or than a plan already held: not kept.
        let mut none = None;
        fit_by_start(&inst, &order, arena, far, &mut none);
        assert_eq!(none, None);
        let mut better = Some((Vec::new(), arena - 1));
        fit_by_start(&inst, &order, u64::MAX, far, &mut better);
        assert_eq!(better, Some((Vec::new(), arena - 1)));
        assert!(fit_by_start(&inst, &order, u64::MAX, Instant::now(), &mut None).is_none());
    }
}
