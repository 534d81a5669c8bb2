use super::*;
use crate::{random_instance, validate, Buffer};
use std::time::Duration;

fn whole(buffers: &[Buffer]) -> (Instance, Vec<u32>) {
    (Instance::new(buffers, 1).unwrap(), (0..buffers.len() as u32).collect())
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[test]
fn the_skyline_reads_what_was_raised() {
    // Random raises and reads against a plain array, on timelines of every length up to 40.
    let mut state = 12_345u64;
    let mut below = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    for n in 1..40u64 {
        let mut skyline = Skyline::new(n as usize);
        let mut plain = vec![0u64; n as usize];
        for _ in 0..200 {
            let lo = below(n);
            let hi = lo + 1 + below(n - lo);
            let value = below(1_000);
            skyline.raise(lo as u32, hi as u32, value);
            plain[lo as usize..hi as usize].iter_mut().for_each(|v| *v = (*v).max(value));
            let lo = below(n);
            let hi = lo + 1 + below(n - lo);
            let want = plain[lo as usize..hi as usize].iter().copied().max().unwrap();
            assert_eq!(skyline.highest(lo as u32, hi as u32), want, "n={n} {lo}..{hi}");
        }
    }
}

#[test]
fn by_start_each_buffer_sits_on_the_earlier_ones_it_meets() {
    // A staircase where every buffer meets every other: each on top of all that started before it.
    let stairs: Vec<Buffer> = (0..50).map(|i| Buffer::new(i, i, i + 50, 1 + i % 7)).collect();
    let offsets = floors_by_start(&Instance::new(&stairs, 1).unwrap());
    let mut top = 0;
    for (b, &o) in stairs.iter().zip(&offsets) {
        assert_eq!(o, top);
        top += b.size;
    }
    // c starts during a's life and goes on it; b meets only c and goes on top of c; d meets none and goes to
    // the floor. Any instance gets a valid plan.
    let (a, b, c, d) =
        (Buffer::new(0, 0, 2, 5), Buffer::new(1, 2, 4, 9), Buffer::new(2, 1, 3, 4), Buffer::new(3, 4, 6, 7));
    assert_eq!(floors_by_start(&Instance::new(&[a, b, c, d], 1).unwrap()), [0, 9, 5, 0]);
    let buffers = random_instance(3_000, 4);
    let offsets = floors_by_start(&Instance::new(&buffers, 1).unwrap());
    let arena = validate(&buffers, &offsets, 1).unwrap();
    assert_eq!(arena, buffers.iter().zip(&offsets).map(|(b, o)| o + b.size).max().unwrap());
}

/// Lowest floor first the slow way: every floor read afresh at every step, the promoted buffers first.
fn plainly(inst: &Instance, part: &[u32], order: Order, promoted: &[bool]) -> Vec<u64> {
    let (rank, _) = ranks(inst, part, &live(inst, part), order);
    let mut top = vec![0u64; inst.segments];
    let mut offsets = vec![None; part.len()];
    while let Some((_, floor, _, p)) = (0..part.len())
        .filter(|&p| offsets[p].is_none())
        .map(|p| {
            let i = part[p] as usize;
            let floor = top[inst.lo[i] as usize..inst.hi[i] as usize].iter().copied().max().unwrap_or(0);
            (!promoted[p], floor, rank[p], p)
        })
        .min()
    {
        let i = part[p] as usize;
        top[inst.lo[i] as usize..inst.hi[i] as usize].iter_mut().for_each(|t| *t = floor + inst.size[i]);
        offsets[p] = Some(floor);
    }
    offsets.into_iter().map(|o| o.unwrap()).collect()
}

#[test]
fn the_heap_places_as_reading_every_floor_afresh_would() {
    for seed in 0..20 {
        let buffers = random_instance(120, seed);
        let (inst, part) = whole(&buffers);
        for order in [Order::Time, Order::Wat, Order::Taw, Order::Twa, Order::Area] {
            let fast = lowest_floor_first(&inst, &part, order, u64::MAX, far()).unwrap();
            assert_eq!(fast, plainly(&inst, &part, order, &vec![false; part.len()]), "seed {seed} {order:?}");
            validate(&buffers, &fast, 1).unwrap();
        }
    }
}

#[test]
fn promoted_buffers_go_first_as_reading_every_floor_afresh_would() {
    let mut coin = crate::rng::SplitMix64(5);
    for seed in 0..20 {
        let buffers = random_instance(120, seed);
        let (inst, part) = whole(&buffers);
        let promoted: Vec<bool> = part.iter().map(|_| coin.below(4) == 0).collect();
        for order in [Order::Time, Order::Wat, Order::Taw, Order::Twa, Order::Area] {
            let fast = lowest_floor_first_promoting(&inst, &part, order, &promoted, u64::MAX, far()).unwrap();
            assert_eq!(fast, plainly(&inst, &part, order, &promoted), "seed {seed} {order:?}");
            validate(&buffers, &fast, 1).unwrap();
            assert_ne!(
                fast,
                lowest_floor_first(&inst, &part, order, u64::MAX, far()).unwrap(),
                "seed {seed} {order:?}"
            );
        }
    }
}

#[test]
fn it_gives_up_above_the_arena_to_beat_or_at_the_deadline() {
    let buffers = random_instance(2_000, 3);
    let (inst, part) = whole(&buffers);
    let plan = lowest_floor_first(&inst, &part, Order::Wat, u64::MAX, far()).unwrap();
    let arena = validate(&buffers, &plan, 1).unwrap();
    assert_eq!(lowest_floor_first(&inst, &part, Order::Wat, arena, far()), Some(plan));
    assert_eq!(lowest_floor_first(&inst, &part, Order::Wat, arena - 1, far()), None);
    assert_eq!(lowest_floor_first(&inst, &part, Order::Wat, u64::MAX, Instant::now()), None);
}

#[test]
fn a_growing_cache_leaves_no_hole_behind() {
    // A cache of 4 bytes grown to 5, then 6, with a temporary beside each copy: best fit by start leaves
    // each old slot too small for the next; lowest floor first puts the next above and the one after it
    // back at 0, at the bound.
    let buffers = [
        Buffer::new(0, 0, 3, 4),
        Buffer::new(1, 2, 5, 5),
        Buffer::new(2, 4, 7, 6),
        Buffer::new(3, 1, 2, 5),
        Buffer::new(4, 5, 6, 5),
    ];
    let (inst, part) = whole(&buffers);
    for order in [Order::Wat, Order::Twa, Order::Time] {
        let offsets = lowest_floor_first(&inst, &part, order, u64::MAX, far()).unwrap();
        assert_eq!(validate(&buffers, &offsets, 1).unwrap(), crate::lower_bound(&buffers), "{order:?}");
    }
}

#[test]
fn the_projection_is_the_skyline_plus_what_is_left_and_never_above_the_run_s_end() {
    // Lowest floor first the plain way, with the projection read after every placement against the skyline
    // plus the bytes left at every moment, and against where the run ends.
    for seed in 0..30 {
        let buffers = random_instance(80, seed);
        let (inst, part) = whole(&buffers);
        let live = live(&inst, &part);
        let mut projection = Projection::new(&live);
        let (mut top, mut left) = (vec![0u64; inst.segments], live.clone());
        let mut unplaced: Vec<usize> = (0..inst.len()).collect();
        let mut heights = Vec::new();
        while let Some(k) = (0..unplaced.len())
            .min_by_key(|&k| top[inst.lo[unplaced[k]] as usize..inst.hi[unplaced[k]] as usize].iter().max().copied())
        {
            let i = unplaced.swap_remove(k);
            let (lo, hi) = (inst.lo[i] as usize, inst.hi[i] as usize);
            let floor = top[lo..hi].iter().copied().max().unwrap();
            top[lo..hi].iter_mut().for_each(|t| *t = floor + inst.size[i]);
            left[lo..hi].iter_mut().for_each(|l| *l -= inst.size[i]);
            projection.place(lo as u32, hi as u32, floor + inst.size[i], inst.size[i]);
            let plain = top.iter().zip(&left).map(|(t, l)| t + l).max().unwrap();
            assert_eq!(projection.height(), plain, "seed {seed}");
            heights.push(plain);
        }
        let end = top.iter().copied().max().unwrap();
        assert_eq!(heights.last(), Some(&end), "seed {seed}: nothing left, the projection is the arena");
        assert!(heights.iter().all(|&h| h <= end), "seed {seed}: a projection above the end");
    }
}

#[test]
fn backwards_in_time_only_the_order_by_start_places_otherwise() {
    // A buffer's floor is the highest top over its lifetime whichever way time runs, and the other orders rank
    // by traits that do not see its direction; so with time backwards they place exactly as forwards.
    let mut by_start_differs = false;
    for seed in 0..10 {
        let (inst, part) = whole(&random_instance(400, seed));
        let back = inst.mirrored();
        for order in [Order::Wat, Order::Taw, Order::Twa, Order::Area] {
            let run = |timeline: &Instance| lowest_floor_first(timeline, &part, order, u64::MAX, far()).unwrap();
            assert_eq!(run(&inst), run(&back), "{order:?} seed {seed}");
        }
        let run = |timeline: &Instance| lowest_floor_first(timeline, &part, Order::Time, u64::MAX, far()).unwrap();
        by_start_differs |= run(&inst) != run(&back);
    }
    assert!(by_start_differs);
}

#[test]
fn settling_lowers_no_buffer_and_keeps_the_plan_valid() {
    // Best fit decreasing on sizes rounded up to classes leaves room above each buffer; settled, the plan
    // gives it back and stays valid, each buffer at or below where it was.
    let buffers = random_instance(3_000, 9);
    let (inst, part) = whole(&buffers);
    let classes = inst.in_classes(4).expect("ragged sizes");
    let loose = crate::greedy::best_fit_by_size_of(&classes, &part, None).unwrap();
    let mut offsets = vec![0; inst.len()];
    for (i, o) in settled(&inst, &part, &loose) {
        assert!(o <= loose[i as usize]);
        offsets[i as usize] = o;
    }
    let (before, after) = (validate(&buffers, &loose, 1).unwrap(), validate(&buffers, &offsets, 1).unwrap());
    assert!(after < before, "settled {after}, before {before}");
    // A buffer held up by nothing drops to the floor, and each of the others onto the one below it that it meets.
    let pair = [Buffer::new(0, 0, 4, 10), Buffer::new(1, 2, 6, 5), Buffer::new(2, 5, 8, 3)];
    let (inst, part) = whole(&pair);
    assert_eq!(settled(&inst, &part, &[7, 20, 40]), [(0, 0), (1, 10), (2, 15)]);
}
