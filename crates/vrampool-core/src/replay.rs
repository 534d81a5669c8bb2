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
//! use vrampool_core::replay::{events_from_buffers, replay, TraceBuffer};
//! use vrampool_core::PoolConfig;
//!
//! let buffers = [TraceBuffer::new(0, 0, 2, 1 << 20), TraceBuffer::new(1, 1, 3, 1 << 20), TraceBuffer::new(2, 2, 4, 1 << 20)];
//! let events = events_from_buffers(&buffers).unwrap();
//! let report = replay(&events, PoolConfig::default()).unwrap();
//! assert_eq!(report.lower_bound_bytes, 2 << 20);
//! assert!(report.peak_reserved_bytes >= report.lower_bound_bytes);
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;

use crate::device::{SimDevice, SimMode, StreamId};
use crate::error::{OomReport, PoolError};
use crate::peers::{PeerConfig, PeerModel};
use crate::strategy::StrategyKind;
use crate::{Pool, PoolConfig, PoolCore};

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

/// What a replay runs: the pool with a configuration, or a model of another allocator.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayTarget {
    Pool(PoolConfig),
    Peer(PeerConfig),
}

impl ReplayTarget {
    /// The pool's strategy name, or the model's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pool(config) => config.strategy.name(),
            Self::Peer(peer) => peer.name(),
        }
    }
}

/// How a replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Timeline points to sample (none for 0).
    pub samples: usize,
    /// The simulated device's memory; None for [`REPLAY_CAPACITY`], which no trace fills.
    pub capacity: Option<u64>,
    /// Copies of the trace replayed back to back (at least 1).
    pub repeat: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self { samples: DEFAULT_SAMPLES, capacity: None, repeat: 1 }
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

/// A trace checked and lowered for the replay loop (ids mapped to dense slots), so that several
/// configurations can replay it without checking it again.
pub struct PreparedTrace {
    /// `(slot, size, stream)`; a size of 0 is a free.
    ops: Vec<(u32, u64, u64)>,
    slots: usize,
    lower_bound: u64,
}

impl PreparedTrace {
    /// Checks `events`: a free of an id that is not live, an id allocated twice and a zero-byte
    /// allocation are errors.
    pub fn new(events: &[TraceEvent]) -> Result<Self, ReplayError> {
        let mut live: HashMap<u64, (u32, u64)> = HashMap::new();
        let mut spare: Vec<u32> = Vec::new();
        let mut slots = 0u32;
        let (mut now, mut lower_bound) = (0u64, 0u64);
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
                    now += size;
                    lower_bound = lower_bound.max(now);
                    ops.push((slot, size, stream));
                }
                TraceEvent::Free { id } => {
                    let (slot, size) = live.remove(&id).ok_or(ReplayError::UnknownId { index, id })?;
                    now -= size;
                    spare.push(slot);
                    ops.push((slot, 0, 0));
                }
            }
        }
        Ok(Self { ops, slots: slots as usize, lower_bound })
    }

    /// Allocations and frees.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The most requested bytes live at once.
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
}

impl Replayed for Pool {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        let core: &PoolCore = self;
        core.allocate(size, StreamId(stream))
    }

    fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        let core: &PoolCore = self;
        core.free(addr, None, None)
    }

    fn now(&self) -> (u64, u64, f64) {
        let stats = self.stats();
        (stats.allocated_bytes.current, stats.reserved_bytes.current, stats.fragmentation())
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        let stats = self.stats();
        (stats.reserved_bytes.peak, stats.allocated_bytes.peak, stats.num_device_alloc, stats.num_device_free)
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

/// Replays a prepared trace through a new pool or allocator model on an address-only simulated
/// device, sampling the timeline at up to `options.samples` evenly spaced event indices. The
/// samples are read inside the timed loop, so events per second include their cost. With a
/// capacity, running out of memory ends the replay with `out_of_memory` set.
pub fn replay_prepared(prepared: &PreparedTrace, target: &ReplayTarget, options: ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let capacity = options.capacity.unwrap_or(REPLAY_CAPACITY);
    let device = Arc::new(SimDevice::new(capacity, SimMode::AddressOnly));
    let report = match target {
        ReplayTarget::Pool(config) => {
            let mut pool = Pool::new(device, config.clone()).map_err(|source| ReplayError::Pool { index: 0, source })?;
            run(prepared, &mut pool, options)
        }
        ReplayTarget::Peer(peer) => run(prepared, &mut peer.build(device, options.capacity), options),
    }?;
    Ok(ReplayReport { strategy: target.name(), approximate: matches!(target, ReplayTarget::Peer(p) if p.approximate()), ..report })
}

/// `options.repeat` copies of the trace run back to back on the same pool or model (a warm one,
/// for events per second) in the memory of one copy: each starts once the one before has freed
/// everything.
fn run<R: Replayed>(prepared: &PreparedTrace, target: &mut R, options: ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let ReplayOptions { samples, repeat, .. } = options;
    let events = usize::try_from(repeat)
        .ok()
        .and_then(|times| prepared.ops.len().checked_mul(times))
        .filter(|_| repeat > 0)
        .ok_or(ReplayError::Repeat { times: repeat, events: prepared.ops.len() })?;
    let stride = sample_stride(events, samples);
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
    let start = Instant::now();
    for (index, &(slot, size, stream)) in prepared.ops.iter().cycle().take(events).enumerate() {
        let result = if size > 0 {
            target.allocate(size, stream).map(|addr| addrs[slot as usize] = addr)
        } else {
            target.free(addrs[slot as usize])
        };
        match result {
            Ok(()) => {}
            Err(PoolError::OutOfMemory(report)) => {
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
        fragmentation,
        timeline,
        out_of_memory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes::MIB;

    fn config(strategy: StrategyKind) -> PoolConfig {
        PoolConfig { strategy, ..PoolConfig::default() }
    }

    #[test]
    fn replay_frees_before_allocs_at_the_same_time() {
        // 0 and 1 overlap on [1, 2); 2 starts when 0 ends, so at most two are live at once.
        let buffers = [TraceBuffer::new(0, 0, 2, 4 * MIB), TraceBuffer::new(1, 1, 3, 2 * MIB), TraceBuffer::new(2, 2, 4, 4 * MIB)];
        let events = events_from_buffers(&buffers).unwrap();
        assert_eq!(
            events,
            vec![
                TraceEvent::Alloc { id: 0, size: 4 * MIB, stream: 0 },
                TraceEvent::Alloc { id: 1, size: 2 * MIB, stream: 0 },
                TraceEvent::Free { id: 0 },
                TraceEvent::Alloc { id: 2, size: 4 * MIB, stream: 0 },
                TraceEvent::Free { id: 1 },
                TraceEvent::Free { id: 2 },
            ]
        );
    }

    #[test]
    fn replay_hand_made_trace_has_known_peaks() {
        // Peak live: 4 + 2 MiB at time 1 and 2 + 4 MiB at time 2: 6 MiB.
        let buffers = [TraceBuffer::new(0, 0, 2, 4 * MIB), TraceBuffer::new(1, 1, 3, 2 * MIB), TraceBuffer::new(2, 2, 4, 4 * MIB)];
        let events = events_from_buffers(&buffers).unwrap();
        for strategy in ALL_STRATEGIES {
            let started = Instant::now();
            let report = replay(&events, config(strategy)).unwrap();
            let wall = started.elapsed().as_secs_f64();
            assert_eq!(report.strategy, strategy.name());
            assert_eq!(report.events, 6);
            assert_eq!(report.lower_bound_bytes, 6 * MIB, "{strategy:?}");
            // Sizes are multiples of every alignment, so no strategy pads them... except the
            // buddy, which rounds to powers of two: 4 + 2 and 2 + 4 MiB stay exact there too.
            assert_eq!(report.peak_allocated_bytes, 6 * MIB, "{strategy:?}");
            assert!(report.peak_reserved_bytes >= report.lower_bound_bytes, "{report:?}");
            assert!(report.device_allocs >= 1);
            // The loop's time lies within the call's; events per second are events over it.
            assert!(report.seconds > 0.0 && report.seconds <= wall, "{} s of {wall} s", report.seconds);
            assert!((report.events_per_s * report.seconds - 6.0).abs() < 1e-6, "{report:?}");
            assert!(report.events_per_s >= 6.0 / wall);
        }
    }

    #[test]
    fn replay_csv_reads_streams_and_names_bad_lines() {
        let text = "id,lower,upper,size,stream\n0,0,2,4096,0\n\n1,1,3,8192,1\n";
        let buffers = read_trace_csv(text).unwrap();
        assert_eq!(buffers, vec![TraceBuffer::new(0, 0, 2, 4096), TraceBuffer { stream: 1, ..TraceBuffer::new(1, 1, 3, 8192) }]);
        let report = replay(&events_from_buffers(&buffers).unwrap(), PoolConfig::default()).unwrap();
        assert_eq!(report.lower_bound_bytes, 4096 + 8192);

        // Reordered columns are fine; a solved plan's offset column is ignored.
        let reordered = read_trace_csv("size,id,upper,lower,offset\n100,7,5,1,0\n").unwrap();
        assert_eq!(reordered, vec![TraceBuffer::new(7, 1, 5, 100)]);

        for (text, line) in [
            ("", 1),
            ("id,lower,size\n", 1),
            ("id,lower,upper,size,colour\n", 1),
            ("id,lower,upper,size\n0,0,2,10\n1,0,x,10\n", 3),
            ("id,lower,upper,size\n0,0,2,-10\n", 2),
            ("id,lower,upper,size\n0,0,2,10\n0,1,3,10\n", 3),
            ("id,lower,upper,size\n0,2,2,10\n", 2),
            ("id,lower,upper,size\n0,0,2,0\n", 2),
            ("id,lower,upper,size\n0,0,2\n", 2),
        ] {
            match read_trace_csv(text) {
                Err(ReplayError::Parse { line: got, message }) => assert_eq!(got, line, "{text:?}: {message}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn replay_bad_trace_is_an_error_not_a_panic() {
        let free_unknown = [TraceEvent::Alloc { id: 1, size: 512, stream: 0 }, TraceEvent::Free { id: 2 }];
        assert!(matches!(replay(&free_unknown, PoolConfig::default()), Err(ReplayError::UnknownId { index: 1, id: 2 })));
        let double_free = [TraceEvent::Alloc { id: 1, size: 512, stream: 0 }, TraceEvent::Free { id: 1 }, TraceEvent::Free { id: 1 }];
        assert!(matches!(replay(&double_free, PoolConfig::default()), Err(ReplayError::UnknownId { index: 2, id: 1 })));
        let twice = [TraceEvent::Alloc { id: 1, size: 512, stream: 0 }, TraceEvent::Alloc { id: 1, size: 512, stream: 0 }];
        assert!(matches!(replay(&twice, PoolConfig::default()), Err(ReplayError::DuplicateId { index: 1, id: 1 })));
        let zero = [TraceEvent::Alloc { id: 1, size: 0, stream: 0 }];
        assert!(matches!(replay(&zero, PoolConfig::default()), Err(ReplayError::ZeroSize { index: 0, id: 1 })));
        let err = events_from_buffers(&[TraceBuffer::new(3, 5, 5, 10)]).unwrap_err();
        assert!(matches!(err, ReplayError::BadBuffer { id: 3, .. }), "{err}");
        // An id may live again once freed (traces keyed by address do this).
        let reused = [
            TraceEvent::Alloc { id: 1, size: 512, stream: 0 },
            TraceEvent::Free { id: 1 },
            TraceEvent::Alloc { id: 1, size: 1024, stream: 0 },
            TraceEvent::Free { id: 1 },
        ];
        assert_eq!(replay(&reused, PoolConfig::default()).unwrap().lower_bound_bytes, 1024);
    }

    #[test]
    fn replay_counts_the_segments_given_back() {
        // 100 MiB freed, then 200 MiB: the pool gives the idle segment back before it grows past
        // its peak; PyTorch's caching allocator keeps it.
        let events = [
            TraceEvent::Alloc { id: 1, size: 100 * MIB, stream: 0 },
            TraceEvent::Free { id: 1 },
            TraceEvent::Alloc { id: 2, size: 200 * MIB, stream: 0 },
            TraceEvent::Free { id: 2 },
        ];
        let prepared = PreparedTrace::new(&events).unwrap();
        let options = ReplayOptions { samples: 0, capacity: None, repeat: 1 };
        let pool =
            replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig { expandable: false, ..PoolConfig::default() }), options).unwrap();
        assert_eq!((pool.device_allocs, pool.device_frees, pool.peak_reserved_bytes), (2, 1, 200 * MIB));
        let torch = replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), options).unwrap();
        assert_eq!((torch.device_allocs, torch.device_frees, torch.peak_reserved_bytes), (2, 0, 300 * MIB));
    }

    #[test]
    fn replay_timeline_is_evenly_spaced_and_ends_at_the_end() {
        // 1000 buffers of 1 MiB, at most two live: 2000 events.
        let buffers: Vec<_> = (0..1000).map(|i| TraceBuffer::new(i, i, i + 2, MIB)).collect();
        let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
        assert_eq!((prepared.len(), prepared.lower_bound_bytes()), (2000, 2 * MIB));
        for (samples, expected) in [(0, 0), (1, 1), (7, 7), (1000, 1000), (3000, 2000)] {
            let report = replay_prepared(
                &prepared,
                &ReplayTarget::Pool(config(StrategyKind::BestFit)),
                ReplayOptions { samples, capacity: None, repeat: 1 },
            )
            .unwrap();
            let points: Vec<usize> = report.timeline.iter().map(|p| p.event).collect();
            assert_eq!(points.len(), expected, "{samples} samples");
            if let (Some(&first), Some(&last)) = (points.first(), points.last()) {
                assert_eq!(last, 2000, "{samples} samples");
                let stride = 2000usize.div_ceil(samples);
                assert_eq!(first, stride.min(2000));
                assert!(points.windows(2).all(|w| w[1] - w[0] == stride || w[1] == 2000), "{points:?}");
            }
            for p in &report.timeline {
                assert!(p.allocated_bytes <= 2 * MIB && p.reserved_bytes >= p.allocated_bytes, "{p:?}");
            }
        }
        // Mid-trace one or two buffers are live; at the end none is.
        let report = replay_prepared(
            &prepared,
            &ReplayTarget::Pool(config(StrategyKind::BestFit)),
            ReplayOptions { samples: 10, capacity: None, repeat: 1 },
        )
        .unwrap();
        assert!(report.timeline[..9].iter().all(|p| p.allocated_bytes >= MIB), "{:?}", report.timeline);
        assert_eq!(report.timeline[9].allocated_bytes, 0);
        assert!((0.0..=1.0).contains(&report.fragmentation));
    }

    #[test]
    fn replay_runs_the_allocator_models_beside_the_pool() {
        // A 1.5 MiB request: PyTorch reserves a 20 MiB segment, the pool a 2 MiB chunk.
        let events = events_from_buffers(&[TraceBuffer::new(0, 0, 1, 3 * MIB / 2)]).unwrap();
        let prepared = PreparedTrace::new(&events).unwrap();
        let torch = replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), ReplayOptions::default()).unwrap();
        assert_eq!((torch.strategy, torch.peak_reserved_bytes, torch.device_allocs, torch.approximate), ("torch", 20 * MIB, 1, false));
        let default = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), ReplayOptions::default()).unwrap();
        assert_eq!(default.peak_reserved_bytes, 2 * MIB);
        let driver =
            replay_prepared(&prepared, &ReplayTarget::Peer(PeerConfig::named("async").unwrap()), ReplayOptions::default()).unwrap();
        assert!(driver.approximate);
    }

    #[test]
    fn a_capacity_limited_replay_stops_at_the_first_out_of_memory() {
        // 30 MiB live, then 40 MiB: with 60 MiB of device memory the plain torch model fits both
        // (its cached 30 MiB segment goes back and it retries); 90 MiB live at once fits nobody.
        let buffers = [TraceBuffer::new(0, 0, 1, 30 * MIB), TraceBuffer::new(1, 1, 3, 40 * MIB), TraceBuffer::new(2, 2, 3, 50 * MIB)];
        let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
        let options = ReplayOptions { samples: 10, capacity: Some(60 * MIB), repeat: 1 };
        for target in [ReplayTarget::Peer(PeerConfig::named("torch").unwrap()), ReplayTarget::Pool(PoolConfig::default())] {
            let report = replay_prepared(&prepared, &target, options).unwrap();
            let oom = report.out_of_memory.unwrap_or_else(|| panic!("{}: {report:?}", target.name()));
            assert_eq!((oom.event, report.events), (3, 3), "{}: the third allocation fails", target.name());
            assert_eq!(oom.report.requested, 50 * MIB);
            assert!(report.peak_reserved_bytes <= 60 * MIB);
            assert_eq!(report.timeline.last().unwrap().event, 3);
        }
        let roomy = ReplayOptions { samples: 10, capacity: Some(100 * MIB), repeat: 1 };
        assert!(replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), roomy).unwrap().out_of_memory.is_none());
    }

    #[test]
    fn large_tensors_cost_the_default_pool_at_most_a_page_each() {
        // Logits-like pairs (output and gradient) of a sequence length that changes every step.
        let mut buffers = Vec::new();
        for (step, mib) in [120u64, 80, 160, 100, 140, 90].into_iter().enumerate() {
            let (t, size, id) = (step as u64 * 10, mib * MIB + 4096 * step as u64 + 1, step as u64 * 2);
            buffers.push(TraceBuffer::new(id, t, t + 3, size));
            buffers.push(TraceBuffer::new(id + 1, t + 1, t + 4, size));
        }
        let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
        let bound = prepared.lower_bound_bytes();
        let default = replay_prepared(&prepared, &ReplayTarget::Pool(PoolConfig::default()), ReplayOptions::default()).unwrap();
        assert!(default.peak_allocated_bytes <= bound + 2 * 2 * MIB, "{default:?}");
        assert!(default.peak_reserved_bytes <= bound + 2 * 2 * MIB, "{default:?}");
        // A plain buddy rounds each to a power of two: 160 MiB + a bit takes 256 MiB.
        let buddy = replay_prepared(&prepared, &ReplayTarget::Pool(config(StrategyKind::Buddy)), ReplayOptions::default()).unwrap();
        assert!(buddy.peak_allocated_bytes >= 2 * 256 * MIB, "{buddy:?}");
    }

    fn shared_traces() -> Vec<(String, Vec<TraceEvent>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/static");
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut paths: Vec<_> =
            entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "csv")).collect();
        paths.sort();
        paths
            .into_iter()
            .map(|path| {
                let text = std::fs::read_to_string(&path).unwrap();
                let buffers = read_trace_csv(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                (path.file_name().unwrap().to_string_lossy().into_owned(), events_from_buffers(&buffers).unwrap())
            })
            .collect()
    }

    #[vrampool_shared_traces::needs_shared_traces]
    #[test]
    fn replay_shared_instances_with_every_strategy() {
        for (name, events) in shared_traces() {
            for report in replay_all(&events, &PoolConfig::default()).unwrap() {
                assert_eq!(report.events, events.len());
                assert!(report.lower_bound_bytes > 0);
                assert!(report.peak_reserved_bytes >= report.lower_bound_bytes, "{name}: {report:?}");
                assert!(report.peak_reserved_bytes >= report.peak_allocated_bytes, "{name}: {report:?}");
                eprintln!(
                    "{name:<32} {:<8} reserved/bound {:.3}  {:>12.0} events/s",
                    report.strategy,
                    report.peak_reserved_bytes as f64 / report.lower_bound_bytes as f64,
                    report.events_per_s
                );
            }
        }
    }

    /// `cargo test --release -p vrampool-core replay_throughput -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement: run in release"]
    fn replay_throughput() {
        let (_, events) = shared_traces().into_iter().find(|(n, _)| n == "somas-resnet50.csv").expect("somas-resnet50.csv");
        // Repeat the trace so the loop runs long enough to time.
        let mut long = Vec::new();
        for round in 0..500u64 {
            long.extend(events.iter().map(|e| match *e {
                TraceEvent::Alloc { id, size, stream } => TraceEvent::Alloc { id: id + round * 1_000_000, size, stream },
                TraceEvent::Free { id } => TraceEvent::Free { id: id + round * 1_000_000 },
            }));
        }
        let prepared = PreparedTrace::new(&long).unwrap();
        for strategy in ALL_STRATEGIES {
            // With the plots' timeline and without: the sampling's cost shows as the difference.
            let best = |samples| {
                (0..3)
                    .map(|_| {
                        replay_prepared(
                            &prepared,
                            &ReplayTarget::Pool(config(strategy)),
                            ReplayOptions { samples, capacity: None, repeat: 1 },
                        )
                        .unwrap()
                        .events_per_s
                    })
                    .fold(0.0, f64::max)
            };
            let (sampled, bare) = (best(DEFAULT_SAMPLES), best(0));
            eprintln!(
                "{:<8} {:>6.2} M events/s with {DEFAULT_SAMPLES} samples, {:>6.2} M without, over {} events",
                strategy.name(),
                sampled / 1e6,
                bare / 1e6,
                long.len()
            );
        }
    }

    #[test]
    fn a_repeated_replay_counts_every_copy_in_the_memory_of_one() {
        let buffers = [TraceBuffer::new(1, 0, 2, MIB), TraceBuffer::new(2, 1, 3, 3 * MIB)];
        let prepared = PreparedTrace::new(&events_from_buffers(&buffers).unwrap()).unwrap();
        let target = ReplayTarget::Pool(config(StrategyKind::Hybrid));
        let times = |repeat| replay_prepared(&prepared, &target, ReplayOptions { samples: 10, capacity: None, repeat });
        let (once, thrice) = (times(1).unwrap(), times(3).unwrap());
        assert_eq!(thrice.events, 3 * once.events);
        assert_eq!((thrice.peak_reserved_bytes, thrice.lower_bound_bytes), (once.peak_reserved_bytes, once.lower_bound_bytes));
        assert_eq!(thrice.timeline.last().unwrap().allocated_bytes, 0, "every copy frees what it allocated");
        assert!(matches!(times(u64::MAX), Err(ReplayError::Repeat { .. })));
        assert!(matches!(times(0), Err(ReplayError::Repeat { .. })));
    }

    #[test]
    fn a_csv_error_quotes_at_most_a_hundred_bytes_of_its_input() {
        let field = "9".repeat(1 << 20) + "x";
        for text in [
            format!("id,lower,upper,size\n1,0,1,{field}\n"),
            format!("id,lower,upper,{field}\n"),
            "id,lower,upper\u{e9},size\n".to_string(),
        ] {
            let message = read_trace_csv(&text).unwrap_err().to_string();
            assert!(message.len() < 250, "{} bytes: {}", message.len(), &message[..250.min(message.len())]);
        }
    }
}
