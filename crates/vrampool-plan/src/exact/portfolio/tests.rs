use std::time::Duration;

use super::*;
use crate::exact::checked;
use crate::{large_graph, random_instance, Buffer, GraphFamily};

#[test]
fn best_fit_by_start_gives_way_to_the_deadline_and_to_the_arena_to_beat() {
    let buffers = random_instance(3_000, 9);
    let inst = Instance::new(&buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    assert_eq!(fit_before(&inst, &order, u64::MAX, Instant::now()), (None, 0));
    let far = Instant::now() + Duration::from_secs(60);
    let (plan, placed) = fit_before(&inst, &order, u64::MAX, far);
    let plan = plan.unwrap();
    assert_eq!(placed, order.len());
    let arena = checked(&buffers, &plan).1;
    assert_eq!(plan.iter().map(|&(i, o)| o + inst.size[i as usize]).max(), Some(arena));
    assert_eq!(fit_before(&inst, &order, arena, far).0, Some(plan));
    let (none, stopped) = fit_before(&inst, &order, arena - 1, far);
    assert_eq!(none, None);
    assert!(stopped >= 1 && stopped <= order.len());
}

/// Checks that `order` is a permutation of the instance's buffers and that its first `head` and the rest each go
/// by start on `timeline`; returns the two phases.
fn phases_by_start<'a>(timeline: &Instance, order: &'a [u32], head: usize) -> (&'a [u32], &'a [u32]) {
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..timeline.len() as u32).collect::<Vec<_>>(), "a permutation");
    let (early, late) = order.split_at(head);
    for phase in [early, late] {
        assert!(phase.windows(2).all(|w| timeline.lo[w[0] as usize] <= timeline.lo[w[1] as usize]), "by start");
    }
    (early, late)
}

#[test]
fn a_first_phase_comes_first_and_each_phase_goes_by_start() {
    let buffers = random_instance(2_000, 3);
    let inst = Instance::new(&buffers, 1).unwrap();
    let mirrored = inst.mirrored();
    let part: Vec<u32> = (0..inst.len() as u32).rev().collect();
    let firsts = [First::Nothing, First::Longest(50), First::Longest(5), First::Largest(20), First::Largest(5)];
    for timeline in [&inst, &mirrored] {
        for first in firsts {
            let order = fit_order(timeline, &part, first);
            let key = |i: u32| match first {
                First::Nothing => 0,
                First::Longest(_) => timeline.span(i as usize) as u64,
                First::Largest(_) => timeline.size[i as usize],
                First::Bytes(_) => panic!("it has its own test"),
            };
            let percent = match first {
                First::Nothing => 0,
                First::Longest(p) | First::Largest(p) => p,
                First::Bytes(_) => panic!("it has its own test"),
            };
            // The first phase: the buffers whose key is above the key of rank n (100 - percent) / 100.
            let mut keys: Vec<u64> = part.iter().map(|&i| key(i)).collect();
            keys.sort_unstable();
            let cut = keys[(keys.len() * (100 - percent) / 100).min(keys.len() - 1)];
            let head = if percent == 0 { 0 } else { part.iter().filter(|&&i| key(i) > cut).count() };
            assert!(head <= part.len() * percent / 100, "{first:?}: {head} first");
            assert!(percent == 0 || head > 0, "{first:?}: a first phase");
            let (early, late) = phases_by_start(timeline, &order, head);
            assert!(early.iter().all(|&i| late.iter().all(|&j| key(i) > key(j))), "{first:?}");
        }
    }
}

#[test]
fn the_buffers_of_a_share_of_the_bound_come_first_and_each_phase_goes_by_start() {
    let buffers = random_instance(2_000, 3);
    let inst = Instance::new(&buffers, 1).unwrap();
    let mirrored = inst.mirrored();
    let part: Vec<u32> = (0..inst.len() as u32).rev().collect();
    let bound = inst.lower_bound();
    for timeline in [&inst, &mirrored] {
        for per_mille in [5, 20, 1_001] {
            let large = |i: u32| timeline.size[i as usize] * 1000 >= bound * per_mille;
            let head = part.iter().filter(|&&i| large(i)).count();
            assert!((head > 0) == (per_mille <= 20) && head < part.len() / 2, "{per_mille}: {head} first");
            let order = fit_order(timeline, &part, First::Bytes(per_mille));
            let (early, late) = phases_by_start(timeline, &order, head);
            assert!(early.iter().all(|&i| large(i)) && late.iter().all(|&i| !large(i)), "{per_mille}");
        }
    }
}

/// Each run's arena, every run to its end on its own, in the portfolio's order (floor runs, then fits).
fn each_run_s_arena(buffers: &[Buffer], inst: &Instance, order: &[u32], far: Instant) -> Vec<u64> {
    let mirrored = inst.mirrored();
    FLOOR_RUNS
        .iter()
        .chain(&FIT_RUNS)
        .map(|&(run, backwards)| {
            let timeline = if backwards { &mirrored } else { inst };
            let plan: Vec<(u32, u64)> = match run {
                Run::Floors(tie_break) => order
                    .iter()
                    .copied()
                    .zip(lowest_floor_first(timeline, order, tie_break, u64::MAX, far).unwrap())
                    .collect(),
                Run::Fit(first) => fit_before(timeline, &fit_order(timeline, order, first), u64::MAX, far).0.unwrap(),
                Run::Aligned(factor, first) => {
                    aligned_fit_before(timeline, &fit_order(timeline, order, first), factor, u64::MAX, far).0.unwrap()
                }
            };
            checked(buffers, &plan).1
        })
        .collect()
}

#[test]
fn on_serving_with_caches_regrown_at_every_step_the_neighbours_ends_pack_far_closer_than_best_fit() {
    // Seed 4: each of 5 or more sequences' KV caches replaced by one a row larger at every step.
    let buffers = large_graph(GraphFamily::Serving, 4);
    let inst = Instance::new(&buffers, 1).unwrap();
    let mirrored = inst.mirrored();
    let far = Instant::now() + Duration::from_secs(300);
    let ratio = |timeline: &Instance, aligned: Option<u64>| {
        let order = timeline.by_start(0..inst.len() as u32);
        let plan = match aligned {
            Some(factor) => aligned_fit_before(timeline, &order, factor, u64::MAX, far).0.unwrap(),
            None => fit_before(timeline, &order, u64::MAX, far).0.unwrap(),
        };
        checked(&buffers, &plan).1 as f64 / inst.lower_bound() as f64
    };
    let fit = ratio(&inst, None).min(ratio(&mirrored, None));
    let aligned = ratio(&mirrored, Some(4));
    assert!(fit > 1.06 && aligned < 1.05, "best fit by start {fit:.4}, the neighbours' ends backwards {aligned:.4}");
}

#[test]
fn on_serving_a_prompt_s_rows_placed_first_keep_their_slot_among_the_caches() {
    // Seed 11: the bound is reached in a prefill, three MLP rows of 3.7% of the bound each on top of the caches.
    let buffers = large_graph(GraphFamily::Serving, 11);
    let inst = Instance::new(&buffers, 1).unwrap();
    let part: Vec<u32> = (0..inst.len() as u32).collect();
    let far = Instant::now() + Duration::from_secs(300);
    let ratio = |first| {
        let plan = aligned_fit_before(&inst, &fit_order(&inst, &part, first), 16, u64::MAX, far).0.unwrap();
        checked(&buffers, &plan).1 as f64 / inst.lower_bound() as f64
    };
    let (after, before) = (ratio(First::Nothing), ratio(First::Bytes(20)));
    assert!(before < 1.04 && after > 1.07, "the large buffers first {before:.4}, with the rest {after:.4}");
}

#[test]
fn the_runs_keep_the_best_plan_of_them_all() {
    let buffers = random_instance(3_000, 11);
    let inst = Instance::new(&buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    let far = Instant::now() + Duration::from_secs(120);
    let arenas = each_run_s_arena(&buffers, &inst, &order, far);
    let least = *arenas.iter().min().unwrap();
    let Runs { best, .. } = best_of_runs(&inst, &order, 0, u64::MAX, far, &mut Trace::all());
    let (plan, arena) = best.unwrap();
    assert_eq!((checked(&buffers, &plan).1, arena), (least, least));
    // Only a plan that beats the ceiling is kept; one that meets the target ends the runs.
    assert_eq!(best_of_runs(&inst, &order, 0, least, far, &mut Trace::all()).best, None);
    assert_eq!(best_of_runs(&inst, &order, 0, least + 1, far, &mut Trace::all()).best.map(|b| b.1), Some(least));
    assert!(arenas[0] > least, "{arenas:?}");
    let first = best_of_runs(&inst, &order, arenas[0], u64::MAX, far, &mut Trace::all()).best;
    assert_eq!(first.map(|b| b.1), Some(arenas[0]));
}

#[test]
fn the_squeaky_wheel_takes_the_runs_best_below_every_run_s() {
    let buffers = random_instance(6_000, 5);
    let inst = Instance::new(&buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    let far = Instant::now() + Duration::from_secs(120);
    let least = *each_run_s_arena(&buffers, &inst, &order, far).iter().min().unwrap();
    let bound = inst.lower_bound();
    assert!(least > bound);
    let (plan, arena) = best_of_runs(&inst, &order, bound, u64::MAX, far, &mut Trace::all()).best.unwrap();
    assert_eq!(checked(&buffers, &plan).1, arena);
    assert!(arena < least, "{arena} against the runs' {least}");
    assert_eq!(arena, bound, "found by trying seeds: the wheel reaches the bound here");
}

#[test]
fn the_kind_that_found_the_better_plan_gets_two_thirds_of_the_time() {
    let queue = |runs: &'static [(Run, bool)], next, seconds, best| Queue { runs: runs.to_vec(), next, seconds, best };
    let (floors, fits) = (&FLOOR_RUNS[..], &FIT_RUNS[..]);
    // Nothing run yet, or nothing found: lowest floor first, then whichever has had less time.
    assert_eq!(next_kind(&queue(floors, 0, 0.0, u64::MAX), &queue(fits, 0, 0.0, u64::MAX)), Some(0));
    assert_eq!(next_kind(&queue(floors, 1, 0.5, u64::MAX), &queue(fits, 0, 0.0, u64::MAX)), Some(1));
    assert_eq!(next_kind(&queue(floors, 1, 0.5, u64::MAX), &queue(fits, 1, 0.6, u64::MAX)), Some(0));
    // The leader runs until it has had twice the other's time.
    assert_eq!(next_kind(&queue(floors, 2, 1.9, 100), &queue(fits, 1, 1.0, 110)), Some(0));
    assert_eq!(next_kind(&queue(floors, 2, 2.1, 100), &queue(fits, 1, 1.0, 110)), Some(1));
    assert_eq!(next_kind(&queue(floors, 1, 1.0, 110), &queue(fits, 2, 1.9, 100)), Some(1));
    assert_eq!(next_kind(&queue(floors, 1, 1.0, 110), &queue(fits, 2, 2.1, 100)), Some(0));
    // A kind whose runs are all done leaves the time to the other.
    assert_eq!(next_kind(&queue(floors, floors.len(), 0.1, 100), &queue(fits, 1, 3.0, 110)), Some(1));
    assert_eq!(next_kind(&queue(floors, 1, 3.0, 110), &queue(fits, fits.len(), 0.1, 100)), Some(0));
    assert_eq!(next_kind(&queue(floors, floors.len(), 0.0, 0), &queue(fits, fits.len(), 0.0, 0)), None);
}

#[test]
fn the_wheel_has_its_turn_only_where_a_floor_run_leads_above_the_bound() {
    let bound = 100;
    assert!(wheel_s_turn(Some(110), 110, bound), "a floor run's plan is the best");
    assert!(!wheel_s_turn(Some(105), 110, bound), "best fit's plan is the best");
    assert!(!wheel_s_turn(Some(100), 100, bound), "at the bound already");
    assert!(!wheel_s_turn(None, u64::MAX, bound), "no plan");
}
