use std::time::Duration;

use super::*;
use crate::exact::checked;
use crate::exact::placed::fit_before;
use crate::{random_instance, validate, Buffer};

/// Lowers the plan `offsets` of `buffers` with a minute to spare.
fn lowered(buffers: &[Buffer], offsets: &[u64]) -> (Vec<u64>, u64) {
    let inst = Instance::new(buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    let arena = validate(buffers, offsets, 1).unwrap();
    let plan = order.iter().map(|&i| (i, offsets[i as usize])).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (plan, reported) =
        lower_peaks(&inst, &order, vec![(plan, arena)], inst.lower_bound(), deadline, (&mut 0, &mut Trace::all()));
    let (offsets, arena) = checked(buffers, &plan);
    assert_eq!(reported, arena);
    (offsets, arena)
}

#[test]
fn a_peak_drops_into_a_hole_clear_of_the_buffers_that_stay() {
    // c lives throughout at 0; a and b stack on it before t = 2, d after it, but d sits on top of them all.
    let buffers = [
        Buffer::new(0, 0, 4, 4_000), // c
        Buffer::new(1, 0, 2, 4_000), // a
        Buffer::new(2, 0, 2, 4_000), // b
        Buffer::new(3, 2, 4, 8_000), // d
    ];
    let (offsets, arena) = lowered(&buffers, &[0, 4_000, 8_000, 12_000]);
    assert_eq!(arena, 12_000, "the bound");
    assert_eq!(offsets[3], 4_000, "d rests on c, which stays");
}

#[test]
fn a_peak_that_no_hole_takes_moves_with_its_band() {
    // At t = 2, c, e and d are live (12,000 bytes), but e sits 2,000 bytes above c, so d (on top) fits
    // in no hole; only d moved together with e reaches the bound.
    let buffers = [
        Buffer::new(0, 0, 4, 4_000), // c
        Buffer::new(1, 1, 3, 4_000), // e
        Buffer::new(2, 2, 4, 4_000), // d
    ];
    let (offsets, arena) = lowered(&buffers, &[0, 6_000, 10_000]);
    assert_eq!(arena, 12_000);
    assert_eq!(offsets[0], 0, "c is below every band and stays");
}

#[test]
fn of_two_plans_the_one_higher_at_first_can_end_lower() {
    // At t = 0, m and n are live with the spacers s and u between them; at t = 1, m and n with p, which
    // needs two adjacent units (units of 1,000 bytes; the bound is 4).
    let k = 1_000;
    let buffers = [
        Buffer::new(0, 0, 2, k),     // m
        Buffer::new(1, 0, 2, k),     // n
        Buffer::new(2, 0, 1, k),     // s
        Buffer::new(3, 0, 1, k),     // u
        Buffer::new(4, 1, 2, 2 * k), // p
    ];
    let inst = Instance::new(&buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    let placed = |offsets: [u64; 5]| -> Placed {
        let offsets = offsets.map(|o| o * k);
        (order.iter().map(|&i| (i, offsets[i as usize])).collect(), validate(&buffers, &offsets, 1).unwrap())
    };
    // m and n one unit apart with the spacers beside them: neither can move while the spacers stay, and the
    // spacers are never in p's band (they end before p begins), so p drops to 5 units at best.
    let stuck = placed([0, 2, 1, 3, 4]);
    // m and n side by side with the spacers above: p drops onto them, to the bound.
    let free = placed([0, 1, 2, 3, 5]);
    assert!(stuck.1 < free.1);
    let far = || Instant::now() + Duration::from_secs(60);
    let alone = lower_peaks(&inst, &order, vec![stuck.clone()], 4 * k, far(), (&mut 0, &mut Trace::all()));
    assert_eq!(alone.1, 5 * k);
    let both = lower_peaks(&inst, &order, vec![stuck, free], 4 * k, far(), (&mut 0, &mut Trace::all()));
    assert_eq!(checked(&buffers, &both.0).1, 4 * k);
    assert_eq!(both.1, 4 * k);
}

#[test]
fn a_random_plan_by_best_fit_is_lowered_and_stays_valid() {
    for seed in [3, 9] {
        let buffers = random_instance(1_500, seed);
        let inst = Instance::new(&buffers, 1).unwrap();
        let order = inst.by_start(0..inst.len() as u32);
        let far = Instant::now() + Duration::from_secs(60);
        let plan = fit_before(&inst, &order, u64::MAX, far).0.expect("no limit");
        let (offsets, before) = checked(&buffers, &plan);
        let (_, after) = lowered(&buffers, &offsets);
        // Best fit by start leaves 6-22% above the bound on these; the bands take most of it back.
        assert!(after < before, "seed {seed}: {after} not below {before}");
        // A deadline already passed leaves the plan as it was.
        let (kept, arena) = lower_peaks(
            &inst,
            &order,
            vec![(plan.clone(), before)],
            inst.lower_bound(),
            Instant::now(),
            (&mut 0, &mut Trace::all()),
        );
        assert_eq!((checked(&buffers, &kept).0, arena), (offsets, before));
    }
}

#[test]
fn the_overlaps_of_a_buffer_are_every_buffer_its_lifetime_meets_once() {
    let buffers = random_instance(400, 11);
    let inst = Instance::new(&buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    let overlaps = Overlaps::new(&inst, &order);
    for i in 0..inst.len() as u32 {
        let mut got = Vec::new();
        overlaps.each(i, |j| got.push(j));
        got.sort_unstable();
        let (lo, hi) = (inst.lo[i as usize], inst.hi[i as usize]);
        let want: Vec<u32> =
            (0..inst.len() as u32).filter(|&j| inst.lo[j as usize] < hi && lo < inst.hi[j as usize]).collect();
        assert_eq!(got, want, "buffer {i}");
    }
}

#[test]
fn a_band_s_obstacles_are_not_gathered_past_the_deadline() {
    let buffers = random_instance(400, 11);
    let inst = Instance::new(&buffers, 1).unwrap();
    let order = inst.by_start(0..inst.len() as u32);
    let overlaps = Overlaps::new(&inst, &order);
    let offset = crate::greedy::greedy_by_size_until(&inst, None).expect("no deadline");
    let band: Vec<u32> = order[..40].to_vec();
    let lowering = |deadline| Lowering {
        inst: &inst,
        order: &order,
        overlaps: &overlaps,
        offset: offset.clone(),
        target: 0,
        deadline,
    };
    assert!(lowering(Instant::now()).obstacles(&band).is_none(), "the deadline has passed");
    let gathered = lowering(Instant::now() + Duration::from_secs(60)).obstacles(&band).expect("time enough");
    assert_eq!(gathered.len(), band.len());
    assert!(gathered.iter().any(|spans| !spans.is_empty()));
    assert!(gathered.iter().all(|spans| spans.windows(2).all(|w| w[0].1 < w[1].0)), "sorted and merged");
}
