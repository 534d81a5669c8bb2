//! The steady mode (`PlannedMode::steady`) under threads and programs that do not repeat, on host
//! memory: every live buffer holds a pattern of its own, checked when it is freed, so an overlap
//! between live buffers (arena or pool) fails a test.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering::Acquire, Ordering::Release};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};

use vrampool_core::{BlockState, CachedFree, MemoryResource, Pool, PoolConfig, Scrub, SimDevice, SimMode, StreamId};
use vrampool_steady::{PlannedMode, PlannedPool};

fn steady() -> (PlannedMode<Pool>, Arc<SimDevice>) {
    let sim = Arc::new(SimDevice::new(1 << 32, SimMode::HostBacked));
    (PlannedMode::steady(Pool::new(sim.clone(), PoolConfig::default()).unwrap()), sim)
}

/// A live buffer: its address, size and pattern.
struct Tagged(u64, u64, u8);

fn tagged(mode: &PlannedMode<Pool>, sim: &SimDevice, size: u64, pattern: u8) -> Tagged {
    let addr = mode.allocate(size, StreamId(0)).unwrap();
    sim.write(addr, &vec![pattern; size as usize]).unwrap();
    Tagged(addr, size, pattern)
}

fn free(mode: &PlannedMode<Pool>, sim: &SimDevice, Tagged(addr, size, pattern): Tagged) {
    assert!(sim.read(addr, size).unwrap().iter().all(|&b| b == pattern), "a live buffer at {addr:#x} was overwritten");
    mode.free(addr, Some(size), None).unwrap();
}

/// One round of a thread's loop: 12 buffers, each freed three allocations later.
fn round(mode: &PlannedMode<Pool>, sim: &SimDevice, thread: u8) {
    let mut live = std::collections::VecDeque::new();
    for i in 0..12u64 {
        live.push_back(tagged(mode, sim, 4096 * (1 + (i + u64::from(thread)) % 5), thread * 16 + i as u8 + 1));
        if live.len() > 3 {
            free(mode, sim, live.pop_front().unwrap());
        }
    }
    live.into_iter().for_each(|b| free(mode, sim, b));
}

#[test]
fn threads_running_loops_of_their_own_on_one_pool_never_share_bytes() {
    let (mode, sim) = steady();
    (0..20).for_each(|_| round(&mode, &sim, 0));
    let alone = mode.planned_stats().unwrap();
    assert!(alone.planned_allocations >= 18 * 12, "one thread's loop is served: {alone:?}");
    // Four loops at once: they interleave in one schedule until the threads get lanes (two may share one);
    // no two live buffers share a byte whichever path served them.
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (mode, sim) = (&mode, &sim);
            s.spawn(move || (0..150).for_each(|_| round(mode, sim, t)));
        }
    });
    (0..20).for_each(|_| round(&mode, &sim, 0));
    let stats = mode.planned_stats().unwrap();
    assert_eq!((stats.arena_live, mode.stats().allocation.current), (0, 0));
    assert_eq!(stats.planned_allocations + stats.dynamic_allocations, (20 + 4 * 150 + 20) * 12);
}

#[test]
fn a_loop_whose_buffers_one_thread_allocates_and_another_frees_is_served() {
    // PyTorch's forward on the main thread, its backward (which frees the activations) on autograd's.
    let (mode, sim) = steady();
    let (to_free, freed) = (mpsc::channel::<Vec<Tagged>>(), mpsc::channel::<()>());
    std::thread::scope(|s| {
        let (mode, sim) = (&mode, &sim);
        s.spawn(move || {
            for batch in to_free.1 {
                batch.into_iter().rev().for_each(|b| free(mode, sim, b));
                freed.0.send(()).unwrap();
            }
        });
        for _ in 0..50 {
            let batch: Vec<Tagged> = (0..10).map(|i| tagged(mode, sim, 8192 * (1 + i % 3), 1 + i as u8)).collect();
            to_free.0.send(batch).unwrap();
            freed.1.recv().unwrap();
        }
        drop(to_free.0);
    });
    let stats = mode.planned_stats().unwrap();
    assert_eq!((stats.recorded_iterations, stats.replayed_iterations, stats.fallbacks), (1, 49, 0));
    assert_eq!(stats.planned_allocations, 49 * 10);
}

#[test]
fn a_program_that_never_repeats_stops_being_recorded() {
    let (mode, sim) = steady();
    // Pairs (too short to plan) of sizes that never repeat in a row.
    for i in 0..30_000u64 {
        let b = tagged(&mode, &sim, 512 * (1 + i % 97), 1 + (i % 200) as u8);
        free(&mode, &sim, b);
    }
    let pairs = mode.planned_stats().unwrap();
    assert!(pairs.idle_allocations > 27_000, "most of them go straight to the pool: {pairs:?}");
    // 64 buffers live at every moment, in an order that never repeats: the recording never ends, and is given
    // up at its limit.
    let (mode, sim) = steady();
    let mut live: Vec<Tagged> = Vec::new();
    let mut state = 7u64;
    for i in 0..100_000u64 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if live.len() == 64 {
            let victim = live.swap_remove((state >> 33) as usize % 64);
            free(&mode, &sim, victim);
        }
        live.push(tagged(&mode, &sim, 512 * (1 + (state >> 50) % 64), 1 + (i % 250) as u8));
    }
    live.into_iter().for_each(|b| free(&mode, &sim, b));
    let random = mode.planned_stats().unwrap();
    assert!(random.idle_allocations > 60_000, "{random:?}");
    assert_eq!((random.planned_allocations, random.recorded_iterations), (0, 0));
}

/// Two threads taking turns call by call: each call waits for its thread's turn.
struct Turns(AtomicUsize);

impl Turns {
    fn take<T>(&self, thread: usize, call: impl FnOnce() -> T) -> T {
        while self.0.load(Acquire) % 2 != thread {
            std::thread::yield_now();
        }
        let result = call();
        self.0.fetch_add(1, Release);
        result
    }
}

/// `round`, each call taken in turn with the other thread's.
fn round_in_turns(mode: &PlannedMode<Pool>, sim: &SimDevice, thread: u8, turns: &Turns) {
    let me = usize::from(thread % 2);
    let mut live = std::collections::VecDeque::new();
    for i in 0..12u64 {
        let size = 4096 * (1 + (i + u64::from(thread)) % 5);
        live.push_back(turns.take(me, || tagged(mode, sim, size, thread * 16 + i as u8 + 1)));
        if live.len() > 3 {
            let oldest = live.pop_front().unwrap();
            turns.take(me, || free(mode, sim, oldest));
        }
    }
    live.into_iter().for_each(|b| turns.take(me, || free(mode, sim, b)));
}

#[test]
fn two_threads_repeating_their_loops_at_once_are_each_served_from_an_arena_of_their_own() {
    let (mode, sim) = steady();
    let device_calls = |sim: &SimDevice| {
        let c = sim.counters();
        c.alloc_calls + c.free_calls + c.map_calls + c.unmap_calls + c.stream_syncs
    };
    // 30 rounds each, then 50 more, taken in turns by the same two threads.
    let (turns, barrier) = (Turns(AtomicUsize::new(0)), Barrier::new(3));
    let (before, calls) = std::thread::scope(|s| {
        for t in 1..=2u8 {
            let (mode, sim, turns, barrier) = (&mode, &sim, &turns, &barrier);
            s.spawn(move || {
                (0..30).for_each(|_| round_in_turns(mode, sim, t, turns));
                barrier.wait();
                barrier.wait();
                (0..50).for_each(|_| round_in_turns(mode, sim, t, turns));
            });
        }
        barrier.wait();
        let taken = (mode.planned_stats().unwrap(), device_calls(&sim));
        barrier.wait();
        taken
    });
    let after = mode.planned_stats().unwrap();
    assert_eq!(after.planned_allocations - before.planned_allocations, 2 * 50 * 12, "every allocation of both loops: {after:?}");
    assert_eq!(device_calls(&sim), calls, "no device call");
    assert!(after.plans.len() >= 2, "a schedule per thread: {after:?}");
    assert_eq!((after.arena_live, mode.stats().allocation.current), (0, 0));
    assert_eq!(mode.stats().allocation.allocated, 2 * 80 * 12, "each lane's arena buffers counted, its regions not");
    assert!(mode.release_idle_arena().unwrap() > 0);
    assert_eq!(mode.planned_stats().unwrap().arena_bytes, 0, "every lane's idle arena went back");
}

#[test]
fn with_an_arena_a_thread_each_buffer_is_shown_and_freed_whichever_thread_frees_it() {
    let (mode, sim) = steady();
    let (turns, barrier) = (Turns(AtomicUsize::new(0)), Barrier::new(3));
    let (to_main, held) = mpsc::channel::<Tagged>();
    let checked = std::thread::scope(|s| {
        for t in 1..=2u8 {
            let (mode, sim, turns, barrier, to_main) = (&mode, &sim, &turns, &barrier, to_main.clone());
            s.spawn(move || {
                (0..30).for_each(|_| round_in_turns(mode, sim, t, turns));
                // A served round's first two buffers, handed to the main thread.
                for i in 0..2u64 {
                    let size = 4096 * (1 + (i + u64::from(t)) % 5);
                    to_main.send(turns.take(usize::from(t % 2), || tagged(mode, sim, size, 200 + t * 2 + i as u8))).unwrap();
                }
                barrier.wait();
                barrier.wait();
                (0..20).for_each(|_| round_in_turns(mode, sim, t, turns));
            });
        }
        barrier.wait();
        // Checked with the threads waiting: a failed check lets them go on before it is reported.
        let checked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let held: Vec<Tagged> = held.try_iter().collect();
            assert_eq!(held.len(), 4);
            assert_eq!(mode.planned_stats().unwrap().arena_live, 4, "both threads' buffers come from their arenas");
            assert_eq!(mode.stats().allocation.current, 4);
            let shown: Vec<(u64, u64)> = mode.live_blocks(Vec::new()).iter().map(|b| (b.addr, b.requested)).collect();
            let mut expected: Vec<(u64, u64)> = held.iter().map(|b| (b.0, b.1)).collect();
            expected.sort_unstable();
            assert_eq!(shown, expected, "each live arena buffer is a block of its own");
            let active: Vec<(u64, u64)> = mode
                .snapshot()
                .iter()
                .flat_map(|s| s.segment.blocks.iter())
                .filter_map(|&(addr, _, state)| match state {
                    BlockState::Active { requested } => Some((addr, requested)),
                    _ => None,
                })
                .collect();
            assert_eq!(active, expected);
            // Freed by this thread, in an order that leaves both schedules: each lane answers for its own.
            let last = (held[0].0, held[0].1);
            held.into_iter().rev().for_each(|b| free(&mode, &sim, b));
            assert!(mode.free(last.0, Some(last.1), None).is_err(), "a double free is refused");
            assert_eq!((mode.stats().allocation.current, mode.planned_stats().unwrap().arena_live), (0, 0));
        }));
        barrier.wait();
        checked
    });
    checked.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert_eq!((mode.stats().allocation.current, mode.planned_stats().unwrap().arena_live), (0, 0));
    assert_eq!(mode.stats().allocation.allocated, 2 * 50 * 12 + 4);
}

#[test]
fn the_arenas_of_threads_that_have_gone_are_given_back_when_memory_runs_out() {
    // 64 MiB of device memory; each thread's loop holds a 20 MiB buffer a round.
    let sim = Arc::new(SimDevice::new(64 << 20, SimMode::AddressOnly));
    let mode = PlannedMode::steady(Pool::new(sim.clone(), PoolConfig::default()).unwrap());
    let turns = Turns(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..2usize {
            let (mode, turns) = (&mode, &turns);
            s.spawn(move || {
                for _ in 0..20 {
                    let sizes = [4096, 20 << 20, 8192, 4096, 12288, 4096, 8192, 4096];
                    let addrs: Vec<u64> = sizes.iter().map(|&size| turns.take(t, || mode.allocate(size, StreamId(0)).unwrap())).collect();
                    addrs.iter().zip(sizes).for_each(|(&addr, size)| turns.take(t, || mode.free(addr, Some(size), None).unwrap()));
                }
            });
        }
    });
    let stats = mode.planned_stats().unwrap();
    assert!(stats.arena_bytes >= 40 << 20, "both threads' loops have arenas: {stats:?}");
    // Both threads have exited; this one needs most of the device.
    let big = mode.allocate(48 << 20, StreamId(0)).expect("the idle arenas went back for it");
    mode.free(big, Some(48 << 20), None).unwrap();
    assert_eq!(mode.stats().allocation.current, 0);
}

#[test]
fn out_of_memory_counts_the_arenas_live_buffers_and_names_what_the_arena_holds() {
    // 64 MiB of device memory; a served loop of one 4 KiB buffer and ten of 2 MiB, whose last
    // iteration keeps the small one (a loss kept for logging): it keeps the arena's region from the
    // pool.
    let sim = Arc::new(SimDevice::new(64 << 20, SimMode::AddressOnly));
    let mode = PlannedMode::steady(Pool::new(sim.clone(), PoolConfig::default()).unwrap());
    let mut kept = 0;
    for i in 0..6 {
        let small = mode.allocate(4096, StreamId(0)).unwrap();
        let big: Vec<u64> = (0..10).map(|_| mode.allocate(2 << 20, StreamId(0)).unwrap()).collect();
        big.into_iter().for_each(|addr| mode.free(addr, Some(2 << 20), None).unwrap());
        match i {
            5 => kept = small,
            _ => mode.free(small, Some(4096), None).unwrap(),
        }
    }
    let stats = mode.planned_stats().unwrap();
    assert_eq!((stats.arena_live, stats.arena_live_block_bytes), (1, 4096), "the kept buffer is the arena's: {stats:?}");
    let err = mode.allocate(60 << 20, StreamId(0)).unwrap_err();
    let vrampool_core::PoolError::OutOfMemory(report) = err.clone() else { panic!("{err}") };
    assert_eq!(report.arena, vrampool_core::ArenaHeld { bytes: stats.arena_bytes, live_bytes: 4096, live_buffers: 1 });
    assert_eq!(report.allocated, 4096, "the live arena buffer counts as allocated");
    assert_eq!(report.unallocated(), report.reserved - stats.arena_bytes, "the arena's idle bytes are not the pool's to give");
    assert!(err.to_string().contains("4.00 KiB of them in 1 live buffer (a live arena buffer keeps its region"), "{err}");
    mode.free(kept, Some(4096), None).unwrap();
    let big = mode.allocate(60 << 20, StreamId(0)).expect("with the buffer freed, the arena goes back");
    mode.free(big, Some(60 << 20), None).unwrap();
}

/// A training step's activations, 13 MiB in all.
const ACTIVATIONS: [u64; 8] = [1 << 20, 2 << 20, 1 << 20, 3 << 20, 1 << 20, 2 << 20, 1 << 20, 2 << 20];

fn allocate_all(mode: &PlannedMode<Pool>, sizes: &[u64]) -> Vec<u64> {
    sizes.iter().map(|&size| mode.allocate(size, StreamId(0)).unwrap()).collect()
}

fn free_all(mode: &PlannedMode<Pool>, addrs: Vec<u64>, sizes: &[u64]) {
    addrs.into_iter().zip(sizes).for_each(|(addr, &size)| mode.free(addr, Some(size), None).unwrap());
}

/// The allocated peak and the allocations the arena served, once `kept` (buffers of `size` bytes)
/// are freed.
fn peak_and_served(mode: &PlannedMode<Pool>, kept: Vec<u64>, size: u64) -> (u64, u64) {
    let served = mode.planned_stats().map_or(0, |s| s.planned_allocations);
    let peak = mode.stats().allocated_bytes.peak;
    kept.into_iter().for_each(|addr| mode.free(addr, Some(size), None).unwrap());
    (peak, served)
}

/// What `run` returns over a steady mode and over the pool alone (the mode off), given that `run`
/// also returns how many allocations the arena served, which must be some with steady on.
fn steady_and_alone<T>(run: impl Fn(PlannedMode<Pool>) -> (T, u64)) -> (T, T) {
    let pool = || Pool::new(Arc::new(SimDevice::new(1 << 32, SimMode::AddressOnly)), PoolConfig::default()).unwrap();
    let (steady, served) = run(PlannedMode::steady(pool()));
    assert!(served > 0, "the steps were served from the arena");
    (steady, run(PlannedMode::new(pool())).0)
}

#[test]
fn a_trim_between_steps_leaves_what_the_pool_alone_leaves() {
    // PyTorch's loop: optimizer steps mark the boundaries, and each step first frees what the
    // last one kept (a loss, its gradients). A trim (`torch.cuda.empty_cache()`) just after those
    // frees finds the served iteration past its first steps with no arena buffer live.
    let reserved_after_trim = |mode: PlannedMode<Pool>| {
        let mut grads: Option<u64> = None;
        let mut reserved = 0;
        for it in 0..12 {
            let x = mode.allocate(1 << 20, StreamId(0)).unwrap();
            let acts = allocate_all(&mode, &ACTIVATIONS);
            let loss = mode.allocate(512, StreamId(0)).unwrap();
            // zero_grad frees the last step's gradients; backward makes new ones.
            grads.take().into_iter().for_each(|addr| mode.free(addr, Some(4 << 20), None).unwrap());
            grads = Some(mode.allocate(4 << 20, StreamId(0)).unwrap());
            free_all(&mode, acts, &ACTIVATIONS);
            mode.step(vrampool_steady::AUTO_KEY);
            // `del loss, x` after the optimizer step.
            mode.free(loss, Some(512), None).unwrap();
            mode.free(x, Some(1 << 20), None).unwrap();
            if it == 10 {
                mode.trim().unwrap();
                reserved = mode.stats().reserved_bytes.current;
            }
        }
        let served = mode.planned_stats().map_or(0, |s| s.planned_allocations);
        grads.into_iter().for_each(|addr| mode.free(addr, Some(4 << 20), None).unwrap());
        assert_eq!(mode.stats().allocation.current, 0);
        (reserved, served)
    };
    let (steady, alone) = steady_and_alone(reserved_after_trim);
    assert_eq!(steady, alone, "the trim gave the idle arena back");
}

#[test]
fn the_peak_of_a_served_step_that_frees_the_last_ones_buffers_is_the_pools() {
    // A training step frees the last step's gradients at `zero_grad`, midway, and makes new ones
    // in its backward pass: the pool held the old ones when the step began, so the step's peak is
    // not that plus the most the step holds. With steady on, the peak is the one the pool alone
    // reports.
    let peak_after_reset = |mode: PlannedMode<Pool>| {
        let mut grads: Vec<u64> = Vec::new();
        for it in 0..12 {
            if it == 6 {
                mode.reset_peak_stats();
            }
            let acts = allocate_all(&mode, &ACTIVATIONS);
            grads.drain(..).for_each(|addr| mode.free(addr, Some(4 << 20), None).unwrap());
            grads.extend((0..2).map(|_| mode.allocate(4 << 20, StreamId(0)).unwrap()));
            free_all(&mode, acts, &ACTIVATIONS);
            mode.step(vrampool_steady::AUTO_KEY);
        }
        peak_and_served(&mode, grads, 4 << 20)
    };
    let (steady, alone) = steady_and_alone(peak_after_reset);
    assert_eq!(alone, (13 << 20) + (8 << 20), "the activations and both steps' gradients at zero_grad");
    assert_eq!(steady, alone);
}

#[test]
fn the_peak_of_served_steps_that_each_keep_a_buffer_grows_as_the_pools() {
    // Each step keeps a 64 KiB buffer for good (a list of them): the pool holds one more after every step,
    // and the peak climbs with it, as the pool alone reports.
    let peak = |mode: PlannedMode<Pool>| {
        let mut losses: Vec<u64> = Vec::new();
        for _ in 0..12 {
            let acts = allocate_all(&mode, &ACTIVATIONS);
            losses.push(mode.allocate(64 << 10, StreamId(0)).unwrap());
            free_all(&mode, acts, &ACTIVATIONS);
            mode.step(vrampool_steady::AUTO_KEY);
        }
        peak_and_served(&mode, losses, 64 << 10)
    };
    let (steady, alone) = steady_and_alone(peak);
    // The pool's own peak is checked every `PEAK_SLACK` bytes of small allocations: within that
    // of the true one, which the last step reaches.
    let true_peak = (13 << 20) + 12 * (64 << 10);
    assert!(alone <= true_peak && true_peak - alone < vrampool_core::stats::PEAK_SLACK, "{alone}");
    assert!(steady.abs_diff(true_peak) < vrampool_core::stats::PEAK_SLACK, "{steady} against {true_peak}");
}

#[test]
fn a_loop_that_begins_after_a_long_stretch_that_never_repeated_is_served_within_a_probe() {
    let sim = Arc::new(SimDevice::new(1 << 32, SimMode::AddressOnly));
    let planned = PlannedPool::new(Pool::new(sim, PoolConfig::default()).unwrap()).with_auto_steps();
    // Pairs of sizes that never repeat in a row: too short to plan; the waits double, to millions of
    // allocations.
    for i in 0..3_000_000u64 {
        let size = 512 * (1 + i % 97);
        planned.free(planned.allocate(size, StreamId(0)).unwrap(), Some(size), None).unwrap();
    }
    let idle = planned.stats().unwrap().idle_allocations;
    assert!(idle > 2_900_000, "backing off: {idle}");
    // A loop of 16 buffers a step, each freed two allocations later.
    let mut allocations = 0u64;
    while planned.stats().unwrap().planned_allocations == 0 && allocations < 4_000_000 {
        let sizes: Vec<u64> = (0..16u64).map(|i| 4096 * (1 + i % 5)).collect();
        let mut addrs = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            addrs.push(planned.allocate(size, StreamId(0)).unwrap());
            if i >= 2 {
                planned.free(addrs[i - 2], Some(sizes[i - 2]), None).unwrap();
            }
        }
        planned.free(addrs[14], Some(sizes[14]), None).unwrap();
        planned.free(addrs[15], Some(sizes[15]), None).unwrap();
        allocations += 16;
    }
    assert!(allocations <= (1 << 20) + 4096, "served after {allocations} allocations of the loop");
}

#[test]
fn with_an_arena_a_thread_every_buffer_is_scrubbed_before_the_next_user_sees_it() {
    let sim = Arc::new(SimDevice::new(1 << 32, SimMode::HostBacked));
    let config = PoolConfig { scrub: Scrub::OnFree, ..PoolConfig::default() };
    let mode = PlannedMode::steady(Pool::new(sim.clone(), config).unwrap());
    let turns = Turns(AtomicUsize::new(0));
    let dirty = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 1..=2u8 {
            let (mode, sim, turns, dirty) = (&mode, &sim, &turns, &dirty);
            s.spawn(move || {
                let me = usize::from(t % 2);
                for _ in 0..40 {
                    let mut live = std::collections::VecDeque::new();
                    for i in 0..12u64 {
                        let size = 4096 * (1 + (i + u64::from(t)) % 5);
                        let addr = turns.take(me, || mode.allocate(size, StreamId(0)).unwrap());
                        if sim.read(addr, size).unwrap().iter().any(|&b| b != 0) {
                            dirty.fetch_add(1, Release);
                        }
                        sim.write(addr, &vec![t; size as usize]).unwrap();
                        live.push_back((addr, size));
                        if live.len() > 3 {
                            let (addr, size) = live.pop_front().unwrap();
                            turns.take(me, || mode.free(addr, Some(size), None).unwrap());
                        }
                    }
                    live.into_iter().for_each(|(addr, size)| turns.take(me, || mode.free(addr, Some(size), None).unwrap()));
                }
            });
        }
    });
    let stats = mode.planned_stats().unwrap();
    assert!(stats.planned_allocations >= 2 * 30 * 12, "both loops are served from their arenas: {stats:?}");
    assert_eq!(dirty.load(Acquire), 0, "no buffer came back holding another's bytes");
}

/// Allocates as the C entries do: the cached lane, else `allocate`; counts the lane's hits.
fn tagged_by_lane(mode: &PlannedMode<Pool>, sim: &SimDevice, size: u64, pattern: u8, hits: &mut u64) -> Tagged {
    let addr = match mode.allocate_cached(size, StreamId(0)) {
        Some(addr) => {
            *hits += 1;
            addr
        }
        None => mode.allocate(size, StreamId(0)).unwrap(),
    };
    sim.write(addr, &vec![pattern; size as usize]).unwrap();
    Tagged(addr, size, pattern)
}

/// Frees as the C entries do: the cached lane, then what it leaves.
fn free_by_lane(mode: &PlannedMode<Pool>, sim: &SimDevice, Tagged(addr, size, pattern): Tagged) {
    assert!(sim.read(addr, size).unwrap().iter().all(|&b| b == pattern), "a live buffer at {addr:#x} was overwritten");
    match mode.free_cached(addr, Some(size), None) {
        CachedFree::Done => {}
        CachedFree::Parked => mode.free_parked(addr, None).unwrap(),
        CachedFree::Untouched => mode.free(addr, Some(size), None).unwrap(),
    }
}

#[test]
fn the_cached_lane_serves_the_arenas_steps_and_leaves_the_rest_to_the_calls() {
    let (mode, sim) = steady();
    let mut hits = 0;
    for round in 0..30u64 {
        let mut live = std::collections::VecDeque::new();
        for i in 0..12u64 {
            // Buffers of 4-20 KiB, and one of 8 MiB a round, which the pool serves.
            let size = if i == 5 { 8 << 20 } else { 4096 * (1 + i % 5) };
            live.push_back(tagged_by_lane(&mode, &sim, size, (round * 12 + i) as u8 | 1, &mut hits));
            if live.len() > 3 {
                free_by_lane(&mode, &sim, live.pop_front().unwrap());
            }
        }
        live.into_iter().for_each(|b| free_by_lane(&mode, &sim, b));
    }
    let stats = mode.planned_stats().unwrap();
    assert!(stats.planned_allocations >= 25 * 11, "the loop is served from the arena: {stats:?}");
    // A round's first step can come through `allocate`, which moves the arena from one round to
    // the next; every other arena step, and nothing else, comes through the lane.
    assert!(hits <= stats.planned_allocations && hits + 30 >= stats.planned_allocations, "{hits} hits: {stats:?}");
    assert_eq!(stats.planned_allocations + stats.dynamic_allocations, 30 * 12);
    assert_eq!((stats.arena_live, mode.stats().allocation.current), (0, 0));
}

#[test]
fn through_the_lane_a_program_backs_off_and_a_loop_after_it_is_served() {
    let (mode, sim) = steady();
    let mut hits = 0;
    for i in 0..30_000u64 {
        let b = tagged_by_lane(&mode, &sim, 512 * (1 + i % 97), 1 + (i % 200) as u8, &mut hits);
        free_by_lane(&mode, &sim, b);
    }
    let pairs = mode.planned_stats().unwrap();
    assert!(pairs.idle_allocations > 27_000, "counted while idle, the lane's hits too: {pairs:?}");
    assert!(hits > 10_000, "idle, the thread's cache serves the small ones: {hits}");
    // The lane leaves the counts at which the wait is checked to `allocate`: the wait ends.
    let served = (0..20_000).find(|_| {
        let mut live = std::collections::VecDeque::new();
        for i in 0..12u64 {
            live.push_back(tagged_by_lane(&mode, &sim, 4096 * (1 + i % 5), 1 + i as u8, &mut hits));
            if live.len() > 3 {
                free_by_lane(&mode, &sim, live.pop_front().unwrap());
            }
        }
        live.into_iter().for_each(|b| free_by_lane(&mode, &sim, b));
        mode.planned_stats().unwrap().planned_allocations > 0
    });
    assert!(served.is_some(), "{:?}", mode.planned_stats().unwrap());
}

#[test]
fn threads_on_the_lane_and_the_calls_at_once_never_share_bytes() {
    let (mode, sim) = steady();
    // One loop alone until it is served, then four threads at once, two through the lane and two
    // through the calls: the lane's steps race the calls' for the same schedule.
    let lane_round = |mode: &PlannedMode<Pool>, sim: &SimDevice, thread: u8, hits: &mut u64| {
        let mut live = std::collections::VecDeque::new();
        for i in 0..12u64 {
            live.push_back(tagged_by_lane(mode, sim, 4096 * (1 + (i + u64::from(thread)) % 5), thread * 16 + i as u8 + 1, hits));
            if live.len() > 3 {
                free_by_lane(mode, sim, live.pop_front().unwrap());
            }
        }
        live.into_iter().for_each(|b| free_by_lane(mode, sim, b));
    };
    let mut hits = 0;
    (0..20).for_each(|_| lane_round(&mode, &sim, 0, &mut hits));
    assert!(hits >= 15 * 12, "one thread's loop is served through the lane: {hits}");
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (mode, sim) = (&mode, &sim);
            s.spawn(move || {
                let mut hits = 0;
                for _ in 0..150 {
                    if t % 2 == 0 {
                        lane_round(mode, sim, t, &mut hits);
                    } else {
                        round(mode, sim, t);
                    }
                }
            });
        }
    });
    let stats = mode.planned_stats().unwrap();
    assert_eq!((stats.arena_live, mode.stats().allocation.current), (0, 0));
    assert_eq!(stats.planned_allocations + stats.dynamic_allocations, (20 + 4 * 150) * 12);
}

/// One decode pass: per layer, a key and a value cache each grown by `unit` bytes a token, a
/// copy at a time (the new buffer is allocated while the old one lives), beside an activation.
fn decode(mode: &PlannedMode<Pool>, layers: usize, tokens: u64, unit: u64) {
    let take = |size: u64| (mode.allocate(size, StreamId(0)).unwrap(), size);
    let give = |(addr, size): (u64, u64)| mode.free(addr, Some(size), None).unwrap();
    let mut caches: Vec<(u64, u64)> = (0..2 * layers).map(|_| take(128 * unit)).collect();
    for token in 1..=tokens {
        for layer in 0..layers {
            let activation = take(2 << 20);
            for cache in &mut caches[2 * layer..2 * layer + 2] {
                let grown = take((128 + token) * unit);
                give(std::mem::replace(cache, grown));
            }
            give(activation);
        }
    }
    caches.into_iter().for_each(give);
}

#[test]
fn a_decode_of_caches_grown_by_copy_is_served_near_its_bound_and_does_not_creep() {
    let sim = Arc::new(SimDevice::new(1 << 32, SimMode::AddressOnly));
    let mode = PlannedMode::steady(Pool::new(sim.clone(), PoolConfig::default()).unwrap());
    let device_calls = |sim: &SimDevice| {
        let c = sim.counters();
        c.alloc_calls + c.free_calls + c.map_calls + c.unmap_calls + c.stream_syncs
    };
    decode(&mode, 8, 96, 4096);
    let first = mode.stats().reserved_bytes.peak;
    decode(&mode, 8, 96, 4096);
    let calls = device_calls(&sim);
    for _ in 0..8 {
        decode(&mode, 8, 96, 4096);
    }
    assert_eq!(device_calls(&sim), calls, "no device call after the second pass");
    let stats = mode.planned_stats().unwrap();
    assert_eq!(mode.stats().reserved_bytes.peak, first, "the steady state holds what the first pass did: {stats:?}");
    assert_eq!((stats.replayed_iterations, stats.fallbacks), (9, 0), "served from the second pass on: {stats:?}");
    // The caches' staircase placed as they come (by start): 1.05x its bound, where placing the
    // largest first planned 1.74x.
    let plan = &stats.plans[0];
    assert!(plan.arena_bytes * 100 <= plan.lower_bound_bytes * 106, "{plan:?}");
}
