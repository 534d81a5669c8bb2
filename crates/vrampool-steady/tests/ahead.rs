//! Plans made ahead at a step's largest shape, serving smaller steps from the first, on host memory:
//! every live buffer holds a pattern of its own, checked when it is freed, and every step's buffers
//! (address, size, lifetime) go through the planner's validator, so no two live buffers ever share a
//! byte, whichever served them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use vrampool_core::{Device, MemoryResource, Pool, PoolConfig, SimDevice, SimMode, StreamId};
use vrampool_plan::{validate, Buffer};
use vrampool_steady::{AheadBuffer, AheadPlan, PlannedMode, PlannedStats};

const S0: StreamId = StreamId(0);
const UNIT: u64 = 64 << 10;

/// One step's script: allocate `size` on a stream, or free the `n`-th allocation of the step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Alloc(u64, StreamId),
    Free(usize),
}

/// A transformer-like step at sequence length `seq` (in units): activations kept for the backward,
/// temporaries, gradients; sizes grow with `seq`.
fn step(seq: u64, layers: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut kept = Vec::new();
    let mut n = 0;
    for layer in 0..layers as u64 {
        ops.push(Op::Alloc(seq * UNIT * (1 + layer % 2), S0)); // activation
        kept.push(n);
        ops.push(Op::Alloc(seq * seq * UNIT / 4 + UNIT, S0)); // attention scores, a temporary
        ops.push(Op::Free(n + 1));
        n += 2;
    }
    ops.push(Op::Alloc(seq * UNIT, S0)); // the loss
    let loss = n;
    n += 1;
    for &activation in kept.iter().rev() {
        ops.push(Op::Alloc(seq * UNIT, S0)); // a gradient
        ops.push(Op::Free(activation));
        ops.push(Op::Free(n));
        n += 1;
    }
    ops.push(Op::Free(loss));
    ops
}

/// The step's buffers as a plan ahead takes them: in allocation order, live between their events.
fn ahead_buffers(ops: &[Op]) -> Vec<AheadBuffer> {
    let mut buffers: Vec<AheadBuffer> = Vec::new();
    for (t, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc(size, stream) => buffers.push(AheadBuffer::new(stream, size, t as u64, ops.len() as u64 + 1)),
            Op::Free(n) => buffers[n].upper = t as u64,
        }
    }
    buffers
}

struct Harness {
    sim: Arc<SimDevice>,
    mode: PlannedMode<Pool>,
    fill: u8,
}

impl Harness {
    fn new(plan: &AheadPlan) -> Self {
        let sim = Arc::new(SimDevice::new(4 << 30, SimMode::HostBacked));
        let mode = PlannedMode::steady(Pool::new(sim.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
        mode.planned().set_ahead(Some(Arc::new(plan.clone()))).unwrap();
        Harness { sim, mode, fill: 0 }
    }

    /// Runs a step (every buffer freed by its end, or at the end if the script leaves it live) and checks
    /// its bytes and, with the validator, that no two of its buffers live at once shared a byte.
    fn run(&mut self, ops: &[Op]) -> Vec<u64> {
        let mut addrs = Vec::new();
        let mut live: HashMap<usize, (u64, u64, u8, u64)> = HashMap::new();
        let mut seen: Vec<Buffer> = Vec::new();
        let mut placed: Vec<u64> = Vec::new();
        let mut free = |h: &mut Harness, live: &mut HashMap<usize, (u64, u64, u8, u64)>, n: usize, t: u64| {
            let (addr, size, fill, born) = live.remove(&n).expect("a live buffer");
            assert!(h.sim.read(addr, size).unwrap().iter().all(|&b| b == fill), "buffer {n} at {addr:#x} was overwritten");
            h.mode.free(addr, Some(size), None).unwrap();
            seen.push(Buffer::new(n as u64, born, t, size));
            placed.push(addr);
        };
        for (t, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc(size, stream) => {
                    let addr = self.mode.allocate(size, stream).unwrap();
                    self.fill = self.fill.wrapping_add(1).max(1);
                    self.sim.write(addr, &vec![self.fill; size as usize]).unwrap();
                    live.insert(addrs.len(), (addr, size, self.fill, t as u64));
                    addrs.push(addr);
                }
                Op::Free(n) => free(self, &mut live, n, t as u64),
            }
        }
        let end = ops.len() as u64;
        for n in live.keys().copied().collect::<Vec<_>>() {
            free(self, &mut live, n, end);
        }
        validate(&seen, &placed, 1).expect("no two live buffers of the step share a byte");
        addrs
    }

    fn stats(&self) -> PlannedStats {
        self.mode.planned_stats().unwrap()
    }
}

fn plan_of(ops: &[Op]) -> AheadPlan {
    AheadPlan::plan(&ahead_buffers(ops), 512, Duration::from_millis(50)).unwrap()
}

#[test]
fn smaller_steps_are_served_from_the_first_and_never_share_bytes() {
    let plan = plan_of(&step(8, 6));
    assert!(plan.arena_bytes() <= plan.lower_bound_bytes() + (plan.lower_bound_bytes() >> 6));
    let mut h = Harness::new(&plan);
    let allocations = |seq: u64| step(seq, 6).iter().filter(|op| matches!(op, Op::Alloc(..))).count() as u64;
    let mut expected = 0;
    for seq in [3, 8, 5, 1, 7, 8, 2] {
        h.run(&step(seq, 6));
        expected += allocations(seq);
        let stats = h.stats();
        assert_eq!((stats.planned_allocations, stats.dynamic_allocations, stats.fallbacks), (expected, 0, 0), "seq {seq}");
    }
    assert_eq!(h.stats().replayed_iterations, 7);
}

#[test]
fn the_arena_is_taken_once_and_steps_that_fit_make_no_device_call() {
    let plan = plan_of(&step(8, 4));
    let mut h = Harness::new(&plan);
    let calls = |sim: &SimDevice| {
        let c = sim.counters();
        c.alloc_calls + c.free_calls + c.map_calls + c.unmap_calls + c.stream_syncs
    };
    let (taken, pool_blocks) = (calls(&h.sim), h.mode.upstream().stats().allocation.allocated);
    for seq in [8, 2, 6, 4] {
        h.run(&step(seq, 4));
    }
    assert_eq!(calls(&h.sim), taken, "no device call after the plan is set");
    assert_eq!(h.mode.upstream().stats().allocation.allocated, pool_blocks, "and no pool block");
    assert_eq!((h.stats().arena_blocks_taken, h.stats().arena_bytes), (1, plan.arena_bytes().next_multiple_of(2 << 20)));
}

#[test]
fn a_larger_or_other_step_falls_back_from_its_first_misfit_and_loses_nothing() {
    let plan = plan_of(&step(4, 4));
    let mut h = Harness::new(&plan);
    h.run(&step(6, 4)); // larger from its first buffer: all the pool's
    let larger = h.stats();
    assert_eq!((larger.planned_allocations, larger.fallbacks), (0, 1));
    // The same step with two more layers: served up to the plan's end, the rest from the pool.
    let longer = step(4, 6);
    h.run(&longer);
    let stats = h.stats();
    assert_eq!(stats.fallbacks, 2);
    assert!(stats.planned_allocations > 0 && stats.dynamic_allocations > larger.dynamic_allocations);
    // Another stream for the same sizes: the pool's, from the first.
    let other: Vec<Op> =
        step(4, 4).into_iter().map(|op| if let Op::Alloc(size, _) = op { Op::Alloc(size, StreamId(9)) } else { op }).collect();
    h.run(&other);
    assert_eq!(h.stats().fallbacks, 3);
    h.run(&step(4, 4));
    assert_eq!(h.stats().fallbacks, 3, "the plan's own step still fits");
}

#[test]
fn an_arena_buffer_used_on_another_stream_retires_its_region_until_it_is_free() {
    let plan = plan_of(&step(4, 4));
    let mut h = Harness::new(&plan);
    let a = h.mode.allocate(4 * UNIT, S0).unwrap();
    h.mode.record_stream(a, StreamId(5)).unwrap();
    assert!(h.mode.planned().claims(a));
    // a's bytes may be in use on stream 5 after its free: its region serves nothing more.
    let b = h.mode.allocate(4 * 4 * UNIT / 4 + UNIT, S0).unwrap();
    assert!(!h.mode.planned().claims(b), "the pool's");
    assert_eq!((h.stats().fallbacks, h.stats().dynamic_allocations), (0, 1), "the step still follows the plan");
    h.mode.free(b, None, None).unwrap();
    h.mode.free(a, None, None).unwrap();
    h.mode.step(0);
    let stats = h.stats();
    assert_eq!((stats.arena_blocks_taken, stats.arena_blocks_returned), (2, 1), "a fresh region for the retired one");
    let dynamic = h.stats().dynamic_allocations;
    h.run(&step(4, 4));
    assert_eq!(h.stats().dynamic_allocations, dynamic, "the next step is served whole");
}

/// A loop that keeps the last batch until the next one exists (the new batch's planned bytes are the
/// old one's), over a plan of a `batch` and two 4 MiB buffers; the last batch freed at the end.
/// Steps end at `step()` if `marked`, else by themselves. The plan's stats after four steps.
fn batches_kept_a_step(batch: u64, marked: bool) -> PlannedStats {
    let buffers = [AheadBuffer::new(S0, batch, 0, 4), AheadBuffer::new(S0, 4 << 20, 1, 2), AheadBuffer::new(S0, 4 << 20, 2, 3)];
    let plan = AheadPlan::plan(&buffers, 512, Duration::from_millis(10)).unwrap();
    let h = Harness::new(&plan);
    let mut previous = None;
    let mut batches = HashMap::new();
    for i in 0..4u8 {
        let at = h.mode.allocate(batch, S0).unwrap();
        h.sim.write(at, &vec![i + 1; batch as usize]).unwrap();
        batches.insert(at, i + 1);
        if let Some(old) = previous.replace(at) {
            assert!(h.sim.read(old, batch).unwrap().iter().all(|&b| b == batches[&old]), "the last batch is intact");
            h.mode.free(old, None, None).unwrap();
        }
        for _ in 0..2 {
            let a = h.mode.allocate(4 << 20, S0).unwrap();
            h.mode.free(a, None, None).unwrap();
        }
        if marked {
            h.mode.step(0);
        }
    }
    h.mode.free(previous.unwrap(), None, None).unwrap();
    h.stats()
}

#[test]
fn a_batch_whose_planned_bytes_the_last_one_holds_goes_to_the_room_above_the_plan() {
    // The region has room above the plan's bytes for the batch (planned live for the whole step):
    // steps 2 and 4 put theirs there, with or without step markers.
    for marked in [true, false] {
        for (batch, region) in [(1 << 20, 6 << 20), (2 << 20, 8 << 20)] {
            let stats = batches_kept_a_step(batch, marked);
            let figures = (stats.planned_allocations, stats.dynamic_allocations, stats.fallbacks, stats.replayed_iterations);
            assert_eq!(figures, (12, 0, 0, 4), "batch {batch}, marked: {marked}");
            assert_eq!(stats.arena_bytes, region, "batch {batch}");
        }
    }
}

/// A plan of a run's first step (`weights` made first and kept, then `first`) and its `largest`
/// step, on one timeline: the weights live to the end, every other buffer between its events.
fn plan_with_first_step(weights: &[u64], first: &[Op], largest: &[Op]) -> AheadPlan {
    let warm_len = (weights.len() + first.len()) as u64 + 1;
    let end = warm_len + largest.len() as u64 + 1;
    let mut buffers: Vec<AheadBuffer> = weights.iter().enumerate().map(|(t, &size)| AheadBuffer::new(S0, size, t as u64, end)).collect();
    let shifted =
        |ops: &[Op], by: u64| ahead_buffers(ops).into_iter().map(move |b| AheadBuffer::new(b.stream, b.size, by + b.lower, by + b.upper));
    buffers.extend(shifted(first, weights.len() as u64));
    let lead = buffers.len();
    buffers.extend(shifted(largest, warm_len));
    AheadPlan::plan(&buffers, 512, Duration::from_millis(50)).unwrap().with_first_step(lead).unwrap()
}

/// The weights, allocated first, each filled with a pattern of its own: (address, size, pattern).
fn make_weights(h: &Harness, weights: &[u64]) -> Vec<(u64, u64, u8)> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let at = h.mode.allocate(size, S0).unwrap();
            h.sim.write(at, &vec![0xA0 + i as u8; size as usize]).unwrap();
            (at, size, 0xA0 + i as u8)
        })
        .collect()
}

fn weights_intact(h: &Harness, kept: &[(u64, u64, u8)]) -> bool {
    kept.iter().all(|&(at, size, fill)| h.sim.read(at, size).unwrap().iter().all(|&b| b == fill))
}

const WEIGHTS: [u64; 5] = [3 << 20, 512, 1 << 20, 4096, 2 << 20];

#[test]
fn a_plan_with_a_first_step_keeps_the_weights_in_the_arena_and_makes_no_device_call_after_it() {
    let first = step(5, 4);
    let plan = plan_with_first_step(&WEIGHTS, &first, &step(8, 4));
    let lead = WEIGHTS.len() + ahead_buffers(&first).len();
    assert_eq!(plan.first_step(), lead);
    let mut h = Harness::new(&plan);
    let calls = |sim: &SimDevice| {
        let c = sim.counters();
        c.alloc_calls + c.free_calls + c.map_calls + c.unmap_calls
    };
    let taken = calls(&h.sim);
    // The weights, then the first step: every buffer at its place.
    let kept = make_weights(&h, &WEIGHTS);
    h.run(&first);
    let stats = h.stats();
    assert_eq!((stats.planned_allocations, stats.dynamic_allocations, stats.fallbacks), (lead as u64, 0, 0));
    assert_eq!(stats.replayed_iterations, 1, "the first step ended once only the weights were left");
    // Every later step, smaller or the largest: the steps' part of the plan, beside the weights.
    for seq in [8, 3, 6, 8, 1] {
        h.run(&step(seq, 4));
        assert!(weights_intact(&h, &kept), "seq {seq}");
    }
    let stats = h.stats();
    assert_eq!((stats.dynamic_allocations, stats.fallbacks, stats.replayed_iterations), (0, 0, 6));
    assert_eq!(calls(&h.sim), taken, "no device call after the arena");
    for (at, size, _) in kept {
        h.mode.free(at, Some(size), None).unwrap();
    }
}

#[test]
fn a_first_step_that_leaves_no_buffer_for_the_steps_is_refused() {
    let buffers = [AheadBuffer::new(S0, 1024, 0, 2), AheadBuffer::new(S0, 1024, 1, 3)];
    let plan = AheadPlan::plan(&buffers, 512, Duration::ZERO).unwrap();
    assert!(plan.clone().with_first_step(1).is_ok());
    let err = plan.with_first_step(2).unwrap_err().to_string();
    assert!(err.contains("leaves none of the plan's 2"), "{err}");
}

#[test]
fn a_plan_aligned_below_the_pool_or_set_while_arena_buffers_live_is_refused_and_changes_nothing() {
    let buffers = [AheadBuffer::new(S0, 512, 0, 2), AheadBuffer::new(S0, 512, 1, 2)];
    let sim = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
    let config = PoolConfig { alignment: 4096, ..PoolConfig::default() };
    let mode = PlannedMode::steady(Pool::new(sim as Arc<dyn Device>, config).unwrap());
    let loose = Arc::new(AheadPlan::plan(&buffers, 512, Duration::ZERO).unwrap());
    assert!(mode.planned().set_ahead(Some(loose)).is_err(), "512-byte offsets in a pool of 4 KiB blocks");
    let plan = Arc::new(AheadPlan::plan(&buffers, 4096, Duration::ZERO).unwrap());
    mode.planned().set_ahead(Some(plan.clone())).unwrap();
    let a = mode.allocate(512, S0).unwrap();
    assert_eq!(a % 4096, 0);
    assert!(mode.planned().set_ahead(Some(plan.clone())).is_err(), "a is live in the plan's bytes");
    let b = mode.allocate(512, S0).unwrap();
    assert_eq!((b % 4096, mode.planned_stats().unwrap().planned_allocations), (0, 2), "the plan set still serves");
    mode.free(a, None, None).unwrap();
    mode.free(b, None, None).unwrap();
    mode.planned().set_ahead(Some(plan)).unwrap();
}

#[test]
fn plans_with_overlapping_or_misaligned_offsets_are_refused() {
    let buffers = [AheadBuffer::new(S0, 1024, 0, 2), AheadBuffer::new(S0, 1024, 1, 3)];
    assert!(AheadPlan::with_offsets(&buffers, &[0, 1024], 512).is_ok());
    for bad in [&[0u64, 512][..], &[0, 100], &[0]] {
        assert!(AheadPlan::with_offsets(&buffers, bad, 512).is_err(), "{bad:?}");
    }
    // Two streams: each its own region, so the same offsets are fine.
    let two = [AheadBuffer::new(S0, 1024, 0, 2), AheadBuffer::new(StreamId(3), 1024, 1, 3)];
    let plan = AheadPlan::with_offsets(&two, &[0, 0], 512).unwrap();
    assert_eq!(plan.arena_bytes(), 2048);
}

#[test]
fn a_plan_is_refused_while_steady_arena_buffers_live() {
    let sim = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
    let mode = PlannedMode::steady(Pool::new(sim as Arc<dyn Device>, PoolConfig::default()).unwrap());
    let loop_step = || (0..10).map(|i| mode.allocate(4096 * (1 + i), S0).unwrap()).collect::<Vec<_>>();
    for addrs in [loop_step(), loop_step()] {
        addrs.into_iter().for_each(|a| mode.free(a, None, None).unwrap());
    }
    let live = loop_step(); // served from the steady arena
    let plan = Arc::new(plan_of(&step(2, 2)));
    assert!(mode.planned().set_ahead(Some(plan.clone())).is_err());
    live.into_iter().for_each(|a| mode.free(a, None, None).unwrap());
    mode.planned().set_ahead(Some(plan)).unwrap();
    mode.planned().set_ahead(None).unwrap();
}

/// Steps drawn around a largest one: smaller sequence lengths, some with a layer dropped or two frees
/// swapped, a few larger.
fn steps() -> impl Strategy<Value = Vec<(u64, usize, Option<usize>)>> {
    prop::collection::vec((1u64..10, 2usize..6, prop::option::of(0usize..40)), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_first_step_of_any_shape_and_the_steps_after_it_never_touch_the_weights(first in (1u64..10, 2usize..6), script in steps()) {
        let plan = plan_with_first_step(&WEIGHTS, &step(6, 4), &step(8, 4));
        let mut h = Harness::new(&plan);
        let kept = make_weights(&h, &WEIGHTS);
        for (seq, layers, swap) in std::iter::once((first.0, first.1, None)).chain(script) {
            let mut ops = step(seq, layers);
            if let Some(at) = swap.filter(|&at| at + 1 < ops.len()) {
                if matches!((ops[at], ops[at + 1]), (Op::Free(_), Op::Free(_))) {
                    ops.swap(at, at + 1);
                }
            }
            h.run(&ops);
            prop_assert!(weights_intact(&h, &kept));
        }
        prop_assert_eq!(h.stats().arena_live, WEIGHTS.len());
    }

    #[test]
    fn no_two_live_buffers_ever_share_a_byte(script in steps()) {
        let plan = plan_of(&step(8, 4));
        let mut h = Harness::new(&plan);
        for (seq, layers, swap) in script {
            let mut ops = step(seq, layers);
            if let Some(at) = swap.filter(|&at| at + 1 < ops.len()) {
                if matches!((ops[at], ops[at + 1]), (Op::Free(_), Op::Free(_))) {
                    ops.swap(at, at + 1);
                }
            }
            h.run(&ops);
        }
        prop_assert_eq!(h.stats().arena_live, 0);
    }
}
