//! Trace replay: feed a recorded sequence of allocations and frees through a pool on the
//! address-only simulated device, and report what it reserved beside the lower bound.
//!
//! The trace format is the planner's CSV, `id,lower,upper,size`, with an optional `stream`
//! column: one buffer a row, live on `[lower, upper)`, where the times are event indices or any
//! monotone clock. [`events_from_buffers`] turns the rows into events: at each time, the frees of
//! buffers whose `upper` is that time come before the allocations whose `lower` is that time, and
//! ties are broken by id.
//!
//! ```
//! use vrampool_whatif::replay::{events_from_buffers, replay, TraceBuffer};
//! use vrampool_core::PoolConfig;
//!
//! let buffers = [TraceBuffer::new(0, 0, 2, 1 << 20), TraceBuffer::new(1, 1, 3, 1 << 20), TraceBuffer::new(2, 2, 4, 1 << 20)];
//! let events = events_from_buffers(&buffers).unwrap();
//! let report = replay(&events, PoolConfig::default()).unwrap();
//! assert_eq!(report.lower_bound_bytes, 2 << 20);
//! assert!(report.peak_reserved_bytes >= report.lower_bound_bytes);
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;

use crate::peers::PeerModel;
pub use crate::replay_row::ReplayTarget;
use vrampool_core::device::{SimDevice, SimMode, StreamId};
use vrampool_core::error::{ArenaHeld, OomReport, PoolError};
use vrampool_core::sizes::MAX_REQUEST;
use vrampool_core::stats::fragmentation;
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{MemoryResource, Pool, PoolConfig};
use vrampool_steady::{AheadPlan, PlannedMode, AUTO_KEY};

/// Capacity of the simulated device a replay runs on: large enough that no trace runs out.
pub const REPLAY_CAPACITY: u64 = 1 << 50;

/// Every strategy, in the order `--strategy all` replays them.
pub const ALL_STRATEGIES: [StrategyKind; 4] = [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid];

/// One buffer of a trace: `size` bytes live on `[lower, upper)`, used on `stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceBuffer {
    pub id: u64,
    pub lower: u64,
    pub upper: u64,
    pub size: u64,
    pub stream: u64,
}

impl TraceBuffer {
    /// A buffer on the default stream.
    pub fn new(id: u64, lower: u64, upper: u64, size: u64) -> Self {
        Self { id, lower, upper, size, stream: 0 }
    }
}

/// One event of a trace, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    Alloc { id: u64, size: u64, stream: u64 },
    Free { id: u64 },
}

/// Timeline points a replay samples unless told otherwise (the plots' resolution).
pub const DEFAULT_SAMPLES: usize = 1000;

/// The pool's figures after the first `event` events of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineSample {
    pub event: usize,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

/// How a replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Timeline points to sample, at most (none for 0; fewer on a trace of thousands of streams:
    /// see [`replay_stride`]).
    pub samples: usize,
    /// The simulated device's memory; None for [`REPLAY_CAPACITY`], which no trace fills.
    pub capacity: Option<u64>,
    /// Copies of the trace replayed back to back (at least 1).
    pub repeat: u64,
    /// Between copies, every cached byte goes back (`trim` of the pool, the models'
    /// `empty_cache`), as `torch.cuda.empty_cache()` at the end of each training step would.
    pub trim_each_pass: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self { samples: DEFAULT_SAMPLES, capacity: None, repeat: 1, trim_each_pass: false }
    }
}

/// Where a capacity-limited replay ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The index of the allocation that failed (the replay stops there).
    pub event: usize,
    pub report: OomReport,
}

/// What one strategy did with a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// The pool's strategy, or the allocator model's name.
    pub strategy: &'static str,
    /// The model guesses at undocumented internals.
    pub approximate: bool,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// The most requested bytes live at once: no allocator can reserve less.
    pub lower_bound_bytes: u64,
    /// Allocations and frees replayed.
    pub events: usize,
    /// Time spent in the replay loop alone (not parsing, not setting up the pool).
    pub seconds: f64,
    pub events_per_s: f64,
    /// Segments the pool asked the device for (plain segments, or map calls).
    pub device_allocs: u64,
    /// Segments given back to the device (frees, or unmap calls).
    pub device_frees: u64,
    /// The peak reserved at the end of the first copy of the trace (the whole replay's, for one).
    pub first_pass_peak_reserved_bytes: u64,
    /// Device allocations and frees made during the last copy alone: a repeating workload's
    /// steady state (every call, for one copy).
    pub last_pass_device_allocs: u64,
    pub last_pass_device_frees: u64,
    /// External fragmentation (1 - largest free range / bytes in free ranges) at the sample with
    /// the most bytes allocated: how scattered the spare memory is when memory is tightest (0
    /// when the replay samples no timeline).
    pub fragmentation: f64,
    /// Allocated and reserved bytes at evenly spaced event indices (the last one is the end).
    pub timeline: Vec<TimelineSample>,
    /// Set when the device's capacity ran out (after the allocator's own release and retry): the
    /// figures are those up to that event.
    pub out_of_memory: Option<OutOfMemory>,
}

/// Why a trace could not be read or replayed. Bad input is an error, never a panic.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// The CSV text is malformed; `line` counts from 1 (the header).
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
    /// A buffer of the trace is not well formed.
    #[error("buffer {id}: {message}")]
    BadBuffer { id: u64, message: String },
    #[error("event {index}: free of id {id}, which is not live")]
    UnknownId { index: usize, id: u64 },
    #[error("event {index}: id {id} allocated again while live")]
    DuplicateId { index: usize, id: u64 },
    #[error("event {index}: allocation of 0 bytes (id {id})")]
    ZeroSize { index: usize, id: u64 },
    #[error("cannot replay {events} events {times} times: a replay runs a trace at least once, and no more often than it can count")]
    Repeat { times: u64, events: usize },
    /// The pool refused an event (or could not be made).
    #[error("event {index}: {source}")]
    Pool { index: usize, source: PoolError },
}

/// Reads the trace CSV: a header naming `id`, `lower`, `upper` and `size` (in any order), and
/// optionally `stream` (and `offset`, ignored: a solved plan reads as a trace), then one buffer a
/// row. Blank lines are skipped; spaces and `\r` are trimmed. Errors name the line.
pub fn read_trace_csv(text: &str) -> Result<Vec<TraceBuffer>, ReplayError> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty());
    let parse_err = |line: usize, message: String| ReplayError::Parse { line, message };
    let Some((header_line, header)) = lines.next() else {
        return Err(parse_err(1, "empty trace: expected a header `id,lower,upper,size[,stream]`".into()));
    };
    // Column index of id, lower, upper, size, stream.
    let mut index: [Option<usize>; 5] = [None; 5];
    const NAMES: [&str; 5] = ["id", "lower", "upper", "size", "stream"];
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    for (i, name) in columns.iter().enumerate() {
        match NAMES.iter().position(|n| n == name) {
            Some(k) if index[k].is_some() => {
                return Err(parse_err(header_line, format!("column `{}` appears twice in the header", excerpt(name))))
            }
            Some(k) => index[k] = Some(i),
            None if *name == "offset" => {}
            None => {
                return Err(parse_err(
                    header_line,
                    format!("unknown column `{}` (expected id,lower,upper,size and optionally stream)", excerpt(name)),
                ))
            }
        }
    }
    if let Some(k) = (0..4).find(|&k| index[k].is_none()) {
        return Err(parse_err(header_line, format!("the header `{}` lacks the `{}` column", excerpt(header), NAMES[k])));
    }
    let mut buffers = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (line, row) in lines {
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if fields.len() != columns.len() {
            return Err(parse_err(line, format!("expected {} fields, found {}", columns.len(), fields.len())));
        }
        let mut values = [0u64; 5];
        for k in 0..5 {
            if let Some(i) = index[k] {
                let text = fields[i];
                values[k] = text
                    .parse::<u64>()
                    .ok()
                    .filter(|_| text.bytes().all(|c| c.is_ascii_digit()))
                    .ok_or_else(|| parse_err(line, format!("{} `{}` is not a non-negative integer", NAMES[k], excerpt(text))))?;
            }
        }
        let [id, lower, upper, size, stream] = values;
        let buffer = TraceBuffer { id, lower, upper, size, stream };
        check_buffer(&buffer).map_err(|message| parse_err(line, message))?;
        if !ids.insert(id) {
            return Err(parse_err(line, format!("id {id} appears twice")));
        }
        buffers.push(buffer);
    }
    Ok(buffers)
}

/// At most the first 100 bytes of `text` (cut at a character boundary), for quoting bad input in
/// a message.
fn excerpt(text: &str) -> String {
    const MAX: usize = 100;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let cut = (0..=MAX).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}... ({} more bytes)", &text[..cut], text.len() - cut)
}

fn check_buffer(b: &TraceBuffer) -> Result<(), String> {
    if b.upper <= b.lower {
        return Err(format!("upper ({}) must exceed lower ({})", b.upper, b.lower));
    }
    if b.size == 0 {
        return Err("size must be at least 1 byte".into());
    }
    Ok(())
}

/// The events of a set of buffers: at each time, frees (of the buffers whose `upper` it is)
/// before allocations (of those whose `lower` it is), ties broken by id.
pub fn events_from_buffers(buffers: &[TraceBuffer]) -> Result<Vec<TraceEvent>, ReplayError> {
    let mut keyed = Vec::with_capacity(buffers.len() * 2);
    for b in buffers {
        check_buffer(b).map_err(|message| ReplayError::BadBuffer { id: b.id, message })?;
        keyed.push(((b.lower, 1u8, b.id), TraceEvent::Alloc { id: b.id, size: b.size, stream: b.stream }));
        keyed.push(((b.upper, 0u8, b.id), TraceEvent::Free { id: b.id }));
    }
    keyed.sort_unstable_by_key(|(key, _)| *key);
    Ok(keyed.into_iter().map(|(_, e)| e).collect())
}

/// Where step markers at `steps` (times of the buffers' clock, as a trace's `step` events) fall
/// among the buffers' events: each before every event at or after its time.
pub fn step_positions(buffers: &[TraceBuffer], steps: &[u64]) -> Vec<usize> {
    let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.lower, b.upper]).collect();
    times.sort_unstable();
    steps.iter().map(|&t| times.partition_point(|&event| event < t)).collect()
}

/// A trace checked and lowered for the replay loop (ids mapped to dense slots), so that several
/// configurations can replay it without checking it again.
pub struct PreparedTrace {
    /// `(slot, size, stream)`; a size of 0 is a free.
    ops: Vec<(u32, u64, u64)>,
    slots: usize,
    lower_bound: u64,
    /// Positions in `ops` before which a step ends (sorted; `ops.len()`: at the end).
    steps: Vec<usize>,
    /// Streams the trace allocates on.
    streams: usize,
}

impl PreparedTrace {
    /// Checks `events`: a free of an id that is not live, an id allocated twice and a zero-byte
    /// allocation are errors.
    pub fn new(events: &[TraceEvent]) -> Result<Self, ReplayError> {
        let mut live: HashMap<u64, (u32, u64)> = HashMap::new();
        let mut streams = HashSet::new();
        let mut spare: Vec<u32> = Vec::new();
        let mut slots = 0u32;
        // Live bytes can pass u64 (two 2^63 B buffers): counted wide, the bound saturates.
        let (mut now, mut lower_bound) = (0u128, 0u128);
        let mut ops = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match *event {
                TraceEvent::Alloc { id, size, stream } => {
                    if size == 0 {
                        return Err(ReplayError::ZeroSize { index, id });
                    }
                    let slot = spare.pop().unwrap_or_else(|| {
                        slots += 1;
                        slots - 1
                    });
                    if live.insert(id, (slot, size)).is_some() {
                        return Err(ReplayError::DuplicateId { index, id });
                    }
                    now += u128::from(size);
                    lower_bound = lower_bound.max(now);
                    streams.insert(stream);
                    ops.push((slot, size, stream));
                }
                TraceEvent::Free { id } => {
                    let (slot, size) = live.remove(&id).ok_or(ReplayError::UnknownId { index, id })?;
                    now -= u128::from(size);
                    spare.push(slot);
                    ops.push((slot, 0, 0));
                }
            }
        }
        let lower_bound = u64::try_from(lower_bound).unwrap_or(u64::MAX);
        Ok(Self { ops, slots: slots as usize, lower_bound, steps: Vec::new(), streams: streams.len() })
    }

    /// The trace with step markers before the events at `positions` (see [`step_positions`]): the
    /// `ahead` row ends its step there, as `vrampool.torch.install()` does at each optimizer step;
    /// the other rows' iterations end by themselves, and they ignore the markers.
    pub fn with_steps(mut self, positions: &[usize]) -> Self {
        self.steps = positions.iter().map(|&p| p.min(self.ops.len())).collect();
        self.steps.sort_unstable();
        self.steps.dedup();
        self
    }

    /// Allocations and frees.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The most requested bytes live at once (u64::MAX where they pass it).
    pub fn lower_bound_bytes(&self) -> u64 {
        self.lower_bound
    }
}

/// Replays `events` through a new pool with `config` on an address-only simulated device of
/// [`REPLAY_CAPACITY`] bytes, sampling [`DEFAULT_SAMPLES`] timeline points. The trace is checked
/// first (see [`PreparedTrace::new`]); events per second are measured over the replay loop alone.
pub fn replay(events: &[TraceEvent], config: PoolConfig) -> Result<ReplayReport, ReplayError> {
    replay_prepared(&PreparedTrace::new(events)?, &ReplayTarget::Pool(config), ReplayOptions::default())
}

/// Replays `events` once per strategy of [`ALL_STRATEGIES`], each with `base` but its strategy.
pub fn replay_all(events: &[TraceEvent], base: &PoolConfig) -> Result<Vec<ReplayReport>, ReplayError> {
    let prepared = PreparedTrace::new(events)?;
    ALL_STRATEGIES
        .iter()
        .map(|&strategy| replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig { strategy, ..base.clone() }), ReplayOptions::default()))
        .collect()
}

/// What the replay loop drives: the pool, or an allocator model.
trait Replayed {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError>;
    fn free(&mut self, addr: u64) -> Result<(), PoolError>;
    /// Allocated and reserved bytes now, and the fragmentation of the free memory.
    fn now(&self) -> (u64, u64, f64);
    /// Peak reserved and allocated bytes, device allocations and device frees.
    fn totals(&self) -> (u64, u64, u64, u64);
    /// Gives every cached byte back to the device.
    fn trim(&mut self) -> Result<(), PoolError>;
    /// A step marker of the trace, and the start of a copy after the first: ignored but by the
    /// `ahead` row.
    fn step(&mut self) -> Result<(), PoolError> {
        Ok(())
    }
    fn pass_begins(&mut self) -> Result<(), PoolError> {
        Ok(())
    }
}

/// A pool, or the planned steps over one.
impl<R: MemoryResource + ?Sized> Replayed for &R {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        (**self).allocate(size, StreamId(stream))
    }

    fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        (**self).free(addr, None, None)
    }

    fn now(&self) -> (u64, u64, f64) {
        let stats = self.stats();
        (stats.allocated_bytes.current, stats.reserved_bytes.current, stats.fragmentation())
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        let stats = self.stats();
        (stats.reserved_bytes.peak, stats.allocated_bytes.peak, stats.num_device_alloc, stats.num_device_free)
    }

    fn trim(&mut self) -> Result<(), PoolError> {
        (**self).trim().map(|_| ())
    }
}

/// The pool with the steady option (the `default` row): the planned steps over the pool, its
/// fragmentation that of [`planned_now`].
struct Steady<'a>(&'a PlannedMode<Pool>);

impl Replayed for Steady<'_> {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        self.0.allocate(size, StreamId(stream))
    }

    fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        self.0.free(addr, None, None)
    }

    fn now(&self) -> (u64, u64, f64) {
        planned_now(self.0)
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        self.0.totals()
    }

    fn trim(&mut self) -> Result<(), PoolError> {
        self.0.trim().map(|_| ())
    }
}

/// Allocated and reserved bytes of the planned steps over a pool, and the fragmentation of its free
/// ranges. The arena's idle bytes (its regions' bytes that no live buffer holds) count as free in
/// the mode's figures but lie in no free range: like a cache's blocks they wait for the next
/// buffers and are not scattered memory, so they are left out, as cached blocks are (with them, an
/// arena that serves every step read as fragmentation 1.0).
fn planned_now(mode: &PlannedMode<Pool>) -> (u64, u64, f64) {
    let stats = mode.stats();
    let idle = mode.planned_stats().map_or(0, |p| p.arena_bytes.saturating_sub(p.arena_live_block_bytes));
    let free = stats.free_bytes().saturating_sub(stats.cached_bytes).saturating_sub(idle);
    (stats.allocated_bytes.current, stats.reserved_bytes.current, fragmentation(stats.largest_free_bytes, free))
}

/// The pool with the steady option, served by a plan made ahead, as `vrampool.torch.install(plan=)`
/// serves a training run: steps end at the trace's step markers (the optimizer steps). A plan with
/// a first step of its own (the weights and the optimizer's state planned beside the largest step)
/// is set at a run's first allocation; one without, at the first marker, once the weights and the
/// optimizer's state exist (they live on, and in the plan's bytes would keep them taken); in a
/// trace without markers, at the first allocation, as `DevicePool(plan=)` sets it. Each copy of a
/// repeated replay with markers is a run of its own: the plan is taken off at its start and set
/// again.
struct Ahead<'a> {
    mode: &'a PlannedMode<Pool>,
    plan: Arc<AheadPlan>,
    /// Whether the plan waits to be set.
    pending: bool,
    markers: bool,
}

impl Ahead<'_> {
    /// Whether the plan is set at a run's first allocation (else at its first marker).
    fn at_first_allocation(&self) -> bool {
        !self.markers || self.plan.first_step() > 0
    }

    fn set(&mut self) -> Result<(), PoolError> {
        if !self.pending {
            return Ok(());
        }
        match self.mode.planned().set_ahead(Some(self.plan.clone())) {
            // Refused while buffers of the steady arena live: tried again at the next marker.
            Err(PoolError::InvalidConfig(_)) if self.markers => Ok(()),
            done => {
                self.pending = false;
                done
            }
        }
    }
}

impl Replayed for Ahead<'_> {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        if self.at_first_allocation() {
            self.set()?;
        }
        self.mode.allocate(size, StreamId(stream))
    }

    fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        self.mode.free(addr, None, None)
    }

    fn now(&self) -> (u64, u64, f64) {
        planned_now(self.mode)
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        self.mode.totals()
    }

    fn trim(&mut self) -> Result<(), PoolError> {
        self.mode.trim().map(|_| ())
    }

    fn step(&mut self) -> Result<(), PoolError> {
        self.mode.step(AUTO_KEY);
        self.set()
    }

    fn pass_begins(&mut self) -> Result<(), PoolError> {
        if self.markers {
            self.mode.planned().set_ahead(None)?;
            self.pending = true;
        }
        Ok(())
    }
}

impl Replayed for Box<dyn PeerModel> {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        (**self).allocate(size, stream)
    }

    fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        (**self).free(addr)
    }

    fn now(&self) -> (u64, u64, f64) {
        let f = self.figures();
        (f.allocated, f.reserved, self.fragmentation())
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        let f = self.figures();
        (f.peak_reserved, f.peak_allocated, f.device_allocs, f.device_frees)
    }

    fn trim(&mut self) -> Result<(), PoolError> {
        (**self).empty_cache();
        Ok(())
    }
}

/// Events between timeline samples: ceil(events / samples), so that there are at most `samples`
/// points, the last at the end (`usize::MAX`, no points, for 0 samples).
pub fn sample_stride(events: usize, samples: usize) -> usize {
    if samples == 0 {
        usize::MAX
    } else {
        events.div_ceil(samples).max(1)
    }
}

/// Streams a timeline sample may cost per event replayed (see [`replay_stride`]).
pub const SAMPLE_STREAMS_PER_EVENT: usize = 16;

/// Events between the timeline samples of a replay of `events` events on `streams` streams:
/// [`sample_stride`], widened on a trace of thousands of streams. A sample reads the pool's stats,
/// which visit the arena of every stream holding memory: a thousand samples of 10,000 streams
/// cost far more than the events (20,000 events: 15 s, against 0.2 s unsampled). The samples'
/// visits are held to [`SAMPLE_STREAMS_PER_EVENT`] an event, at the cost of fewer points (and
/// fragmentation read at fewer moments) on such traces; a trace on a few streams keeps them all.
pub fn replay_stride(events: usize, samples: usize, streams: usize) -> usize {
    sample_stride(events, samples).max(streams.div_ceil(SAMPLE_STREAMS_PER_EVENT))
}

/// Replays a prepared trace through a new pool or allocator model on an address-only simulated
/// device, sampling the timeline at up to `options.samples` evenly spaced event indices. The
/// samples are read inside the timed loop, so events per second include their cost. With a
/// capacity, running out of memory ends the replay with `out_of_memory` set. A pool with the
/// `steady` option runs under the planned steps, as the binding makes its pools; the `ahead` row
/// sets its plan at the trace's first step marker (its first allocation, without markers) and ends
/// a step at each marker, as `vrampool.torch.install(plan=)` does at each optimizer step.
pub fn replay_prepared(prepared: &PreparedTrace, target: &ReplayTarget, options: ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let device = Arc::new(SimDevice::new(options.capacity.unwrap_or(REPLAY_CAPACITY), SimMode::AddressOnly));
    let report = match target {
        ReplayTarget::Pool(config) => {
            let pool = Pool::new(device, config.clone()).map_err(|source| ReplayError::Pool { index: 0, source })?;
            if config.steady {
                run(prepared, &mut Steady(&PlannedMode::steady(pool)), options)
            } else {
                run(prepared, &mut &pool, options)
            }
        }
        ReplayTarget::Peer(peer) => run(prepared, &mut peer.build(device, options.capacity), options),
        ReplayTarget::Ahead(config, plan) => {
            let pool = Pool::new(device, config.clone()).map_err(|source| ReplayError::Pool { index: 0, source })?;
            let markers = !prepared.steps.is_empty();
            run(prepared, &mut Ahead { mode: &PlannedMode::steady(pool), plan: plan.clone(), pending: true, markers }, options)
        }
    }?;
    Ok(ReplayReport { strategy: target.name(), approximate: matches!(target, ReplayTarget::Peer(p) if p.approximate()), ..report })
}

/// `options.repeat` copies of the trace run back to back on the same pool or model (a warm one,
/// for events per second) in the memory of one copy: each starts once the one before has freed
/// everything.
fn run<R: Replayed>(prepared: &PreparedTrace, target: &mut R, options: ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let ReplayOptions { samples, repeat, trim_each_pass, capacity } = options;
    let events = usize::try_from(repeat)
        .ok()
        .and_then(|times| prepared.ops.len().checked_mul(times))
        .filter(|_| repeat > 0)
        .ok_or(ReplayError::Repeat { times: repeat, events: prepared.ops.len() })?;
    let stride = replay_stride(events, samples, prepared.streams);
    let mut timeline = Vec::with_capacity(samples.min(events));
    let (mut fragmentation, mut most_allocated) = (0.0, 0u64);
    let mut sample = |target: &R, event: usize| {
        let (allocated_bytes, reserved_bytes, scattered) = target.now();
        if allocated_bytes >= most_allocated {
            (most_allocated, fragmentation) = (allocated_bytes, scattered);
        }
        timeline.push(TimelineSample { event, allocated_bytes, reserved_bytes });
    };
    let mut addrs = vec![0u64; prepared.slots];
    let mut until_sample = stride;
    let mut out_of_memory = None;
    let mut done = events;
    let pass = prepared.ops.len();
    let last_pass = events - pass;
    let (mut first_pass_peak, mut before_last_pass) = (None, (0, 0));
    // The position in the pass and the next step marker.
    let (mut at, mut next_step) = (0, 0);
    // Live buffers, `addr -> end`: in debug builds (every test's replay) no two may share a byte.
    let mut live = BTreeMap::new();
    let start = Instant::now();
    for (index, &(slot, size, stream)) in prepared.ops.iter().cycle().take(events).enumerate() {
        if index == pass {
            first_pass_peak = Some(target.totals().0);
        }
        let mut marked = Ok(());
        if at == pass {
            // The markers at the end of the copy that ends, then the next copy begins.
            marked = markers(target, &prepared.steps, &mut next_step, pass).and_then(|()| target.pass_begins());
            (at, next_step) = (0, 0);
        }
        let marked = marked.and_then(|()| markers(target, &prepared.steps, &mut next_step, at));
        at += 1;
        if trim_each_pass && index > 0 && index % pass == 0 {
            target.trim().map_err(|source| ReplayError::Pool { index, source })?;
        }
        if index == last_pass {
            let (_, _, allocs, frees) = target.totals();
            before_last_pass = (allocs, frees);
        }
        let result = marked.and_then(|()| {
            if size > 0 {
                target.allocate(size, stream).map(|addr| {
                    if cfg!(debug_assertions) {
                        check_disjoint(&mut live, addr, size, index);
                    }
                    addrs[slot as usize] = addr;
                })
            } else {
                if cfg!(debug_assertions) {
                    live.remove(&addrs[slot as usize]);
                }
                target.free(addrs[slot as usize])
            }
        });
        match result {
            Ok(()) => {}
            Err(PoolError::OutOfMemory(report)) => {
                out_of_memory = Some(OutOfMemory { event: index, report });
                done = index;
                break;
            }
            // Past its largest block (128 TiB) the pool refuses a request as an invalid size before it
            // looks at the device. On a device smaller than the request (a replay with a capacity, as
            // fit's), the answer is the one every request past the device gets: out of memory.
            Err(PoolError::InvalidSize { size: requested, .. }) if requested > MAX_REQUEST && capacity.is_some_and(|c| requested > c) => {
                let (allocated, reserved, _) = target.now();
                let report = OomReport {
                    requested,
                    block: 0,
                    allocated,
                    reserved,
                    largest_free: 0,
                    device_free: 0,
                    limit: None,
                    arena: ArenaHeld::default(),
                };
                out_of_memory = Some(OutOfMemory { event: index, report });
                done = index;
                break;
            }
            Err(source) => return Err(ReplayError::Pool { index, source }),
        }
        until_sample -= 1;
        if until_sample == 0 {
            until_sample = stride;
            sample(target, index + 1);
        }
    }
    if samples > 0 && done % stride != 0 {
        sample(target, done);
    }
    let seconds = start.elapsed().as_secs_f64();
    let (peak_reserved_bytes, peak_allocated_bytes, device_allocs, device_frees) = target.totals();
    Ok(ReplayReport {
        strategy: "",
        approximate: false,
        peak_reserved_bytes,
        peak_allocated_bytes,
        lower_bound_bytes: prepared.lower_bound,
        events: done,
        seconds,
        events_per_s: if seconds > 0.0 { done as f64 / seconds } else { 0.0 },
        device_allocs,
        device_frees,
        first_pass_peak_reserved_bytes: first_pass_peak.unwrap_or(peak_reserved_bytes),
        last_pass_device_allocs: device_allocs - before_last_pass.0,
        last_pass_device_frees: device_frees - before_last_pass.1,
        fragmentation,
        timeline,
        out_of_memory,
    })
}

/// Runs the step markers at position `at` of a copy, from the `*next`-th on.
fn markers<R: Replayed>(target: &mut R, steps: &[usize], next: &mut usize, at: usize) -> Result<(), PoolError> {
    while steps.get(*next) == Some(&at) {
        *next += 1;
        target.step()?;
    }
    Ok(())
}

/// Adds `[addr, addr + size)` to the live buffers `live`, panicking where it shares a byte with one.
fn check_disjoint(live: &mut BTreeMap<u64, u64>, addr: u64, size: u64, index: usize) {
    let end = addr.saturating_add(size);
    let below = live.range(..=addr).next_back().filter(|&(_, &e)| e > addr);
    let above = live.range(addr..end).next();
    if let Some((&other, &other_end)) = below.or(above) {
        panic!("event {index}: [{addr:#x}, {end:#x}) shares bytes with the live buffer [{other:#x}, {other_end:#x})");
    }
    live.insert(addr, end);
}

#[cfg(test)]
mod tests;
