//! The planned arena: record an iteration's allocations, plan them, and serve the same sequence in later
//! iterations from one arena at the planned offsets; on any divergence fall back to the dynamic pool for the
//! rest of the iteration and plan the new sequence. Plans are kept per signature key, as ONNX Runtime keeps
//! memory patterns per input shape.
//!
//! Why exact matching: a plan only promises that buffers live at the same *event index* of the recorded
//! sequence do not share bytes. While the event sequence (sizes, streams, which buffer each free names)
//! matches the recording, the arena buffers live at each moment are a subset of those the plan saw live at the
//! same index, so they never overlap. At the first mismatch no new arena buffer is handed out.
//!
//! ```
//! use std::sync::Arc;
//! use vrampool_core::{Pool, PoolConfig, SimDevice, SimMode, StreamId};
//! use vrampool_plan::PlannedPool;
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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vrampool_core::{fork, InvalidFreeReason, MemoryResource, PoolError, StreamId};

use crate::{plan, Algorithm, Buffer, Plan, PlanOptions};

/// The key of the iteration before the first `step`, and of every iteration whose caller names none.
pub const DEFAULT_KEY: u64 = 0;

/// The key that lets an iteration's first allocation pick its plan: the one recorded for an iteration that
/// began with an allocation of the same size on the same stream (a step whose input shape changed begins
/// with a buffer of another size). What automatic boundaries (`with_auto_steps`) use.
pub const AUTO_KEY: u64 = u64::MAX;

/// With automatic boundaries, an iteration that allocated fewer buffers than this is not planned: a
/// repeating workload's step is planned, not each pair of a program that allocates and frees one buffer at a
/// time.
pub const AUTO_PLAN_ALLOCATIONS: usize = 8;

/// An iteration records at most this many events; a longer one is not planned: a program that never reaches
/// a boundary must not grow the record without end, nor stall the free that ends it on a plan of a hundred
/// thousand buffers (a training step allocates thousands).
const MAX_RECORDED_EVENTS: usize = 1 << 18;

/// The arena's size is a multiple of this: the unit of the default pool's large blocks and mappings.
const ARENA_UNIT: u64 = 2 << 20;

/// The most plans kept; a new key past it replaces an old one.
const MAX_PLANS: usize = 64;

/// One event of an iteration, as matched against the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Alloc {
        size: u64,
        stream: StreamId,
    },
    /// The free of the iteration's `index`-th allocation, naming stream `on` (its own when the caller named none).
    Free {
        index: usize,
        on: StreamId,
    },
    /// The free of a buffer born in an earlier iteration (which one does not matter to this iteration's plan).
    FreeOlder,
    /// `record_stream` of the iteration's `index`-th allocation (None: an older buffer) on another stream.
    UsedOn {
        index: Option<usize>,
        stream: StreamId,
    },
}

/// A recorded sequence and where each of its allocations goes.
#[derive(Debug)]
struct StoredPlan {
    events: Vec<Event>,
    /// Per allocation of the sequence: its offset in the arena, or None for the dynamic pool (it outlived the
    /// iteration, or was freed on another stream than its own).
    slots: Vec<Option<u64>>,
    arena_bytes: u64,
    lower_bound_bytes: u64,
}

/// The figures of one key's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPlan {
    pub key: u64,
    pub arena_bytes: u64,
    /// The most bytes live at once among the arena buffers (per stream, summed): no plan needs less.
    pub lower_bound_bytes: u64,
    /// Allocations of the sequence served from the arena, and from the dynamic pool.
    pub arena_buffers: usize,
    pub dynamic_buffers: usize,
    pub events: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlannedStats {
    /// Allocations served from the arena.
    pub planned_allocations: u64,
    /// Allocations served by the pool.
    pub dynamic_allocations: u64,
    /// Iterations that diverged from their key's plan (and were planned anew).
    pub fallbacks: u64,
    /// Iterations that ran without a plan for their key (and were recorded and planned).
    pub recorded_iterations: u64,
    /// Iterations that matched their key's plan to the end.
    pub replayed_iterations: u64,
    pub arena_bytes: u64,
    /// Arena buffers live now.
    pub arena_live: usize,
    /// The bytes of the live arena buffers.
    pub arena_live_bytes: u64,
    /// The bytes of every arena buffer handed out.
    pub planned_bytes: u64,
    /// Arena blocks taken from the pool and given back to it, with their bytes.
    pub arena_blocks_taken: u64,
    pub arena_bytes_taken: u64,
    pub arena_blocks_returned: u64,
    pub arena_bytes_returned: u64,
    /// Per key, in key order.
    pub plans: Vec<KeyPlan>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Arena,
    Pool,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    size: u64,
    stream: StreamId,
    place: Place,
    /// The serial of the iteration it was born in, and its index among that iteration's allocations.
    born_in: u64,
    index: usize,
}

#[derive(Debug)]
struct ArenaBlock {
    base: u64,
    bytes: u64,
    stream: StreamId,
    /// Streams other than `stream` that used arena bytes: the pool must wait for them when the block goes back.
    users: Vec<StreamId>,
    /// An arena buffer was used on another stream than its own (a free naming it, or `record_stream`): its bytes
    /// may still be in use there, so the block is not reused but replaced (the pool orders its reuse after that
    /// stream's work).
    retired: bool,
}

#[derive(Debug)]
struct Iteration {
    serial: u64,
    key: u64,
    plan: Option<Arc<StoredPlan>>,
    /// Whether every event so far matched `plan`.
    matching: bool,
    events: Vec<Event>,
    allocations: usize,
    /// More events than `MAX_RECORDED_EVENTS`: no longer recorded, and not planned.
    overflowed: bool,
}

impl Iteration {
    /// An iteration without a plan yet: `step` looks its key's plan up once the ended iteration is stored.
    fn new(serial: u64, key: u64) -> Self {
        Iteration { serial, key, plan: None, matching: false, events: Vec::new(), allocations: 0, overflowed: false }
    }

    /// Whether `event`, as the next one, still follows the plan.
    fn follows(&self, event: &Event) -> bool {
        self.matching && self.plan.as_ref().is_some_and(|p| p.events.get(self.events.len()) == Some(event))
    }
}

#[derive(Debug)]
struct State {
    plans: HashMap<u64, Arc<StoredPlan>>,
    arena: Option<ArenaBlock>,
    live: HashMap<u64, Live>,
    arena_live: usize,
    /// The bytes of the live arena buffers.
    arena_live_bytes: u64,
    /// Arena buffers born in an earlier iteration and still live: no new arena buffer until they are gone.
    stale_arena: usize,
    iteration: Iteration,
    stats: PlannedStats,
}

/// A planned arena over a pool: see the module documentation. `Send + Sync`; every call takes one lock.
/// In a process forked from the one that made it, every call refuses (`PoolError::Forked`) before the
/// lock, which a thread of the parent may have held at the fork, as the core pool does.
pub struct PlannedPool<B: MemoryResource> {
    backing: B,
    budget: Duration,
    alignment: u64,
    generation: u64,
    /// Iterations also end by themselves, once nothing is live, and begin with `AUTO_KEY`.
    auto_steps: bool,
    state: Mutex<State>,
}

impl<B: MemoryResource> PlannedPool<B> {
    /// A planned pool whose plans search for at most 10 ms each (a step boundary should not stall training).
    pub fn new(backing: B) -> Self {
        Self::with_budget(backing, Duration::from_millis(10))
    }

    pub fn with_budget(backing: B, budget: Duration) -> Self {
        let state = State {
            plans: HashMap::new(),
            arena: None,
            live: HashMap::new(),
            arena_live: 0,
            arena_live_bytes: 0,
            stale_arena: 0,
            iteration: Iteration::new(0, DEFAULT_KEY),
            stats: PlannedStats::default(),
        };
        let alignment = backing.alignment();
        PlannedPool {
            backing,
            budget,
            alignment,
            generation: fork::generation(),
            auto_steps: false,
            state: Mutex::new(state),
        }
    }

    /// Iteration boundaries without a caller: an iteration ends once nothing this pool handed out is live,
    /// every iteration picks its plan by its first allocation (`AUTO_KEY`), and one of fewer than
    /// `AUTO_PLAN_ALLOCATIONS` allocations is not planned. A loop that frees all it allocated each step is
    /// then served from the arena from its second step on, with no call of its own.
    pub fn with_auto_steps(mut self) -> Self {
        self.auto_steps = true;
        self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).iteration.key = AUTO_KEY;
        self
    }

    /// Whether iterations end by themselves ([`PlannedPool::with_auto_steps`]).
    pub fn has_auto_steps(&self) -> bool {
        self.auto_steps
    }

    /// Arena offsets in multiples of `alignment` (by default the backing's alignment).
    pub fn with_alignment(mut self, alignment: u64) -> Self {
        self.alignment = alignment;
        self
    }

    pub fn backing(&self) -> &B {
        &self.backing
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, PoolError> {
        if fork::forked_since(self.generation) {
            return Err(PoolError::Forked);
        }
        Ok(self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Allocates `size` bytes for `stream`: from the arena when this allocation follows the key's plan, else
    /// from the pool.
    pub fn allocate(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        let mut guard = self.lock()?;
        let state = &mut *guard;
        if state.iteration.key == AUTO_KEY && state.iteration.allocations == 0 {
            self.choose_plan(state, signature(size, stream));
        }
        let event = Event::Alloc { size, stream };
        let follows = state.iteration.follows(&event);
        let index = state.iteration.allocations;
        let slot = if follows { state.iteration.plan.as_ref().and_then(|p| p.slots[index]) } else { None };
        let arena_addr = match slot {
            Some(offset) if state.stale_arena == 0 => self.arena_base(state, stream).map(|base| base + offset),
            _ => None,
        };
        let (addr, place) = match arena_addr {
            Some(addr) => (addr, Place::Arena),
            None => (self.backing.allocate(size, stream)?, Place::Pool),
        };
        let serial = state.iteration.serial;
        state.live.insert(addr, Live { size, stream, place, born_in: serial, index });
        match place {
            Place::Arena => {
                state.arena_live += 1;
                state.arena_live_bytes += size;
                state.stats.planned_allocations += 1;
                state.stats.planned_bytes += size;
                if let Some(arena) = state.arena.as_mut().filter(|a| a.stream != stream && !a.users.contains(&stream)) {
                    arena.users.push(stream);
                }
            }
            Place::Pool => state.stats.dynamic_allocations += 1,
        }
        state.iteration.allocations += 1;
        record(&mut state.iteration, event, follows, &mut state.stats);
        Ok(addr)
    }

    /// Frees a buffer this pool handed out. `size`, when given, must be the size it was allocated with;
    /// `stream`, when given, is a stream that used it last. Arena buffers cost no pool call.
    pub fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let state = &mut *guard;
        let Some(&live) = state.live.get(&addr) else {
            return Err(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated });
        };
        if let Some(given) = size.filter(|&s| s != live.size) {
            let reason = InvalidFreeReason::WrongSize { expected: live.size, given };
            return Err(PoolError::InvalidFree { ptr: addr, reason });
        }
        let on = stream.unwrap_or(live.stream);
        match live.place {
            Place::Pool => self.backing.free(addr, Some(live.size), stream)?,
            Place::Arena => {
                state.arena_live -= 1;
                state.arena_live_bytes -= live.size;
                if live.born_in != state.iteration.serial {
                    state.stale_arena -= 1;
                }
                if on != live.stream {
                    if let Some(arena) = state.arena.as_mut() {
                        arena.users.push(on);
                        arena.retired = true;
                    }
                }
            }
        }
        state.live.remove(&addr);
        let event = if live.born_in == state.iteration.serial {
            Event::Free { index: live.index, on }
        } else {
            Event::FreeOlder
        };
        let follows = state.iteration.follows(&event);
        record(&mut state.iteration, event, follows, &mut state.stats);
        if self.auto_steps && state.live.is_empty() {
            self.end_iteration(state, AUTO_KEY);
        }
        Ok(())
    }

    /// Marks the live buffer at `addr` as used on `stream` too (`Tensor.record_stream`). A pool buffer's reuse
    /// then waits for that stream (the pool's rule); an arena buffer's bytes may still be in use there after
    /// its free, so the arena is replaced rather than reused once it is idle. Planned sequences leave such
    /// buffers to the pool.
    pub fn record_stream(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let state = &mut *guard;
        let Some(&live) = state.live.get(&addr) else {
            return Err(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated });
        };
        if stream == live.stream {
            return Ok(());
        }
        match live.place {
            Place::Pool => self.backing.record_stream(addr, stream)?,
            Place::Arena => {
                if let Some(arena) = state.arena.as_mut() {
                    arena.users.push(stream);
                    arena.retired = true;
                }
            }
        }
        let index = (live.born_in == state.iteration.serial).then_some(live.index);
        let event = Event::UsedOn { index, stream };
        let follows = state.iteration.follows(&event);
        record(&mut state.iteration, event, follows, &mut state.stats);
        Ok(())
    }

    /// Whether `addr` is a live buffer of this pool (never in a forked child).
    pub fn owns(&self, addr: u64) -> bool {
        self.lock().is_ok_and(|state| state.live.contains_key(&addr))
    }

    /// Whether a free of `addr` is this pool's to answer: a live buffer of it, or an address inside its arena
    /// (a double free there must not reach the pool, where the arena's own block would go).
    pub fn claims(&self, addr: u64) -> bool {
        let Ok(state) = self.lock() else { return false };
        state.live.contains_key(&addr)
            || state.arena.as_ref().is_some_and(|a| a.base <= addr && addr < a.base + a.bytes)
    }

    /// Ends the iteration and starts the next, whose signature is `key`. The iteration that ends is planned
    /// and its plan stored under its key when it had no plan or diverged from it; an iteration without
    /// allocations or frees leaves the plans as they are.
    pub fn step(&self, key: u64) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        self.end_iteration(&mut guard, key);
        Ok(())
    }

    fn end_iteration(&self, state: &mut State, key: u64) {
        let serial = state.iteration.serial + 1;
        let ended = std::mem::replace(&mut state.iteration, Iteration::new(serial, key));
        let too_few = self.auto_steps && ended.allocations < AUTO_PLAN_ALLOCATIONS;
        if !ended.events.is_empty() && !ended.overflowed && ended.key != AUTO_KEY && !too_few {
            match &ended.plan {
                Some(plan) if ended.matching && ended.events.len() == plan.events.len() => {
                    state.stats.replayed_iterations += 1;
                }
                Some(_) => {
                    // Diverged at an event (counted there) or ended early.
                    if ended.matching {
                        state.stats.fallbacks += 1;
                    }
                    self.store_plan(state, &ended);
                }
                None => {
                    state.stats.recorded_iterations += 1;
                    self.store_plan(state, &ended);
                }
            }
        }
        state.stale_arena = state.arena_live;
        if key != AUTO_KEY {
            self.choose_plan(state, key);
        }
    }

    /// Gives the iteration the plan stored under `key`, which its events so far (frees of older buffers) must
    /// begin.
    fn choose_plan(&self, state: &mut State, key: u64) {
        let iteration = &mut state.iteration;
        iteration.key = key;
        iteration.plan = state.plans.get(&key).cloned();
        iteration.matching = iteration.plan.as_ref().is_some_and(|p| p.events.starts_with(&iteration.events));
        if iteration.plan.is_none() && state.arena_live == 0 {
            // This iteration runs on the pool: give the idle arena back rather than hold it beside what the
            // iteration allocates (to the device when the caller names the boundaries; with automatic ones, to
            // the pool only, whose cache then serves the iteration with no device call: see `arena_base`). A
            // failed release keeps the arena; the next plan replaces it.
            if self.release_arena(state).is_ok_and(|bytes| bytes > 0) && !self.auto_steps {
                let _ = self.backing.trim();
            }
        }
    }

    /// The pool's figures of the planned arena.
    pub fn stats(&self) -> Result<PlannedStats, PoolError> {
        let state = self.lock()?;
        let mut stats = state.stats.clone();
        stats.arena_bytes = state.arena.as_ref().map_or(0, |a| a.bytes);
        stats.arena_live = state.arena_live;
        stats.arena_live_bytes = state.arena_live_bytes;
        stats.plans = state
            .plans
            .iter()
            .map(|(&key, p)| {
                let arena_buffers = p.slots.iter().filter(|s| s.is_some()).count();
                KeyPlan {
                    key,
                    arena_bytes: p.arena_bytes,
                    lower_bound_bytes: p.lower_bound_bytes,
                    arena_buffers,
                    dynamic_buffers: p.slots.len() - arena_buffers,
                    events: p.events.len(),
                }
            })
            .collect();
        stats.plans.sort_by_key(|p| p.key);
        Ok(stats)
    }

    /// Gives the arena back to the pool if no arena buffer is live; returns the bytes given back. The next
    /// planned allocation takes a new one.
    pub fn release_idle_arena(&self) -> Result<u64, PoolError> {
        let mut state = self.lock()?;
        if state.arena_live > 0 {
            return Ok(0);
        }
        self.release_arena(&mut state)
    }

    fn store_plan(&self, state: &mut State, ended: &Iteration) {
        let options = PlanOptions { algorithm: Algorithm::Auto, budget: self.budget, alignment: self.alignment };
        // A sequence the planner refuses (sizes that overflow once aligned) stays unplanned: it runs on the pool.
        match plan_sequence(&ended.events, &options) {
            Some(plan) => {
                if state.plans.len() >= MAX_PLANS && !state.plans.contains_key(&ended.key) {
                    let old = state.plans.keys().next().copied();
                    old.map(|k| state.plans.remove(&k));
                }
                state.plans.insert(ended.key, Arc::new(plan))
            }
            None => state.plans.remove(&ended.key),
        };
    }

    /// The arena's base, (re)allocating it when it is missing, too small for the largest plan, or retired, and
    /// no arena buffer is live; None when the allocation has to go to the pool instead.
    fn arena_base(&self, state: &mut State, stream: StreamId) -> Option<u64> {
        // In whole units of the pool's large blocks and mappings, so that the block is as large as asked.
        let needed =
            state.plans.values().map(|p| p.arena_bytes).max().unwrap_or(0).checked_next_multiple_of(ARENA_UNIT)?;
        if let Some(arena) = &state.arena {
            if arena.bytes >= needed && !arena.retired {
                return Some(arena.base);
            }
        }
        if state.arena_live > 0 || self.release_arena(state).is_err() {
            return None;
        }
        // The arena takes over from the memory the recorded iterations left cached in the pool. Where the caller
        // names the boundaries, that goes back first, so the pool does not hold both (a failed trim costs
        // memory, not correctness). With automatic ones the pool's own growth gives back what the arena needs
        // and no more (`PoolConfig::reclaim`): a program whose steps do not repeat pays no trim each time an
        // iteration happens to begin like a recorded one.
        if !self.auto_steps {
            let _ = self.backing.trim();
        }
        let base = self.backing.allocate(needed, stream).ok()?;
        state.stats.arena_blocks_taken += 1;
        state.stats.arena_bytes_taken += needed;
        state.arena = Some(ArenaBlock { base, bytes: needed, stream, users: Vec::new(), retired: false });
        Some(base)
    }

    fn release_arena(&self, state: &mut State) -> Result<u64, PoolError> {
        let Some(arena) = state.arena.take() else { return Ok(0) };
        let result = arena
            .users
            .iter()
            .filter(|&&s| s != arena.stream)
            .try_for_each(|&s| self.backing.record_stream(arena.base, s))
            .and_then(|()| self.backing.free(arena.base, Some(arena.bytes), None));
        match result {
            Ok(()) => {
                state.stats.arena_blocks_returned += 1;
                state.stats.arena_bytes_returned += arena.bytes;
                Ok(arena.bytes)
            }
            Err(e) => {
                state.arena = Some(arena);
                Err(e)
            }
        }
    }
}

impl<B: MemoryResource> Drop for PlannedPool<B> {
    /// Gives the arena back unless arena buffers are still live (then it stays allocated in the pool: their
    /// owners may still use them). Buffers from the pool stay the pool's.
    fn drop(&mut self) {
        let _ = self.release_idle_arena();
    }
}

/// Appends `event` to the iteration; the first event off the plan ends the matching and counts a fallback.
fn record(iteration: &mut Iteration, event: Event, follows: bool, stats: &mut PlannedStats) {
    if iteration.matching && !follows {
        iteration.matching = false;
        stats.fallbacks += 1;
    }
    if iteration.events.len() == MAX_RECORDED_EVENTS {
        iteration.overflowed = true;
        iteration.matching = false;
    }
    if !iteration.overflowed {
        iteration.events.push(event);
    }
}

/// One stream's region: greedy by size's plan, which always completes (a step boundary must never get a
/// worse plan because the machine was busy when the budget ran), and the budgeted search's where greedy
/// stops above the lower bound and the search beats it.
fn plan_region(buffers: &[Buffer], options: &PlanOptions) -> Option<Plan> {
    let greedy = plan(buffers, &PlanOptions { algorithm: Algorithm::GreedyBySize, ..*options }).ok()?;
    if greedy.arena_bytes <= greedy.lower_bound_bytes || options.algorithm == Algorithm::GreedyBySize {
        return Some(greedy);
    }
    match plan(buffers, options) {
        Ok(searched) if searched.arena_bytes < greedy.arena_bytes => Some(searched),
        _ => Some(greedy),
    }
}

/// The automatic key of an iteration that begins with an allocation of `size` bytes on `stream`.
fn signature(size: u64, stream: StreamId) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (size, stream.0).hash(&mut hasher);
    // Never AUTO_KEY itself.
    hasher.finish().min(AUTO_KEY - 1)
}

/// Plans the buffers born and freed inside `events` and used on their own stream only, each stream in its own
/// region of the arena. Times are event indices.
fn plan_sequence(events: &[Event], options: &PlanOptions) -> Option<StoredPlan> {
    // Per allocation: (stream, size, born, freed at).
    let mut births: Vec<(StreamId, u64, u64, Option<u64>)> = Vec::new();
    let mut used_elsewhere: Vec<bool> = Vec::new();
    for (time, event) in events.iter().enumerate() {
        match *event {
            Event::Alloc { size, stream } => {
                births.push((stream, size, time as u64, None));
                used_elsewhere.push(false);
            }
            // A buffer used on another stream is left to the pool, which orders its reuse after that stream;
            // the arena cannot.
            Event::Free { index, on } if births[index].0 == on && !used_elsewhere[index] => {
                births[index].3 = Some(time as u64)
            }
            Event::UsedOn { index: Some(index), .. } => used_elsewhere[index] = true,
            Event::Free { .. } | Event::FreeOlder | Event::UsedOn { index: None, .. } => {}
        }
    }
    let mut streams: Vec<StreamId> = births.iter().map(|b| b.0).collect();
    streams.sort_unstable();
    streams.dedup();
    // Streams get disjoint regions: a GPU stream may still be using a buffer the host order says is dead.
    let mut slots = vec![None; births.len()];
    let (mut arena_bytes, mut lower_bound_bytes) = (0u64, 0u64);
    for stream in streams {
        let (indices, buffers): (Vec<usize>, Vec<Buffer>) = births
            .iter()
            .enumerate()
            .filter_map(|(i, &(s, size, born, freed))| {
                let upper = freed.filter(|_| s == stream)?;
                Some((i, Buffer::new(i as u64, born, upper, size)))
            })
            .unzip();
        let region = plan_region(&buffers, options)?;
        for (&i, &offset) in indices.iter().zip(&region.offsets) {
            slots[i] = Some(arena_bytes.checked_add(offset)?);
        }
        arena_bytes = arena_bytes.checked_add(region.arena_bytes)?;
        lower_bound_bytes = lower_bound_bytes.checked_add(region.lower_bound_bytes)?;
    }
    Some(StoredPlan { events: events.to_vec(), slots, arena_bytes, lower_bound_bytes })
}
