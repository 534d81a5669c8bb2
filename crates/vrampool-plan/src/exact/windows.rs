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
//! best fit among those placed, which gives up at the deadline or at the arena to beat, so a sweep ends on
//! time, with a plan or with none (the best so far stands).
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

use std::time::{Duration, Instant};

use super::classes::best_fit_in_classes;
use super::component::Component;
use super::neighbourhood::lower_peaks;
use super::portfolio::{arena_of, best_of_runs, fit_onto, Placed, Runs};
use super::probe::{orders, Prober};
use super::search::Outcome;
use crate::floors::squeaky_wheel;
use crate::instance::Instance;
use crate::placed_index::PlacedIndex;
use crate::trace::{Stage, Stages, Trace};

/// Buffers in the first sweep's first window, and the fewest and most in any.
const FIRST_WINDOW: usize = 400;
const MIN_WINDOW: usize = 50;
const MAX_WINDOW: usize = 3_200;
/// Rounds of the round robin a window gets at one capacity before the capacity rises.
const ROUNDS: u64 = 2;
/// Runs in a row that do not beat the lowered plan before the squeaky wheel gives up shaking it: a lowered plan
/// is harder to beat than a floor run's (on the random instance of 30,000 buffers the wheel's first better
/// plan came after more than 8).
const SHAKE_PATIENCE: usize = 32;
/// The capacity's first rise, as a fraction of the bound; each further rise within a window is half as large
/// again.
const RISES_PER_BOUND: u64 = 1_024;

/// The best plan of the part found before `deadline`, the runs', the lowered plans' or the sweeps', or else
/// `incumbent` (the part's plan so far, if any, whose arena the runs must beat; it is lowered as theirs are):
/// offsets (instance index, offset) and the arena; `None` if there is no incumbent and nothing was found in
/// time. `target` is the lower bound. `trace` says which stages run, and hears of each better plan.
pub(crate) fn sweeps(
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
    let mut best = if stages.has(Stage::Lowering) {
        (!plans.is_empty()).then(|| lower_peaks(inst, &order, plans, target, deadline, (nodes, trace), shake))
    } else {
        plans.into_iter().min_by_key(|p| p.1)
    };
    let fit_seconds = fit_seconds.filter(|_| stages.has(Stage::Windows));
    let Some(fit_seconds) = fit_seconds.filter(|_| best.as_ref().is_none_or(|b| b.1 > target)) else {
        return best;
    };
    let mut pace = Pace { fit_seconds, window: Duration::ZERO };
    let mut width = FIRST_WINDOW;
    // A sweep begins only with time for a window and for a fit of every buffer after it.
    while Instant::now() + pace.window + pace.fitting(order.len()) < deadline {
        let ceiling = best.as_ref().map_or(ceiling, |b: &Placed| b.1);
        let Some(offsets) = sweep(inst, &order, (target, ceiling), width, deadline, &mut pace, (nodes, stages)) else {
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
    use crate::exact::portfolio::fit_before;
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
            sweeps(&inst, &part, target, Some(incumbent.clone()), now, &mut nodes, &mut Trace::all()),
            Some(incumbent.clone())
        );
        assert_eq!(sweeps(&inst, &part, target, None, now, &mut nodes, &mut Trace::all()), None);
        let soon = Instant::now() + Duration::from_secs(2);
        let (plan, arena) =
            sweeps(&inst, &part, target, Some(incumbent.clone()), soon, &mut nodes, &mut Trace::all()).unwrap();
        assert_eq!(checked(&buffers, &plan).1, arena);
        assert!(arena <= incumbent.1);
    }
}
