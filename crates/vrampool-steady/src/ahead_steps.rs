//! Serving a step from the plan made ahead (`ahead.rs`), under the cold path's lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;

use vrampool_core::{MemoryResource, PieceEvent, PoolError, StreamId};

use crate::ahead::{Ahead, AheadLive, AheadPlan, Place};
use crate::pool::PlannedPool;
use crate::serving::{Phase, Word};
use crate::state::{not_allocated, wrong_size, Cold, Loose};

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
                cold.loose.insert(addr, Loose { size: live.size, stream: live.stream, used_elsewhere: live.used_elsewhere });
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
        for (region, &stream) in plan.streams.iter().enumerate() {
            let bytes = plan.region_room(region);
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
        cold.ahead = Some(Ahead {
            plan,
            bases,
            taken,
            live: HashMap::default(),
            step: 0,
            next: 0,
            serving: true,
            step_live: 0,
            step_kept: 0,
            arena_live: [0; 4],
        });
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
                placed = Place::Busy(region);
            }
        }
        if let Place::Busy(region) = placed {
            // The region's bytes above the plan's (its rounding) take what the plan cannot place
            // now, such as the next batch while the last one lives: no segment of the pool for it.
            let found = cold.regions.find(ahead.bases[region]).filter(|&at| !cold.regions.list[at].retired);
            if let Some(offset) = found.and_then(|at| ahead.above_plan(region, size, cold.regions.list[at].bytes)) {
                placed = Place::At(region, offset);
            }
        }
        let kept = !matches!(placed, Place::Misfit) && ahead.next_kept();
        let (addr, arena) = match placed {
            Place::At(region, offset) => {
                let addr = ahead.bases[region] + offset;
                if self.watched {
                    self.backing.piece(addr, size, stream, PieceEvent::Allocated)?;
                }
                ahead.taken[region].insert(offset, offset + size);
                ahead.count_live(size, self.planning.alignment, true);
                cold.figures.planned_allocations += 1;
                cold.figures.planned_bytes += size;
                cold.figures.planned_block_bytes += size.next_multiple_of(self.planning.alignment);
                (addr, Some((region, offset)))
            }
            Place::Busy(_) | Place::Misfit => {
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
        ahead.step_kept += usize::from(kept);
        ahead.live.insert(addr, AheadLive { size, stream, step: ahead.step, arena, kept, used_elsewhere: false });
        if arena.is_some() {
            // The serving path counts nothing, and the pool leaves the regions out: the peaks are raised here.
            let arena_live = ahead.arena_live;
            self.raise_peaks(cold, arena_live);
        }
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
                        if self.watched {
                            cold.births.remove(&addr);
                            // Its bytes were used on its own stream alone, or not: the region's other
                            // buffers' bytes are no concern of its.
                            let event = if in_use || live.used_elsewhere { PieceEvent::FreedInUse } else { PieceEvent::Freed };
                            let _ = self.backing.piece(addr, live.size, live.stream, event);
                        }
                        ahead.taken[region].remove(&offset);
                        ahead.count_live(live.size, self.planning.alignment, false);
                    }
                    None => self.backing.free(addr, size, on)?,
                }
                ahead.live.remove(&addr);
                if live.step == ahead.step {
                    ahead.step_live -= 1;
                    ahead.step_kept -= usize::from(live.kept);
                    if self.auto_steps && ahead.step_over() {
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
        let ahead = cold.ahead.as_mut().expect("a plan is set");
        match ahead.live.get_mut(&addr) {
            Some(live) if live.arena.is_some() => {
                if stream != live.stream {
                    live.used_elsewhere = true;
                    if let Some(at) = cold.regions.find(addr) {
                        cold.regions.list[at].used_on(stream);
                    }
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
        (ahead.step, ahead.next, ahead.serving, ahead.step_live, ahead.step_kept) = (ahead.step + 1, 0, true, 0, 0);
        for region in 0..ahead.plan.streams.len() {
            let base = ahead.bases[region];
            let Some(at) = cold.regions.find(base).filter(|&at| cold.regions.list[at].retired) else { continue };
            if !ahead.taken[region].is_empty() {
                continue;
            }
            let (stream, bytes) = (cold.regions.list[at].stream, ahead.plan.region_room(region));
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
