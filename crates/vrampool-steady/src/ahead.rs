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
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use vrampool_core::{MemoryResource, PieceEvent, PoolError, StreamId};
use vrampool_plan::{plan, validate, Algorithm, Buffer, PlanError, PlanOptions};

use crate::cold::{not_allocated, wrong_size, Cold, Loose};
use crate::pool::PlannedPool;
use crate::serving::{Phase, Word};

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
    buffers: Vec<AheadBuffer>,
    offsets: Vec<u64>,
    alignment: u64,
    /// The plan's streams, in order of first use, and the bytes each one's region needs.
    streams: Vec<StreamId>,
    region_bytes: Vec<u64>,
    lower_bound_bytes: u64,
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
        let (mut region_bytes, mut lower_bound_bytes) = (Vec::new(), 0u64);
        for &stream in &streams {
            let (indices, region) = region_of(buffers, stream);
            let placed: Vec<u64> = indices.iter().map(|&i| offsets[i]).collect();
            region_bytes.push(validate(&region, &placed, alignment)?);
            lower_bound_bytes += vrampool_plan::lower_bound(&region);
        }
        Ok(AheadPlan { buffers: buffers.to_vec(), offsets: offsets.to_vec(), alignment, streams, region_bytes, lower_bound_bytes })
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
struct AheadLive {
    size: u64,
    stream: StreamId,
    /// The step it was born in.
    step: u64,
    /// Its plan stream's index and offset, for an arena buffer.
    arena: Option<(usize, u64)>,
}

/// A set plan and what serving it keeps, under the cold path's lock.
pub(crate) struct Ahead {
    plan: Arc<AheadPlan>,
    /// Per plan stream: its region's base.
    bases: Vec<u64>,
    /// Per plan stream: its live arena buffers' bytes, `offset -> end`.
    taken: Vec<BTreeMap<u64, u64>>,
    /// The buffers handed out while the plan is set and still live, by address.
    live: HashMap<u64, AheadLive, FixedState>,
    /// The step (a count) and its next allocation's index; `serving` false once one did not fit.
    step: u64,
    next: usize,
    serving: bool,
    /// Buffers of this step still live: at 0 (with automatic boundaries) the step ends.
    step_live: usize,
}

/// Where the plan puts a step's next allocation.
enum Place {
    /// There: its region and offset.
    At(usize, u64),
    /// Its bytes are still in use (a buffer of the last step lives on, say): this one goes to the pool,
    /// and the plan serves the next.
    Busy,
    /// Another stream, a larger size, or past the plan's end: the step is not the plan's from here.
    Misfit,
}

impl Ahead {
    /// Where the plan puts this step's next allocation, and whether it fits there now.
    fn place(&self, size: u64, stream: StreamId) -> Place {
        let plan = &self.plan;
        let Some(planned) = plan.buffers.get(self.next).filter(|b| b.stream == stream && size <= b.size) else {
            return Place::Misfit;
        };
        let region = plan.streams.iter().position(|&s| s == planned.stream).expect("a plan's stream has a region");
        let (offset, end) = (plan.offsets[self.next], plan.offsets[self.next] + size);
        let taken = &self.taken[region];
        let below = taken.range(..offset).next_back().is_some_and(|(_, &e)| e > offset);
        let above = taken.range(offset..end).next().is_some();
        if below || above {
            return Place::Busy;
        }
        Place::At(region, offset)
    }
}

impl<B: MemoryResource> PlannedPool<B> {
    /// Serves every step from now on by `plan` (None: back to the steady arena): its regions are
    /// taken now, one per stream, as one block of the pool each. Refused while arena buffers of the
    /// steady arena live (their bytes would be taken twice), and when the pool has no memory for the
    /// regions (then nothing changes).
    pub fn set_ahead(&self, plan: Option<Arc<AheadPlan>>) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        if let Some(plan) = &plan {
            let alignment = self.backing.alignment();
            if plan.alignment % alignment != 0 {
                return Err(PoolError::InvalidConfig(format!(
                    "a plan ahead aligned to {} bytes, where the pool hands out blocks aligned to {alignment}",
                    plan.alignment
                )));
            }
            // Nothing of the arena may be live: its bytes would be taken twice.
            let word = self.word.load(Acquire);
            let serving = cold.serving.as_ref().filter(|_| Word::phase(word) == Phase::Serving);
            let steady_live = serving.is_some_and(|s| !self.live_in_epoch(s, word, &cold.early).is_empty());
            let ahead_live = cold.ahead.as_ref().is_some_and(|a| a.live.values().any(|l| l.arena.is_some()));
            if steady_live || ahead_live || !cold.loose.is_empty() {
                return Err(PoolError::InvalidConfig("a plan ahead is set between steps: buffers of the arena are still live".into()));
            }
        }
        self.leave_now(cold, false);
        if let Some(ahead) = cold.ahead.take() {
            // Its live arena buffers stay, as loose ones, until freed.
            for (&addr, live) in ahead.live.iter().filter(|(_, l)| l.arena.is_some()) {
                cold.loose.insert(addr, Loose { size: live.size, stream: live.stream });
            }
        }
        let Some(plan) = plan else {
            if self.word.load(Acquire) == Word::AHEAD {
                self.word.store(Word::COLD, Release);
            }
            return Ok(());
        };
        self.release_idle_regions(cold);
        let mut bases = Vec::with_capacity(plan.streams.len());
        for (&stream, &bytes) in plan.streams.iter().zip(&plan.region_bytes) {
            let region = if bytes == 0 { Ok(None) } else { cold.regions.ensure(&self.backing, stream, bytes, bytes).map(Some) };
            match region {
                Ok(at) => bases.push(at.map_or(0, |at| cold.regions.list[at].base)),
                Err(e) => {
                    let _ = cold.regions.release_all(&self.backing);
                    self.publish_bounds(cold);
                    return Err(e);
                }
            }
        }
        self.publish_bounds(cold);
        let taken = vec![BTreeMap::new(); plan.streams.len()];
        cold.ahead = Some(Ahead { plan, bases, taken, live: HashMap::default(), step: 0, next: 0, serving: true, step_live: 0 });
        self.word.store(Word::AHEAD, Release);
        Ok(())
    }

    /// An allocation while a plan is set: at the plan's offset if it fits, else from the pool.
    pub(crate) fn allocate_ahead(&self, cold: &mut Cold, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        let ahead = cold.ahead.as_mut().expect("a plan is set");
        let mut placed = if ahead.serving { ahead.place(size, stream) } else { Place::Misfit };
        if let Place::At(region, offset) = placed {
            let addr = ahead.bases[region] + offset;
            if cold.regions.find(addr).is_some_and(|at| cold.regions.list[at].retired) {
                placed = Place::Busy;
            }
        }
        let (addr, arena) = match placed {
            Place::At(region, offset) => {
                let addr = ahead.bases[region] + offset;
                if self.watched {
                    self.backing.piece(addr, size, stream, PieceEvent::Allocated)?;
                }
                ahead.taken[region].insert(offset, offset + size);
                cold.figures.planned_allocations += 1;
                cold.figures.planned_bytes += size;
                (addr, Some((region, offset)))
            }
            Place::Busy | Place::Misfit => {
                let addr = self.backing.allocate(size, stream)?;
                if ahead.serving && matches!(placed, Place::Misfit) {
                    ahead.serving = false;
                    cold.figures.fallbacks += 1;
                }
                cold.figures.dynamic_allocations += 1;
                (addr, None)
            }
        };
        if arena.is_some() && self.watched {
            cold.births.insert(addr, self.now_ns());
        }
        ahead.next += 1;
        ahead.step_live += 1;
        ahead.live.insert(addr, AheadLive { size, stream, step: ahead.step, arena });
        Ok(addr)
    }

    /// A free while a plan is set: an arena buffer's bytes are free again; any other goes to the pool.
    pub(crate) fn free_ahead(&self, cold: &mut Cold, addr: u64, size: Option<u64>, on: Option<StreamId>) -> Result<(), PoolError> {
        let ahead = cold.ahead.as_mut().expect("a plan is set");
        match ahead.live.get(&addr).copied() {
            Some(live) => {
                if let Some(given) = size.filter(|&s| s != live.size) {
                    return Err(wrong_size(addr, live.size, given));
                }
                match live.arena {
                    Some((region, offset)) => {
                        let in_use = on.is_some_and(|s| s != live.stream);
                        if let (true, Some(at)) = (in_use, cold.regions.find(addr)) {
                            // Its bytes may be in use there still: the region is not served from again.
                            cold.regions.list[at].used_on(on.expect("named"));
                        }
                        let retired = cold.regions.find(addr).is_some_and(|at| cold.regions.list[at].retired);
                        if self.watched {
                            cold.births.remove(&addr);
                            let event = if retired { PieceEvent::FreedInUse } else { PieceEvent::Freed };
                            let _ = self.backing.piece(addr, live.size, live.stream, event);
                        }
                        ahead.taken[region].remove(&offset);
                    }
                    None => self.backing.free(addr, size, on)?,
                }
                ahead.live.remove(&addr);
                if live.step == ahead.step {
                    ahead.step_live -= 1;
                    if self.auto_steps && ahead.step_live == 0 {
                        self.end_ahead_step(cold);
                    }
                }
                Ok(())
            }
            None if cold.loose.contains_key(&addr) => {
                let loose = cold.loose[&addr];
                self.free_loose(cold, addr, loose, size, on)
            }
            None if cold.regions.find(addr).is_some() => Err(not_allocated(addr)),
            None => self.backing.free(addr, size, on),
        }
    }

    /// `record_stream` while a plan is set: an arena buffer used on another stream retires its region
    /// (its bytes may be in use there after its free); a pool buffer is the pool's.
    pub(crate) fn record_stream_ahead(&self, cold: &mut Cold, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        let ahead = cold.ahead.as_ref().expect("a plan is set");
        match ahead.live.get(&addr) {
            Some(live) if live.arena.is_some() => {
                if let Some(at) = cold.regions.find(addr) {
                    cold.regions.list[at].used_on(stream);
                }
                Ok(())
            }
            Some(_) => self.backing.record_stream(addr, stream),
            None if cold.regions.find(addr).is_some() && !cold.loose.contains_key(&addr) => Err(not_allocated(addr)),
            None => self.record_stream_loose_or_pool(cold, addr, stream),
        }
    }

    /// Ends a step served by the plan: the next allocation is the plan's first again. A retired region
    /// none of whose buffers lives goes back to the pool (after the streams that used it) and a fresh
    /// one takes its place.
    pub(crate) fn end_ahead_step(&self, cold: &mut Cold) {
        let ahead = cold.ahead.as_mut().expect("a plan is set");
        if ahead.serving && ahead.next > 0 {
            cold.figures.replayed_iterations += 1;
        }
        (ahead.step, ahead.next, ahead.serving, ahead.step_live) = (ahead.step + 1, 0, true, 0);
        for region in 0..ahead.plan.streams.len() {
            let base = ahead.bases[region];
            let Some(at) = cold.regions.find(base).filter(|&at| cold.regions.list[at].retired) else { continue };
            if !ahead.taken[region].is_empty() {
                continue;
            }
            let (stream, bytes) = (cold.regions.list[at].stream, ahead.plan.region_bytes[region]);
            if let Ok(at) = cold.regions.ensure(&self.backing, stream, bytes, bytes) {
                ahead.bases[region] = cold.regions.list[at].base;
            }
        }
        self.publish_bounds(cold);
    }

    /// The live arena buffers of a set plan: (address, size, stream).
    pub(crate) fn ahead_buffers(cold: &Cold) -> impl Iterator<Item = (u64, u64, StreamId)> + '_ {
        cold.ahead.iter().flat_map(|a| a.live.iter().filter(|(_, l)| l.arena.is_some()).map(|(&addr, l)| (addr, l.size, l.stream)))
    }
}
