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

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::time::{Duration, Instant};

use foldhash::fast::FixedState;
use parking_lot::{Mutex, MutexGuard};
use vrampool_core::{fork, CachedFree, MemoryResource, PoolError, StreamId};

use crate::figures::Figures;
use crate::idle::{Backoff, IdleCount, Probes, WastedPlans};
use crate::peaks::Peaks;
use crate::record::Recorder;
use crate::regions::Regions;
use crate::schedule::Planning;
use crate::serving::{with_serving, Phase, Serving, Take, Word};
use crate::state::Cold;

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
pub(crate) const MAX_PLANS: usize = 64;

/// What the serving path did with a call.
#[derive(Clone, Copy)]
pub(crate) enum Served {
    /// Served from the arena: an allocation at this address, or a free (nothing more to do).
    Arena(u64),
    /// The step is the pool's: the call goes to it (the iteration's allocation of this index, where
    /// the schedule knows it).
    Pool(Option<usize>),
    /// Not the next step: nothing done.
    Missed,
}

/// A planned arena over a pool: see the module documentation. `Send + Sync`. In a process forked
/// from the one that made it, every call refuses (`PoolError::Forked`) before the lock, which a
/// thread of the parent may have held at the fork, as the core pool does.
pub struct PlannedPool<B: MemoryResource> {
    pub(crate) backing: B,
    /// Unique in the process, renewed when the epoch wraps: what threads keep serving states by.
    pub(crate) uid: AtomicU64,
    pub(crate) generation: u64,
    pub(crate) planning: Planning,
    /// Iterations also end by themselves, once every buffer they allocated is freed, and begin with
    /// `AUTO_KEY`.
    pub(crate) auto_steps: bool,
    /// The pool scrubs, logs or tracks its blocks: then every arena call takes the lock, to do the
    /// same for arena buffers.
    pub(crate) watched: bool,
    pub(crate) started: Instant,
    /// The phase and, while serving, the epoch and the next step (`serving::Word`).
    pub(crate) word: AtomicU64,
    /// The arena's extent, `[lo, hi)`: a free outside it is never an arena buffer's.
    pub(crate) bounds: [AtomicU64; 2],
    /// Served iterations that ended by starting the next (the schedule wrapped), ever.
    pub(crate) wraps: AtomicU64,
    pub(crate) idle: IdleCount,
    /// A recording showed threads taking turns call by call (`thread_lanes.rs`): a steady mode then
    /// gives them lanes. On a line of its own: every call of every lane reads it, while the thread of
    /// lane 0 writes the word beside it at every step.
    pub(crate) threads_interleave: OwnLine<AtomicBool>,
    pub(crate) cold: Mutex<Cold>,
}

/// A value alone on its cache lines (128 bytes: two lines, as adjacent-line prefetch pairs them).
#[repr(align(128))]
pub(crate) struct OwnLine<T>(pub(crate) T);

pub(crate) fn next_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// The automatic key of an iteration that begins with an allocation of `size` bytes on `stream`.
pub(crate) fn signature(size: u64, stream: StreamId) -> u64 {
    // Never AUTO_KEY itself.
    FixedState::with_seed(0x5eed).hash_one((size, stream.0)).min(AUTO_KEY - 1)
}

impl<B: MemoryResource> PlannedPool<B> {
    /// A planned pool whose plans search for at most 50 ms each, once per shape, and only where the
    /// quick plan is more than 1% above the bound. Design: what the search saves is kept for the
    /// rest of the run; a KV-cache decode's plan took 32 ms to reach its bound from 1.1% above it,
    /// which 10 ms, or a short iteration's own time, never allowed.
    pub fn new(backing: B) -> Self {
        Self::with_budget(backing, Duration::from_millis(50))
    }

    pub fn with_budget(backing: B, budget: Duration) -> Self {
        let backoff = Backoff::default();
        let cold = Cold {
            key: DEFAULT_KEY,
            named: true,
            plans: HashMap::default(),
            pending: HashMap::default(),
            serving: None,
            epoch: 0,
            wraps_at_epoch: 0,
            recorder: Recorder::new(backoff.record_limit),
            regions: Regions::default(),
            loose: HashMap::default(),
            births: HashMap::default(),
            figures: Figures::default(),
            backoff,
            probes: Probes::default(),
            wasted: WastedPlans::default(),
            early: BTreeSet::new(),
            ahead: None,
            peaks: Peaks::default(),
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
            threads_interleave: OwnLine(AtomicBool::new(false)),
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

    /// A planned pool over `backing` as this one was made (budget, alignment, automatic
    /// boundaries), with nothing recorded: another thread's lane (`thread_lanes.rs`), whose threads
    /// have lanes already.
    pub(crate) fn sibling(&self, backing: B) -> Self {
        let sibling = Self::with_budget(backing, self.planning.budget).with_alignment(self.planning.alignment);
        sibling.threads_interleave.0.store(true, Relaxed);
        if self.auto_steps {
            sibling.with_auto_steps()
        } else {
            sibling
        }
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

    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, Cold>, PoolError> {
        if fork::forked_since(self.generation) {
            return Err(PoolError::Forked);
        }
        Ok(self.cold.lock())
    }

    // ---- the calls ----

    /// Allocates `size` bytes for `stream`: from the arena when this allocation is its schedule's
    /// next step there, else from the pool.
    #[inline(always)]
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

    /// `allocate` where it is the schedule's next step in the arena, or where the pool alone
    /// serves it (the arena off, or idle and its count not at a check) and the pool's thread cache
    /// holds the block; else None with nothing done.
    #[inline(always)]
    pub fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
        let word = self.word.load(Acquire);
        if Word::is_serving(word) && !self.watched {
            return match self.serve_in_arena(
                word,
                #[inline(always)]
                |s| s.allocation(word, size, stream),
            ) {
                Served::Arena(addr) => Some(addr),
                _ => None,
            };
        }
        if word == Word::OFF {
            return self.backing.allocate_cached(size, stream);
        }
        if word != Word::IDLE {
            return None;
        }
        let (counter, count) = self.idle.next_unchecked()?;
        let addr = self.backing.allocate_cached(size, stream)?;
        counter.store(count, Relaxed);
        Some(addr)
    }

    /// `free` where it is the schedule's next step in the arena, or where the pool alone serves
    /// it, as far as the pool's cached path goes.
    #[inline(always)]
    pub fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        let word = self.word.load(Acquire);
        if self.free_in_arena(word, addr, size, stream) {
            return CachedFree::Done;
        }
        self.free_cached_by_pool(word, addr, size, stream)
    }

    /// The pool's cached path of a free at `word`, where the pool alone serves (idle, or off) and
    /// `addr` is not the arena's.
    #[inline(always)]
    pub(crate) fn free_cached_by_pool(&self, word: u64, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        if (word == Word::IDLE || word == Word::OFF) && !self.in_bounds(addr) {
            return self.backing.free_cached(addr, size, stream);
        }
        CachedFree::Untouched
    }

    /// Frees `addr` where, at `word`, it is the schedule's next step in the arena; false, with
    /// nothing done, where it is not.
    #[inline(always)]
    pub(crate) fn free_in_arena(&self, word: u64, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> bool {
        Word::is_serving(word)
            && !self.watched
            && matches!(
                self.serve_in_arena(
                    word,
                    #[inline(always)]
                    |s| s.free(word, addr, size, stream)
                ),
                Served::Arena(_)
            )
    }

    /// Ends a free of the pool's that `free_cached` left parked.
    pub fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<(), PoolError> {
        self.backing.free_parked(addr, stream)
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
    pub(crate) fn in_bounds(&self, addr: u64) -> bool {
        self.bounds[0].load(Relaxed) <= addr && addr < self.bounds[1].load(Relaxed)
    }

    #[inline(always)]
    pub(crate) fn with_serving<T>(&self, word: u64, f: impl FnOnce(&Serving) -> Option<T>) -> Option<T> {
        with_serving(self.uid.load(Relaxed), Word::epoch(word), || self.cold.lock().serving.clone(), f)
    }

    /// Takes the schedule's next step for an allocation, if it is one (the step is then taken).
    #[inline(always)]
    pub(crate) fn serve_allocation(&self, word: u64, size: u64, stream: StreamId) -> Served {
        // In a forked child the cold path refuses.
        if fork::forked_since(self.generation) {
            return Served::Missed;
        }
        let Some((take, next, wraps)) = self.with_serving(
            word,
            #[inline(always)]
            |s| s.allocation(word, size, stream),
        ) else {
            return Served::Missed;
        };
        self.take_step(word, next, wraps, take)
    }

    /// Takes the schedule's next step for a free, if it is one.
    #[inline(always)]
    pub(crate) fn serve_free(&self, word: u64, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Served {
        if fork::forked_since(self.generation) {
            return Served::Missed;
        }
        let Some((take, next, wraps)) = self.with_serving(
            word,
            #[inline(always)]
            |s| s.free(word, addr, size, stream),
        ) else {
            return Served::Missed;
        };
        self.take_step(word, next, wraps, take)
    }

    /// Takes the schedule's next step where `step` finds it is one in the arena; a step of the
    /// pool's is left untaken (`Missed`), for `allocate` or `free` to take.
    #[inline(always)]
    fn serve_in_arena(&self, word: u64, step: impl FnOnce(&Serving) -> Option<(Take, u64, bool)>) -> Served {
        if fork::forked_since(self.generation) {
            return Served::Missed;
        }
        match self.with_serving(word, step) {
            Some((take @ (Take::Arena(_) | Take::ArenaFreed { .. }), next, wraps)) => self.take_step(word, next, wraps, take),
            _ => Served::Missed,
        }
    }

    /// Moves the word from `word` to `next`, where no other call moved it first.
    #[inline(always)]
    pub(crate) fn take_step(&self, word: u64, next: u64, wraps: bool, take: Take) -> Served {
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
    pub(crate) fn allocate_pool_step(&self, word: u64, index: Option<usize>, size: u64, stream: StreamId) -> Result<u64, PoolError> {
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
    pub(crate) fn free_pool_step(
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
    pub(crate) fn note_pool_buffer(&self, word: u64, index: usize, addr: Option<u64>) {
        self.with_serving(word, |s| {
            s.note_pool_buffer(index, addr);
            Some(())
        });
    }
}

impl<B: MemoryResource> Drop for PlannedPool<B> {
    /// Gives the arena back unless arena buffers are still live (then it stays allocated in the
    /// pool: their owners may still use them).
    fn drop(&mut self) {
        let _ = self.release_idle_arena();
    }
}
