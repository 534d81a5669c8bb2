//! Planning ahead at the largest shape (the course notes' rule for shapes that change): a plan made
//! before the first step, from one step at its largest shape, serves that step and every smaller
//! one. A step's i-th allocation takes the plan's i-th offset when it fits there (the same stream,
//! at most the planned size, and none of the bytes in use now); the first of another stream or a
//! larger size ends the plan's part in that step, whose rest goes to the pool. The arena is taken once, when the plan is
//! set: a region per stream, as the steady arena's. An allocation whose bytes are still in use (a
//! buffer of the last step lives on) goes to the pool alone, and the plan serves the next.
//!
//! Serving checks the bytes themselves (the live arena buffers of each region, by offset), not the
//! plan's lifetimes: a smaller step's buffers may live longer or shorter than the plan's, and two
//! live buffers still never share a byte.
//!
//! ```
//! use std::sync::Arc;
//! use vrampool_core::{Pool, PoolConfig, SimDevice, SimMode, StreamId};
//! use vrampool_steady::{AheadBuffer, AheadPlan, PlannedPool};
//!
//! let s0 = StreamId(0);
//! // One step at its largest shape: three buffers (stream, size, live on [lower, upper)).
//! let largest = [AheadBuffer::new(s0, 8 << 20, 0, 2), AheadBuffer::new(s0, 4 << 20, 1, 3), AheadBuffer::new(s0, 8 << 20, 2, 4)];
//! let plan = Arc::new(AheadPlan::plan(&largest, 512, std::time::Duration::from_millis(10))?);
//! assert_eq!(plan.arena_bytes(), 12 << 20);
//! let device = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
//! let planned = PlannedPool::new(Pool::new(device, PoolConfig::default())?);
//! planned.set_ahead(Some(plan))?;
//! // A smaller step, from the very first: each buffer at its planned offset.
//! let a = planned.allocate(6 << 20, s0)?;
//! let b = planned.allocate(3 << 20, s0)?;
//! planned.free(a, None, None)?;
//! let c = planned.allocate(6 << 20, s0)?;
//! planned.free(b, None, None)?;
//! planned.free(c, None, None)?;
//! planned.step(0)?;
//! assert_eq!(planned.stats()?.planned_allocations, 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use vrampool_core::StreamId;
use vrampool_plan::{plan, validate, Algorithm, Buffer, PlanError, PlanOptions};

use crate::peaks::Four;

/// One buffer of the step a plan is made from, in the order of its allocations: its stream, size
/// and lifetime `[lower, upper)` (in any unit of time, the same for every buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AheadBuffer {
    pub stream: StreamId,
    pub size: u64,
    pub lower: u64,
    pub upper: u64,
}

impl AheadBuffer {
    pub fn new(stream: StreamId, size: u64, lower: u64, upper: u64) -> Self {
        AheadBuffer { stream, size, lower, upper }
    }
}

/// A step planned ahead: each buffer's offset in its stream's region, checked by the planner's
/// validator (no two buffers live at once share a byte, every offset aligned).
#[derive(Debug, Clone, PartialEq)]
pub struct AheadPlan {
    pub(crate) buffers: Vec<AheadBuffer>,
    pub(crate) offsets: Vec<u64>,
    pub(crate) alignment: u64,
    /// The plan's streams, in order of first use, and the bytes each one's region needs.
    pub(crate) streams: Vec<StreamId>,
    pub(crate) region_bytes: Vec<u64>,
    pub(crate) lower_bound_bytes: u64,
    /// The leading buffers that serve the first step alone (see [`AheadPlan::with_first_step`]).
    pub(crate) first: usize,
    /// When the steps after the first begin on the plan's timeline, and when it ends: a buffer of
    /// the first step live past the start lives on (the weights, the optimizer's state), and one
    /// of the steps' live from start to end outlives its step (the batch a loop keeps until the
    /// next exists).
    pub(crate) steps_start: u64,
    pub(crate) end: u64,
}

impl AheadPlan {
    /// Plans `buffers` (one step at its largest shape) into a region per stream, at `alignment`,
    /// searching for at most `budget` per region beyond the heuristics.
    pub fn plan(buffers: &[AheadBuffer], alignment: u64, budget: Duration) -> Result<AheadPlan, PlanError> {
        let options = PlanOptions { algorithm: Algorithm::Auto, budget, alignment };
        let mut offsets = vec![0; buffers.len()];
        for stream in streams_of(buffers) {
            let (indices, region) = region_of(buffers, stream);
            for (&i, offset) in indices.iter().zip(plan(&region, &options)?.offsets) {
                offsets[i] = offset;
            }
        }
        AheadPlan::with_offsets(buffers, &offsets, alignment)
    }

    /// A plan at given offsets (read from a file): refused, with the planner's reason, unless every
    /// offset is aligned and no two buffers of a stream live at once share a byte.
    pub fn with_offsets(buffers: &[AheadBuffer], offsets: &[u64], alignment: u64) -> Result<AheadPlan, PlanError> {
        if buffers.len() != offsets.len() {
            return Err(PlanError::OffsetCount { buffers: buffers.len(), offsets: offsets.len() });
        }
        let streams = streams_of(buffers);
        let end = buffers.iter().map(|b| b.upper).max().unwrap_or(0);
        let (mut region_bytes, mut lower_bound_bytes) = (Vec::new(), 0u64);
        for &stream in &streams {
            let (indices, region) = region_of(buffers, stream);
            let placed: Vec<u64> = indices.iter().map(|&i| offsets[i]).collect();
            region_bytes.push(validate(&region, &placed, alignment)?);
            lower_bound_bytes += vrampool_plan::lower_bound(&region);
        }
        Ok(AheadPlan {
            buffers: buffers.to_vec(),
            offsets: offsets.to_vec(),
            alignment,
            streams,
            region_bytes,
            lower_bound_bytes,
            first: 0,
            steps_start: buffers.iter().map(|b| b.lower).min().unwrap_or(0),
            end,
        })
    }

    /// The plan with its first `first` buffers serving the first step after it is set, and the
    /// rest every step after that: a run's first step also makes what lives across steps (the
    /// weights, the optimizer's state), planned with the largest step on one timeline, so that
    /// those bytes sit beside every later step's. Refused unless a buffer is left for the steps.
    pub fn with_first_step(mut self, first: usize) -> Result<AheadPlan, PlanError> {
        if first >= self.buffers.len() {
            return Err(PlanError::FirstStep { first, buffers: self.buffers.len() });
        }
        self.first = first;
        self.steps_start = self.buffers[first..].iter().map(|b| b.lower).min().unwrap_or(0);
        Ok(self)
    }

    /// How many of the leading buffers serve the first step alone (0: every step is served by all).
    pub fn first_step(&self) -> usize {
        self.first
    }

    pub fn buffers(&self) -> &[AheadBuffer] {
        &self.buffers
    }

    /// Each buffer's offset in its stream's region.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The bytes region `region` is taken with: the plan's, and room above them for the largest
    /// buffer a step keeps past its end (the batch a loop keeps until the next exists), whose
    /// planned bytes the last step's holds when its turn comes.
    pub(crate) fn region_room(&self, region: usize) -> u64 {
        let stream = self.streams[region];
        let kept = self.buffers[self.first..].iter().filter(|b| b.stream == stream && self.outlives_step(b)).map(|b| b.size).max();
        let planned = self.region_bytes[region];
        kept.map_or(planned, |size| planned.next_multiple_of(self.alignment).saturating_add(size))
    }

    /// Whether a buffer of the steps' part is planned live for the whole step, as one the step
    /// leaves live is.
    fn outlives_step(&self, buffer: &AheadBuffer) -> bool {
        buffer.lower <= self.steps_start && buffer.upper >= self.end
    }

    /// The bytes of every region together.
    pub fn arena_bytes(&self) -> u64 {
        self.region_bytes.iter().sum()
    }

    /// The most bytes live at once (per stream, summed): no plan needs less.
    pub fn lower_bound_bytes(&self) -> u64 {
        self.lower_bound_bytes
    }
}

fn streams_of(buffers: &[AheadBuffer]) -> Vec<StreamId> {
    let mut streams = Vec::new();
    for b in buffers {
        if !streams.contains(&b.stream) {
            streams.push(b.stream);
        }
    }
    streams
}

/// The buffers of `stream`, as the planner takes them (ids their indices), and their indices.
fn region_of(buffers: &[AheadBuffer], stream: StreamId) -> (Vec<usize>, Vec<Buffer>) {
    buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.stream == stream)
        .map(|(i, b)| (i, Buffer::new(i as u64, b.lower, b.upper, b.size)))
        .unzip()
}

/// A buffer the pool handed out while a plan is set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AheadLive {
    pub(crate) size: u64,
    pub(crate) stream: StreamId,
    /// The step it was born in.
    pub(crate) step: u64,
    /// Its plan stream's index and offset, for an arena buffer.
    pub(crate) arena: Option<(usize, u64)>,
    /// At a place of the first step's that the plan keeps past it: it does not hold its step open.
    pub(crate) kept: bool,
    /// An arena buffer used on another stream, as `Loose::used_elsewhere`.
    pub(crate) used_elsewhere: bool,
}

/// A set plan and what serving it keeps, under the cold path's lock.
pub(crate) struct Ahead {
    pub(crate) plan: Arc<AheadPlan>,
    /// Per plan stream: its region's base.
    pub(crate) bases: Vec<u64>,
    /// Per plan stream: its live arena buffers' bytes, `offset -> end`.
    pub(crate) taken: Vec<BTreeMap<u64, u64>>,
    /// The buffers handed out while the plan is set and still live, by address.
    pub(crate) live: HashMap<u64, AheadLive, FixedState>,
    /// The step (a count) and its next allocation's index; `serving` false once one did not fit.
    pub(crate) step: u64,
    pub(crate) next: usize,
    pub(crate) serving: bool,
    /// Buffers of this step still live, and those of them the plan keeps past the first step:
    /// once they are all that live (with automatic boundaries), the step ends.
    pub(crate) step_live: usize,
    pub(crate) step_kept: usize,
    /// The live arena buffers, as `peaks::Four` counts them.
    pub(crate) arena_live: Four,
}

/// Where the plan puts a step's next allocation.
pub(crate) enum Place {
    /// There: its region and offset.
    At(usize, u64),
    /// Its bytes are still in use (a buffer of the last step lives on, say): this one goes to the
    /// region's bytes above the plan's if it fits there, else to the pool, and the plan serves the next.
    Busy(usize),
    /// Another stream, a larger size, or past the plan's end: the step is not the plan's from here.
    Misfit,
}

impl Ahead {
    /// Counts an arena buffer of `size` bytes in (`born`) or out of `arena_live`.
    pub(crate) fn count_live(&mut self, size: u64, alignment: u64, born: bool) {
        let block = size.next_multiple_of(alignment.max(1));
        for (live, n) in self.arena_live.iter_mut().zip([block, size, block, 1]) {
            *live = if born { *live + n } else { *live - n };
        }
    }

    /// The plan's buffers that serve this step: the first step's, or the steps' after it.
    fn part(&self) -> std::ops::Range<usize> {
        let plan = &self.plan;
        if self.step == 0 && plan.first > 0 {
            0..plan.first
        } else {
            plan.first..plan.buffers.len()
        }
    }

    /// Whether the plan's buffer of this step's next allocation outlives its step: one of the
    /// first step's that lives on past it, or one planned live for the whole step.
    pub(crate) fn next_kept(&self) -> bool {
        let at = self.part().start + self.next;
        let planned = &self.plan.buffers[at];
        if at < self.plan.first {
            planned.upper > self.plan.steps_start
        } else {
            self.plan.outlives_step(planned)
        }
    }

    /// Whether the step is over, with automatic boundaries: everything it allocated is freed, or
    /// its part of the plan is used up (or left) and only what outlives the step is live.
    pub(crate) fn step_over(&self) -> bool {
        let first_step = self.step == 0 && self.plan.first > 0;
        let used_up = !self.serving || self.next >= self.part().len();
        (self.step_live == 0 && !first_step) || (self.step_live == self.step_kept && used_up)
    }

    /// Where the plan puts this step's next allocation, and whether it fits there now.
    pub(crate) fn place(&self, size: u64, stream: StreamId) -> Place {
        let plan = &self.plan;
        let part = self.part();
        let at = part.start + self.next;
        let Some(planned) = plan.buffers[part].get(self.next).filter(|b| b.stream == stream && size <= b.size) else {
            return Place::Misfit;
        };
        let region = plan.streams.iter().position(|&s| s == planned.stream).expect("a plan's stream has a region");
        let (offset, end) = (plan.offsets[at], plan.offsets[at] + size);
        let taken = &self.taken[region];
        let below = taken.range(..offset).next_back().is_some_and(|(_, &e)| e > offset);
        let above = taken.range(offset..end).next().is_some();
        if below || above {
            return Place::Busy(region);
        }
        Place::At(region, offset)
    }

    /// A place for `size` bytes in `region`'s bytes above the plan's (`region_end`: the region's
    /// size, rounded up past the plan's), where no planned buffer goes: the first that is free.
    pub(crate) fn above_plan(&self, region: usize, size: u64, region_end: u64) -> Option<u64> {
        let align = |at: u64| at.checked_next_multiple_of(self.plan.alignment);
        let mut at = align(self.plan.region_bytes[region])?;
        for (&offset, &end) in self.taken[region].range(at..) {
            if offset >= at.checked_add(size)? {
                break;
            }
            at = align(end)?;
        }
        (at.checked_add(size)? <= region_end).then_some(at)
    }
}
