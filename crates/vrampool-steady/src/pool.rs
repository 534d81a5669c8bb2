//! `PlannedPool`: record an iteration's allocations, plan them, and serve the same sequence in later
//! iterations from one arena at the planned offsets; on any divergence fall back to the pool for the
//! rest of the iteration and plan the new sequence. Schedules are kept per signature key, as ONNX
//! Runtime keeps memory patterns per input shape.
//!
//! Three paths, by the phase in one word (`serving.rs`):
//! - serving: a call that is the schedule's next step moves the word on with one compare-and-swap;
//!   an arena allocation is then a base plus an offset, an arena free nothing more. No lock, no map.
//! - idle (nothing repeats) and off: calls go to the pool; a free checks that it is not the arena's.
//! - cold: recording, leaving a schedule, ending an iteration, and every call that is not the next
//!   step: one lock.
//!
//! ```
//! use std::sync::Arc;
//! use vrampool_core::{Pool, PoolConfig, SimDevice, SimMode, StreamId};
//! use vrampool_steady::PlannedPool;
//!
//! let device = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
//! let planned = PlannedPool::new(Pool::new(device, PoolConfig::default())?);
//! for _ in 0..3 {
//!     let a = planned.allocate(4096, StreamId(0))?;
//!     let b = planned.allocate(8192, StreamId(0))?;
//!     planned.free(a, None, None)?;
//!     planned.free(b, None, None)?;
//!     planned.step(0)?;
//! }
//! let stats = planned.stats()?;
//! assert_eq!((stats.dynamic_allocations, stats.planned_allocations), (2, 4)); // recorded once, then served
//! # Ok::<(), vrampool_core::PoolError>(())
//! ```

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::fast::FixedState;
use parking_lot::{Mutex, MutexGuard};
use vrampool_core::{fork, InvalidFreeReason, MemoryResource, PoolError, StreamId};

use crate::idle::{Backoff, IdleCount};
use crate::record::Recorder;
use crate::regions::Regions;
use crate::schedule::{plan_schedule, Planning, Schedule};
use crate::serving::{with_serving, Phase, Serving, Take, Word, EPOCH_MASK};

/// The key of the iteration before the first `step`, and of every iteration whose caller names none.
pub const DEFAULT_KEY: u64 = 0;

/// The key that lets an iteration's first allocation pick its schedule: the one recorded for an
/// iteration that began with an allocation of the same size on the same stream (a step whose input
/// shape changed begins with a buffer of another size). What automatic boundaries use.
pub const AUTO_KEY: u64 = u64::MAX;

/// With automatic boundaries, an iteration that allocated fewer buffers than this is not planned: a
/// repeating workload's step is planned, not each pair of a program that allocates and frees one
/// buffer at a time.
pub const AUTO_PLAN_ALLOCATIONS: usize = 8;

/// The most schedules kept; a new key past it replaces an old one.
const MAX_PLANS: usize = 64;

/// The figures of one key's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPlan {
    pub key: u64,
    /// The arena bytes its regions need, all streams together.
    pub arena_bytes: u64,
    /// The most bytes live at once among the arena buffers (per stream, summed): no plan needs less.
    pub lower_bound_bytes: u64,
    /// Allocations of the sequence served from the arena, and from the pool.
    pub arena_buffers: usize,
    pub dynamic_buffers: usize,
    /// Its steps (allocations and frees).
    pub events: usize,
    /// What placed its largest region: "greedy-by-size" or "floors-by-start" (in O(n log n)), or
    /// "search" (the planner's search, within the budget, where it did better).
    pub planner: &'static str,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlannedStats {
    /// Allocations served from the arena.
    pub planned_allocations: u64,
    /// Allocations passed to the pool while on.
    pub dynamic_allocations: u64,
    /// Iterations that left their schedule midway (and were planned anew).
    pub fallbacks: u64,
    /// Iterations that ran without a schedule for their key (and were recorded and planned).
    pub recorded_iterations: u64,
    /// Iterations that followed their schedule to the end.
    pub replayed_iterations: u64,
    /// The arena's bytes: every region.
    pub arena_bytes: u64,
    /// Arena buffers live now.
    pub arena_live: usize,
    /// The bytes of the live arena buffers.
    pub arena_live_bytes: u64,
    /// The bytes of every arena buffer handed out.
    pub planned_bytes: u64,
    /// Regions taken from the pool and given back to it, with their bytes.
    pub arena_blocks_taken: u64,
    pub arena_bytes_taken: u64,
    pub arena_blocks_returned: u64,
    pub arena_bytes_returned: u64,
    /// Per key, in key order.
    pub plans: Vec<KeyPlan>,
}

/// A live arena buffer, for leak reports and snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaBuffer {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    /// Nanoseconds since it was handed out, where the pool watches its blocks (scrub, event log,
    /// leak tracking); else None.
    pub age_ns: Option<u64>,
}

/// A region of the arena: one block of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaRegion {
    pub base: u64,
    pub bytes: u64,
    pub stream: StreamId,
}

/// What the serving path did with a call.
#[derive(Clone, Copy)]
enum Served {
    /// Served from the arena: an allocation at this address, or a free (nothing more to do).
    Arena(u64),
    /// The step is the pool's: the call goes to it (the iteration's allocation of this index, where
    /// the schedule knows it).
    Pool(Option<usize>),
    /// Not the next step: nothing done.
    Missed,
}

/// An arena buffer live outside a served iteration: its iteration left the schedule, or ended, while
/// it lived.
#[derive(Debug, Clone, Copy)]
struct Loose {
    size: u64,
    stream: StreamId,
}

#[derive(Debug, Clone, Default)]
struct Figures {
    planned_allocations: u64,
    planned_bytes: u64,
    dynamic_allocations: u64,
    fallbacks: u64,
    recorded_iterations: u64,
    replayed_iterations: u64,
}

impl Figures {
    /// `iterations` whole iterations of `schedule`, then its first `steps` steps (all of them: one
    /// more iteration replayed).
    fn add_served(&mut self, schedule: &Schedule, iterations: u64, steps: usize) {
        let iterations = iterations + u64::from(steps > 0 && steps == schedule.steps.len());
        let steps = if steps == schedule.steps.len() { 0 } else { steps };
        self.planned_allocations += iterations * schedule.arena_buffers;
        self.planned_bytes += iterations * schedule.arena_bytes_served;
        self.dynamic_allocations += iterations * (schedule.allocations - schedule.arena_buffers);
        self.replayed_iterations += iterations;
        let served = schedule.served_in(steps);
        self.planned_allocations += served.arena;
        self.planned_bytes += served.arena_bytes;
        self.dynamic_allocations += served.pool;
    }
}

/// Everything the cold path keeps, under the lock.
struct Cold {
    /// The iteration's key (`AUTO_KEY` until its first allocation names it).
    key: u64,
    /// The caller named the key (`step(key)`): an iteration that leaves its schedule at once is a
    /// fallback, not another schedule's start.
    named: bool,
    plans: HashMap<u64, Arc<Schedule>, FixedState>,
    /// The epoch's serving state, while serving.
    serving: Option<Arc<Serving>>,
    epoch: u32,
    /// `PlannedPool::wraps` when the epoch began.
    wraps_at_epoch: u64,
    recorder: Recorder,
    regions: Regions,
    loose: HashMap<u64, Loose, FixedState>,
    /// Birth times of live arena buffers (ns since `started`), where the pool watches its blocks.
    births: HashMap<u64, u64, FixedState>,
    figures: Figures,
    backoff: Backoff,
}

/// A planned arena over a pool: see the module documentation. `Send + Sync`. In a process forked
/// from the one that made it, every call refuses (`PoolError::Forked`) before the lock, which a
/// thread of the parent may have held at the fork, as the core pool does.
pub struct PlannedPool<B: MemoryResource> {
    backing: B,
    /// Unique in the process, renewed when the epoch wraps: what threads keep serving states by.
    uid: AtomicU64,
    generation: u64,
    planning: Planning,
    /// Iterations also end by themselves, once every buffer they allocated is freed, and begin with
    /// `AUTO_KEY`.
    auto_steps: bool,
    /// The pool scrubs, logs or tracks its blocks: then every arena call takes the lock, to do the
    /// same for arena buffers.
    watched: bool,
    started: Instant,
    /// The phase and, while serving, the epoch and the next step (`serving::Word`).
    word: AtomicU64,
    /// The arena's extent, `[lo, hi)`: a free outside it is never an arena buffer's.
    bounds: [AtomicU64; 2],
    /// Served iterations that ended by starting the next (the schedule wrapped), ever.
    wraps: AtomicU64,
    idle: IdleCount,
    cold: Mutex<Cold>,
}

fn next_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// The automatic key of an iteration that begins with an allocation of `size` bytes on `stream`.
fn signature(size: u64, stream: StreamId) -> u64 {
    // Never AUTO_KEY itself.
    FixedState::with_seed(0x5eed).hash_one((size, stream.0)).min(AUTO_KEY - 1)
}

fn not_allocated(addr: u64) -> PoolError {
    PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated }
}

fn wrong_size(addr: u64, expected: u64, given: u64) -> PoolError {
    PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::WrongSize { expected, given } }
}

impl<B: MemoryResource> PlannedPool<B> {
    /// A planned pool whose plans search for at most 10 ms each (a step boundary should not stall
    /// training).
    pub fn new(backing: B) -> Self {
        Self::with_budget(backing, Duration::from_millis(10))
    }

    pub fn with_budget(backing: B, budget: Duration) -> Self {
        let backoff = Backoff::default();
        let cold = Cold {
            key: DEFAULT_KEY,
            named: true,
            plans: HashMap::default(),
            serving: None,
            epoch: 0,
            wraps_at_epoch: 0,
            recorder: Recorder::new(backoff.record_limit),
            regions: Regions::default(),
            loose: HashMap::default(),
            births: HashMap::default(),
            figures: Figures::default(),
            backoff,
        };
        PlannedPool {
            planning: Planning { budget, alignment: backing.alignment() },
            watched: backing.watches_pieces(),
            backing,
            uid: AtomicU64::new(next_uid()),
            generation: fork::generation(),
            auto_steps: false,
            started: Instant::now(),
            word: AtomicU64::new(Word::COLD),
            bounds: [AtomicU64::new(0), AtomicU64::new(0)],
            wraps: AtomicU64::new(0),
            idle: IdleCount::default(),
            cold: Mutex::new(cold),
        }
    }

    /// Iteration boundaries without a caller: an iteration ends once every buffer it allocated is
    /// freed, every iteration picks its schedule by its first allocation (`AUTO_KEY`), and one of
    /// fewer than `AUTO_PLAN_ALLOCATIONS` allocations is not planned. A loop that frees what it
    /// allocates each step is then served from the arena from its second step on, with no call of
    /// its own.
    pub fn with_auto_steps(mut self) -> Self {
        self.auto_steps = true;
        let cold = self.cold.get_mut();
        (cold.key, cold.named) = (AUTO_KEY, false);
        self
    }

    /// Starts off: every call goes to the pool until `set_on(true)`.
    pub fn off(self) -> Self {
        self.word.store(Word::OFF, Relaxed);
        self
    }

    /// Whether iterations end by themselves ([`PlannedPool::with_auto_steps`]).
    pub fn has_auto_steps(&self) -> bool {
        self.auto_steps
    }

    /// Recordings may reach `events` before they are given up (by default 65,536, doubling each
    /// time one is given up, to 2^20).
    pub fn with_record_limit(mut self, events: usize) -> Self {
        let cold = self.cold.get_mut();
        cold.backoff.record_limit = events;
        cold.recorder = Recorder::new(events);
        self
    }

    /// Arena offsets in multiples of `alignment` (by default the backing's alignment).
    pub fn with_alignment(mut self, alignment: u64) -> Self {
        self.planning.alignment = alignment;
        self
    }

    pub fn backing(&self) -> &B {
        &self.backing
    }

    pub fn is_on(&self) -> bool {
        Word::phase(self.word.load(Relaxed)) != Phase::Off
    }

    fn lock(&self) -> Result<MutexGuard<'_, Cold>, PoolError> {
        if fork::forked_since(self.generation) {
            return Err(PoolError::Forked);
        }
        Ok(self.cold.lock())
    }

    // ---- the calls ----

    /// Allocates `size` bytes for `stream`: from the arena when this allocation is its schedule's
    /// next step there, else from the pool.
    #[inline]
    pub fn allocate(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        // Tests in the order of how often each path runs, with no jump table (an indirect jump).
        let word = self.word.load(Acquire);
        if Word::is_serving(word) && !self.watched {
            match self.serve_allocation(word, size, stream) {
                Served::Arena(addr) => return Ok(addr),
                Served::Pool(index) => return self.allocate_pool_step(word, index, size, stream),
                Served::Missed => {}
            }
        } else if word == Word::IDLE {
            if self.idle.count() && self.auto_steps {
                self.wake();
            }
            return self.backing.allocate(size, stream);
        } else if word == Word::OFF {
            return self.backing.allocate(size, stream);
        }
        self.allocate_cold(size, stream)
    }

    /// Frees a buffer this pool handed out. `size`, when given, must be the size it was allocated
    /// with; `stream`, when given, is a stream that used it last. Arena buffers cost no pool call.
    #[inline]
    pub fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        let word = self.word.load(Acquire);
        if Word::is_serving(word) && !self.watched {
            match self.serve_free(word, addr, size, stream) {
                Served::Arena(_) => return Ok(()),
                Served::Pool(index) => return self.free_pool_step(word, index, addr, size, stream),
                Served::Missed => {}
            }
        } else if (word == Word::IDLE || word == Word::OFF) && !self.in_bounds(addr) {
            return self.backing.free(addr, size, stream);
        }
        self.free_cold(addr, size, stream)
    }

    /// Marks the live buffer at `addr` as used on `stream` too (`Tensor.record_stream`). A pool
    /// buffer's reuse then waits for that stream (the pool's rule); an arena buffer's region is
    /// retired (replaced once none of its buffers is live), since its bytes may still be in use there
    /// after its free. Schedules leave such buffers to the pool.
    pub fn record_stream(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        let word = self.word.load(Acquire);
        if Word::phase(word) != Phase::Cold && !self.in_bounds(addr) {
            return self.backing.record_stream(addr, stream);
        }
        self.record_stream_cold(addr, stream)
    }

    #[inline(always)]
    fn in_bounds(&self, addr: u64) -> bool {
        self.bounds[0].load(Relaxed) <= addr && addr < self.bounds[1].load(Relaxed)
    }

    #[inline(always)]
    fn with_serving<T>(&self, word: u64, f: impl FnOnce(&Serving) -> Option<T>) -> Option<T> {
        with_serving(self.uid.load(Relaxed), Word::epoch(word), || self.cold.lock().serving.clone(), f)
    }

    /// Takes the schedule's next step for an allocation, if it is one (the step is then taken).
    #[inline(always)]
    fn serve_allocation(&self, word: u64, size: u64, stream: StreamId) -> Served {
        // In a forked child the cold path refuses.
        if fork::forked_since(self.generation) {
            return Served::Missed;
        }
        let Some((take, next, wraps)) = self.with_serving(word, |s| s.allocation(word, size, stream)) else { return Served::Missed };
        self.take_step(word, next, wraps, take)
    }

    /// Takes the schedule's next step for a free, if it is one.
    #[inline(always)]
    fn serve_free(&self, word: u64, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Served {
        if fork::forked_since(self.generation) {
            return Served::Missed;
        }
        let Some((take, next, wraps)) = self.with_serving(word, |s| s.free(word, addr, size, stream)) else { return Served::Missed };
        self.take_step(word, next, wraps, take)
    }

    /// Moves the word from `word` to `next`, where no other call moved it first.
    #[inline(always)]
    fn take_step(&self, word: u64, next: u64, wraps: bool, take: Take) -> Served {
        if self.word.compare_exchange(word, next, Release, Relaxed).is_err() {
            return Served::Missed;
        }
        if wraps {
            self.wraps.fetch_add(1, Relaxed);
        }
        match take {
            Take::Arena(addr) => Served::Arena(addr),
            Take::ArenaFreed { .. } => Served::Arena(0),
            Take::Pool { index } => Served::Pool(Some(index)),
            Take::PoolFree { index } => Served::Pool(index),
        }
    }

    /// A step the pool serves: the allocation, noted for the step that frees it.
    #[inline(never)]
    fn allocate_pool_step(&self, word: u64, index: Option<usize>, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        match self.backing.allocate(size, stream) {
            Ok(addr) => {
                if let Some(index) = index {
                    self.note_pool_buffer(word, index, Some(addr));
                }
                Ok(addr)
            }
            Err(e) => {
                self.leave_after_error();
                Err(e)
            }
        }
    }

    #[inline(never)]
    fn free_pool_step(
        &self,
        word: u64,
        index: Option<usize>,
        addr: u64,
        size: Option<u64>,
        stream: Option<StreamId>,
    ) -> Result<(), PoolError> {
        if let Some(index) = index {
            self.note_pool_buffer(word, index, None);
        }
        self.backing.free(addr, size, stream).inspect_err(|_| self.leave_after_error())
    }

    /// Notes a pool buffer of the epoch of `word` (None: freed) where the epoch is still served.
    fn note_pool_buffer(&self, word: u64, index: usize, addr: Option<u64>) {
        self.with_serving(word, |s| {
            s.note_pool_buffer(index, addr);
            Some(())
        });
    }

    // ---- the cold path ----

    #[cold]
    #[inline(never)]
    fn allocate_cold(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        loop {
            let word = self.word.load(Acquire);
            match Word::phase(word) {
                Phase::Off | Phase::Idle => {
                    if Word::phase(word) == Phase::Idle {
                        self.idle.count();
                    }
                    drop(guard);
                    return self.backing.allocate(size, stream);
                }
                Phase::Serving => {
                    let serving = cold.serving.clone().expect("serving has its state");
                    let Some((take, next, wraps)) = serving.allocation(word, size, stream) else {
                        self.leave_serving(cold, word, true);
                        continue;
                    };
                    if self.word.compare_exchange(word, next, Release, Relaxed).is_err() {
                        continue;
                    }
                    if wraps {
                        self.wraps.fetch_add(1, Relaxed);
                    }
                    return match take {
                        Take::Arena(addr) => self.arena_buffer_out(cold, addr, size, stream),
                        Take::Pool { index } => match self.backing.allocate(size, stream) {
                            Ok(addr) => {
                                serving.note_pool_buffer(index, Some(addr));
                                Ok(addr)
                            }
                            Err(e) => {
                                self.leave_now(cold, true);
                                Err(e)
                            }
                        },
                        _ => unreachable!("an allocation's step"),
                    };
                }
                Phase::Cold => {
                    if cold.recorder.allocations == 0 && self.start_by_key(cold, size, stream) {
                        continue;
                    }
                    let addr = self.backing.allocate(size, stream)?;
                    cold.figures.dynamic_allocations += 1;
                    cold.recorder.allocated(addr, size, stream);
                    if cold.recorder.overflowed {
                        self.give_up(cold);
                    }
                    return Ok(addr);
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn free_cold(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        let mut freed_by_pool = false;
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let serving = cold.serving.clone().expect("serving has its state");
            if !freed_by_pool {
                if let Some((take, next, wraps)) = serving.free(word, addr, size, stream) {
                    if self.word.compare_exchange(word, next, Release, Relaxed).is_err() {
                        continue;
                    }
                    if wraps {
                        self.wraps.fetch_add(1, Relaxed);
                    }
                    return match take {
                        Take::ArenaFreed { size, stream } => {
                            self.arena_buffer_in(cold, addr, size, stream);
                            Ok(())
                        }
                        Take::PoolFree { index } => {
                            if let Some(index) = index {
                                serving.note_pool_buffer(index, None);
                            }
                            self.backing.free(addr, size, stream).inspect_err(|_| self.leave_now(cold, true))
                        }
                        _ => unreachable!("a free's step"),
                    };
                }
                // Not the next step: an arena buffer freed out of order (or wrongly), or a pool buffer.
                match self.live_in_epoch(&serving, word).into_iter().find(|b| b.addr == addr) {
                    Some(b) if size.is_some_and(|s| s != b.size) => return Err(wrong_size(addr, b.size, size.unwrap_or(0))),
                    Some(_) => {}
                    None if serving.in_regions(addr) => return Err(not_allocated(addr)),
                    None => {
                        self.backing.free(addr, size, stream)?;
                        freed_by_pool = true;
                    }
                }
            }
            self.leave_serving(cold, word, true);
        }
        if freed_by_pool {
            cold.recorder.freed(addr, stream);
        } else if let Some(&loose) = cold.loose.get(&addr) {
            self.free_loose(cold, addr, loose, size, stream)?;
        } else if cold.regions.find(addr).is_some() {
            return Err(not_allocated(addr));
        } else {
            self.backing.free(addr, size, stream)?;
            if Word::phase(self.word.load(Relaxed)) == Phase::Cold {
                cold.recorder.freed(addr, stream);
            }
        }
        if self.auto_steps && Word::phase(self.word.load(Relaxed)) == Phase::Cold && cold.recorder.all_freed() {
            self.end_iteration(cold, AUTO_KEY);
        }
        Ok(())
    }

    #[cold]
    fn record_stream_cold(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let serving = cold.serving.clone().expect("serving has its state");
            if !serving.in_regions(addr) {
                return self.backing.record_stream(addr, stream);
            }
            match self.live_in_epoch(&serving, word).into_iter().find(|b| b.addr == addr) {
                None => return Err(not_allocated(addr)),
                Some(b) if b.stream == stream => return Ok(()),
                // Its bytes may be in use there after its free: nothing more from this region.
                Some(_) => self.leave_serving(cold, word, true),
            }
        }
        if let Some(&loose) = cold.loose.get(&addr) {
            if stream != loose.stream {
                if let Some(at) = cold.regions.find(addr) {
                    cold.regions.list[at].used_on(stream);
                }
                cold.recorder.used_on(addr, stream);
            }
            return Ok(());
        }
        if cold.regions.find(addr).is_some() {
            return Err(not_allocated(addr));
        }
        self.backing.record_stream(addr, stream)?;
        cold.recorder.used_on(addr, stream);
        Ok(())
    }

    /// The arena buffers live at `word` of the epoch `serving` serves.
    fn live_in_epoch(&self, serving: &Serving, word: u64) -> Vec<ArenaBuffer> {
        let schedule = &serving.schedule;
        schedule
            .live_after(Word::position(word).min(schedule.steps.len()))
            .into_iter()
            .filter_map(|p| {
                let addr = serving.bases[p.stream] + p.offset?;
                Some(ArenaBuffer { addr, size: p.size, stream: schedule.streams[p.stream], age_ns: None })
            })
            .collect()
    }

    /// An arena buffer handed out: where the pool watches its blocks, scrubbed, logged and dated as
    /// one of them. A buffer the pool could not scrub is not handed out (its iteration leaves the
    /// schedule, and the buffer is dropped).
    fn arena_buffer_out(&self, cold: &mut Cold, addr: u64, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        if !self.watched {
            return Ok(addr);
        }
        if let Err(e) = self.backing.piece(addr, size, stream, false) {
            self.leave_now(cold, true);
            cold.loose.remove(&addr);
            cold.recorder.freed(addr, None);
            return Err(e);
        }
        cold.births.insert(addr, self.now_ns());
        Ok(addr)
    }

    /// An arena buffer freed: where the pool watches its blocks, scrubbed and logged; one the pool
    /// could not scrub retires its region, whose bytes then never go out again.
    fn arena_buffer_in(&self, cold: &mut Cold, addr: u64, size: u64, stream: StreamId) {
        if !self.watched {
            return;
        }
        cold.births.remove(&addr);
        if self.backing.piece(addr, size, stream, true).is_err() {
            if let Some(at) = cold.regions.find(addr) {
                cold.regions.list[at].retired = true;
            }
            self.leave_now(cold, true);
        }
    }

    fn free_loose(&self, cold: &mut Cold, addr: u64, loose: Loose, size: Option<u64>, on: Option<StreamId>) -> Result<(), PoolError> {
        if let Some(given) = size.filter(|&s| s != loose.size) {
            return Err(wrong_size(addr, loose.size, given));
        }
        cold.loose.remove(&addr);
        if let Some(on) = on.filter(|&s| s != loose.stream) {
            if let Some(at) = cold.regions.find(addr) {
                cold.regions.list[at].used_on(on);
            }
        }
        self.arena_buffer_in(cold, addr, loose.size, loose.stream);
        if Word::phase(self.word.load(Relaxed)) == Phase::Cold {
            cold.recorder.freed(addr, on);
        }
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    // ---- phases ----

    /// Leaves the schedule served at `word` for the cold path: the arena buffers live there become
    /// loose, and the recording goes on from there. An iteration that `diverged` from its schedule
    /// midway (or at once, under a named key) is a fallback. Does nothing when the word moved
    /// meanwhile: the caller looks again.
    fn leave_serving(&self, cold: &mut Cold, word: u64, diverged: bool) {
        if self.word.compare_exchange(word, Word::COLD, Release, Relaxed).is_err() {
            return;
        }
        let serving = cold.serving.take().expect("serving has its state");
        let schedule = &serving.schedule;
        let position = Word::position(word).min(schedule.steps.len());
        let wraps = self.wraps.load(Relaxed) - cold.wraps_at_epoch;
        cold.figures.add_served(schedule, wraps, position);
        let limit = cold.backoff.record_limit;
        if wraps > 0 || position == schedule.steps.len() {
            cold.backoff.served();
        }
        if position == schedule.steps.len() || (position == 0 && !(diverged && cold.named)) {
            cold.recorder = Recorder::new(limit);
            if self.auto_steps || !cold.named {
                cold.key = AUTO_KEY;
            }
            return;
        }
        cold.figures.fallbacks += 1;
        // The iteration's live buffers: the arena's become loose; the recording goes on knowing them all
        // (a pool buffer whose address is not noted yet, being handed out by another thread now, is
        // taken for an older one).
        let mut born = Vec::new();
        for p in schedule.live_after(position) {
            let stream = schedule.streams[p.stream];
            let addr = match p.offset {
                Some(offset) => {
                    let addr = serving.bases[p.stream] + offset;
                    cold.loose.insert(addr, Loose { size: p.size, stream });
                    addr
                }
                None => serving.pool_addrs[p.index as usize].load(Relaxed),
            };
            if addr != 0 {
                born.push((addr, (p.index, stream)));
            }
        }
        cold.recorder = Recorder::continuing(schedule.recorded_prefix(position), born, limit);
    }

    /// Leaves the schedule wherever it is now (after an error the pool returned to a step, or the
    /// mode going off: not `diverged`).
    fn leave_now(&self, cold: &mut Cold, diverged: bool) {
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                return;
            }
            self.leave_serving(cold, word, diverged);
        }
    }

    #[cold]
    fn leave_after_error(&self) {
        if let Ok(mut cold) = self.lock() {
            self.leave_now(&mut cold, true);
        }
    }

    /// At an iteration's first allocation: serves the schedule of its key (for `AUTO_KEY`, of this
    /// allocation's signature) if there is one and the iteration's frees so far are its first steps.
    /// Without one, the iteration runs on the pool, and the idle arena goes back to it.
    fn start_by_key(&self, cold: &mut Cold, size: u64, stream: StreamId) -> bool {
        let key = if cold.key == AUTO_KEY { signature(size, stream) } else { cold.key };
        let lead = cold.recorder.len();
        let schedule = cold.plans.get(&key).cloned();
        let fresh = !cold.recorder.overflowed && !cold.recorder.diverged;
        if let Some(schedule) = schedule.filter(|s| fresh && s.starts_with(lead, size, stream)) {
            if self.serve(cold, schedule, lead) {
                cold.key = key;
                return true;
            }
        }
        if cold.key == AUTO_KEY {
            cold.key = key;
        }
        if !cold.plans.contains_key(&key) {
            self.release_idle_regions(cold);
        }
        false
    }

    /// Serves `schedule` from its step `position` on: regions for its streams (kept, or taken from
    /// the pool), then a new epoch. False when arena buffers of an earlier iteration are still live,
    /// or the pool has no memory for a region.
    fn serve(&self, cold: &mut Cold, schedule: Arc<Schedule>, position: usize) -> bool {
        if !cold.loose.is_empty() {
            return false;
        }
        let mut bases = Vec::with_capacity(schedule.streams.len());
        let mut trimmed = false;
        for (i, &stream) in schedule.streams.iter().enumerate() {
            let needed = schedule.region_bytes[i];
            if needed == 0 {
                bases.push(0);
                continue;
            }
            // Sized for every schedule's use of the stream, so that schedules taking turns keep one region.
            let wanted = cold.plans.values().filter_map(|p| Some(p.region_bytes[p.stream_index(stream)?])).max().unwrap_or(0);
            let fits =
                cold.regions.of_stream(stream).is_some_and(|at| cold.regions.list[at].bytes >= needed && !cold.regions.list[at].retired);
            if !fits && !self.auto_steps && !trimmed {
                // The caller names the boundaries: what the recorded iterations left cached in the pool goes back
                // first, so the pool does not hold both. With automatic ones the pool's own growth gives back
                // what the region needs and no more (`PoolConfig::reclaim`).
                let _ = self.backing.trim();
                trimmed = true;
            }
            match cold.regions.ensure(&self.backing, stream, needed, wanted) {
                Ok(at) => bases.push(cold.regions.list[at].base),
                Err(_) => {
                    self.publish_bounds(cold);
                    return false;
                }
            }
        }
        self.publish_bounds(cold);
        cold.epoch = (cold.epoch + 1) & EPOCH_MASK;
        if cold.epoch == 0 {
            // Epochs wrapped: threads may keep a state of this number from long ago.
            self.uid.store(next_uid(), Relaxed);
            cold.epoch = 1;
        }
        cold.wraps_at_epoch = self.wraps.load(Relaxed);
        let epoch = cold.epoch;
        let pool_addrs = (0..schedule.allocations).map(|_| AtomicU64::new(0)).collect();
        cold.serving = Some(Arc::new(Serving { epoch, schedule, bases: bases.into(), regions: cold.regions.ranges(), pool_addrs }));
        self.word.store(Word::serving(epoch, position as u32), Release);
        true
    }

    fn publish_bounds(&self, cold: &Cold) {
        let (lo, hi) = cold.regions.bounds();
        self.bounds[0].store(lo, Relaxed);
        self.bounds[1].store(hi, Relaxed);
    }

    /// Gives the regions back if no arena buffer is live (to the pool; with named boundaries the
    /// pool's free memory then goes back to the device too).
    fn release_idle_regions(&self, cold: &mut Cold) {
        if !cold.loose.is_empty() || cold.serving.is_some() || cold.regions.list.is_empty() {
            return;
        }
        let released = cold.regions.release_all(&self.backing);
        self.publish_bounds(cold);
        if released.is_ok_and(|bytes| bytes > 0) && !self.auto_steps {
            let _ = self.backing.trim();
        }
    }

    /// A recording past its limit: given up, and the pool goes idle.
    fn give_up(&self, cold: &mut Cold) {
        let wait = cold.backoff.gave_up(cold.recorder.len());
        self.go_idle(cold, wait);
    }

    fn go_idle(&self, cold: &mut Cold, wait: u64) {
        self.idle.wait(wait);
        self.word.store(Word::IDLE, Release);
        cold.recorder = Recorder::new(cold.backoff.record_limit);
        self.release_idle_regions(cold);
    }

    /// The wait is over: record again, from the next allocation on.
    #[cold]
    fn wake(&self) {
        let Ok(mut cold) = self.lock() else { return };
        if Word::phase(self.word.load(Relaxed)) == Phase::Idle {
            cold.recorder = Recorder::new(cold.backoff.record_limit);
            cold.key = AUTO_KEY;
            self.word.store(Word::COLD, Release);
        }
    }

    /// Ends the iteration and starts the next, whose signature is `key`. The iteration that ends is
    /// planned and its schedule stored under its key when it had none or left it; an iteration
    /// without allocations or frees leaves the schedules as they are.
    pub fn step(&self, key: u64) -> Result<(), PoolError> {
        let mut cold = self.lock()?;
        self.end_iteration(&mut cold, key);
        Ok(())
    }

    fn end_iteration(&self, cold: &mut Cold, key: u64) {
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let serving = cold.serving.clone().expect("serving has its state");
            let (position, len) = (Word::position(word), serving.schedule.steps.len());
            let same = key == AUTO_KEY || key == cold.key;
            if position >= len && same {
                // Done, and the next iteration follows the same schedule: from its start.
                if self.word.compare_exchange(word, Word::serving(serving.epoch, 0), Release, Relaxed).is_ok() {
                    self.wraps.fetch_add(1, Relaxed);
                    cold.named = key != AUTO_KEY;
                    return;
                }
            } else if position == 0 && same {
                cold.named = key != AUTO_KEY;
                return;
            } else {
                self.leave_serving(cold, word, true);
            }
        }
        if Word::phase(self.word.load(Relaxed)) == Phase::Cold {
            self.plan_recording(cold);
        }
        (cold.key, cold.named) = (key, key != AUTO_KEY);
        match Word::phase(self.word.load(Relaxed)) {
            Phase::Off => {}
            Phase::Idle => {
                // A known schedule is served at once (serving costs nothing); a new one is recorded once the wait
                // is over.
                if (key != AUTO_KEY && cold.plans.contains_key(&key)) || self.idle.total() >= self.idle.until() {
                    cold.recorder = Recorder::new(cold.backoff.record_limit);
                    self.word.store(Word::COLD, Release);
                    self.begin(cold, key);
                }
            }
            _ => self.begin(cold, key),
        }
    }

    /// A new iteration under `key`: its schedule served from the start if there is one; without one
    /// (a named key), it runs on the pool, and the idle arena goes back to it. `AUTO_KEY` waits for
    /// the first allocation.
    fn begin(&self, cold: &mut Cold, key: u64) {
        if key == AUTO_KEY {
            return;
        }
        if let Some(schedule) = cold.plans.get(&key).cloned() {
            if self.serve(cold, schedule, 0) {
                return;
            }
        }
        self.release_idle_regions(cold);
    }

    /// Plans the recording that ends, stores its schedule under its key, and backs off when
    /// iterations keep going unserved.
    fn plan_recording(&self, cold: &mut Cold) {
        let recorder = std::mem::replace(&mut cold.recorder, Recorder::new(cold.backoff.record_limit));
        if recorder.events.is_empty() {
            return;
        }
        let too_few = self.auto_steps && (recorder.allocations as usize) < AUTO_PLAN_ALLOCATIONS;
        let key = match cold.key {
            AUTO_KEY => recorder.first.map(|(size, stream)| signature(size, stream)),
            key => Some(key),
        };
        if let Some(key) = key.filter(|_| !recorder.overflowed && !too_few) {
            if !recorder.diverged {
                cold.figures.recorded_iterations += 1;
            }
            // The search may take as long as the iteration took, no longer: planning then costs a repeating
            // program at most one more iteration's time.
            let budget = self.planning.budget.min(recorder.age());
            match plan_schedule(&recorder.events, Planning { budget, ..self.planning }) {
                Some(schedule) => {
                    if cold.plans.len() >= MAX_PLANS && !cold.plans.contains_key(&key) {
                        let old = cold.plans.keys().next().copied();
                        old.map(|k| cold.plans.remove(&k));
                    }
                    cold.plans.insert(key, Arc::new(schedule));
                }
                None => {
                    cold.plans.remove(&key);
                }
            }
        }
        if let Some(wait) = cold.backoff.unserved(recorder.events.len()) {
            self.go_idle(cold, wait);
        }
    }

    // ---- the mode, the arena's memory, figures ----

    /// Turns the pool on (iterations recorded and served) or off (every call to the pool; arena
    /// buffers live now are still freed here).
    pub fn set_on(&self, on: bool) {
        let Ok(mut guard) = self.lock() else { return };
        let cold = &mut *guard;
        let phase = Word::phase(self.word.load(Acquire));
        if on && phase == Phase::Off {
            cold.recorder = Recorder::new(cold.backoff.record_limit);
            self.word.store(Word::COLD, Release);
            let key = cold.key;
            self.end_iteration(cold, key);
        } else if !on && phase != Phase::Off {
            self.leave_now(cold, false);
            self.word.store(Word::OFF, Release);
            cold.recorder = Recorder::new(cold.backoff.record_limit);
            self.release_idle_regions(cold);
        }
    }

    /// Stops serving for good (the pool below is closing): later calls go to the pool, which refuses
    /// them; arena buffers still live can be freed.
    pub fn close(&self) {
        self.set_on(false);
    }

    /// Gives the arena back to the pool if no arena buffer is live; the bytes given back. The next
    /// served iteration takes new regions.
    pub fn release_idle_arena(&self) -> Result<u64, PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let len = cold.serving.as_ref().expect("serving has its state").schedule.steps.len();
            if (1..len).contains(&Word::position(word)) {
                return Ok(0);
            }
            self.leave_serving(cold, word, false);
        }
        if !cold.loose.is_empty() {
            return Ok(0);
        }
        let bytes = cold.regions.release_all(&self.backing);
        self.publish_bounds(cold);
        bytes
    }

    /// Whether `addr` is a live arena buffer.
    pub fn owns(&self, addr: u64) -> bool {
        self.arena_buffers().is_ok_and(|buffers| buffers.iter().any(|b| b.addr == addr))
    }

    /// Whether `addr` lies in the arena (a free there is the planned pool's to answer, never the
    /// pool's, where the region's own block is).
    pub fn claims(&self, addr: u64) -> bool {
        self.lock().is_ok_and(|cold| cold.regions.find(addr).is_some())
    }

    /// The live arena buffers, by address.
    pub fn arena_buffers(&self) -> Result<Vec<ArenaBuffer>, PoolError> {
        let cold = self.lock()?;
        let mut buffers: Vec<ArenaBuffer> =
            cold.loose.iter().map(|(&addr, l)| ArenaBuffer { addr, size: l.size, stream: l.stream, age_ns: None }).collect();
        let word = self.word.load(Acquire);
        if let (Phase::Serving, Some(serving)) = (Word::phase(word), &cold.serving) {
            buffers.extend(self.live_in_epoch(serving, word));
        }
        let now = self.now_ns();
        for b in &mut buffers {
            b.age_ns = cold.births.get(&b.addr).map(|&born| now.saturating_sub(born));
        }
        buffers.sort_unstable_by_key(|b| b.addr);
        Ok(buffers)
    }

    /// The arena's regions, by address.
    pub fn regions(&self) -> Result<Vec<ArenaRegion>, PoolError> {
        let cold = self.lock()?;
        let mut regions: Vec<ArenaRegion> =
            cold.regions.list.iter().map(|r| ArenaRegion { base: r.base, bytes: r.bytes, stream: r.stream }).collect();
        regions.sort_unstable_by_key(|r| r.base);
        Ok(regions)
    }

    /// The pool's figures of the planned arena.
    pub fn stats(&self) -> Result<PlannedStats, PoolError> {
        let cold = self.lock()?;
        let mut stats = self.figures_of(&cold);
        stats.plans = cold
            .plans
            .iter()
            .map(|(&key, s)| KeyPlan {
                key,
                arena_bytes: s.arena_bytes(),
                lower_bound_bytes: s.lower_bound_bytes,
                arena_buffers: s.arena_buffers as usize,
                dynamic_buffers: (s.allocations - s.arena_buffers) as usize,
                events: s.steps.len(),
                planner: s.planner,
            })
            .collect();
        stats.plans.sort_by_key(|p| p.key);
        Ok(stats)
    }

    /// [`PlannedPool::stats`] without the plans: O(1), for a caller that reads them at every step.
    pub fn figures(&self) -> Result<PlannedStats, PoolError> {
        let cold = self.lock()?;
        Ok(self.figures_of(&cold))
    }

    fn figures_of(&self, cold: &Cold) -> PlannedStats {
        let mut figures = cold.figures.clone();
        let word = self.word.load(Acquire);
        let (mut live, mut live_bytes) = (cold.loose.len() as u64, cold.loose.values().map(|l| l.size).sum::<u64>());
        if let (Phase::Serving, Some(serving)) = (Word::phase(word), &cold.serving) {
            let position = Word::position(word).min(serving.schedule.steps.len());
            figures.add_served(&serving.schedule, self.wraps.load(Relaxed) - cold.wraps_at_epoch, position);
            let served = serving.schedule.served_in(position);
            live += served.live;
            live_bytes += served.live_bytes;
        }
        let region = cold.regions.figures;
        PlannedStats {
            planned_allocations: figures.planned_allocations,
            dynamic_allocations: figures.dynamic_allocations + self.idle.total(),
            fallbacks: figures.fallbacks,
            recorded_iterations: figures.recorded_iterations,
            replayed_iterations: figures.replayed_iterations,
            arena_bytes: cold.regions.bytes(),
            arena_live: live as usize,
            arena_live_bytes: live_bytes,
            planned_bytes: figures.planned_bytes,
            arena_blocks_taken: region.taken,
            arena_bytes_taken: region.bytes_taken,
            arena_blocks_returned: region.returned,
            arena_bytes_returned: region.bytes_returned,
            plans: Vec::new(),
        }
    }
}

impl<B: MemoryResource> Drop for PlannedPool<B> {
    /// Gives the arena back unless arena buffers are still live (then it stays allocated in the
    /// pool: their owners may still use them).
    fn drop(&mut self) {
        let _ = self.release_idle_arena();
    }
}
