//! The planned pool's figures, live buffers and peaks (`peaks.rs`), read under its lock or from the
//! serving word.

use std::sync::atomic::Ordering::{Acquire, Relaxed};

use vrampool_core::{MemoryResource, PoolError};

use crate::figures::{ArenaBuffer, ArenaRegion, KeyPlan, PlannedStats};
use crate::peaks::Four;
use crate::pool::PlannedPool;
use crate::schedule::{Schedule, Served};
use crate::serving::{Phase, Word};
use crate::state::Cold;

impl<B: MemoryResource> PlannedPool<B> {
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
            buffers.extend(self.live_in_epoch(serving, word, &cold.early));
        }
        buffers.extend(Self::ahead_buffers(&cold).map(|(addr, size, stream)| ArenaBuffer { addr, size, stream, age_ns: None }));
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

    pub(crate) fn figures_of(&self, cold: &Cold) -> PlannedStats {
        let mut figures = cold.figures.clone();
        let word = self.word.load(Acquire);
        let alignment = self.planning.alignment.max(1);
        // Live buffers' sizes: loose, made ahead, and (taken ahead of their steps) freed.
        let mut sizes: Vec<u64> = cold.loose.values().map(|l| l.size).collect();
        sizes.extend(Self::ahead_buffers(cold).map(|(_, size, _)| size));
        let mut served = Served::default();
        let mut freed_early = Vec::new();
        if let (Phase::Serving, Some(serving)) = (Word::phase(word), &cold.serving) {
            let schedule = &serving.schedule;
            let position = Word::position(word).min(schedule.steps.len());
            figures.add_served(schedule, self.wraps.load(Relaxed) - cold.wraps_at_epoch, position);
            served = schedule.served_in(position);
            freed_early.extend(cold.early.iter().map(|&at| schedule.steps[at]).filter(|s| s.in_arena()).map(|s| s.size()));
        }
        let sum =
            |sizes: &[u64], rounded: bool| -> u64 { sizes.iter().map(|&s| if rounded { s.next_multiple_of(alignment) } else { s }).sum() };
        let live = served.live + sizes.len() as u64 - freed_early.len() as u64;
        let live_bytes = served.live_bytes + sum(&sizes, false) - sum(&freed_early, false);
        let live_block_bytes = served.live_block_bytes + sum(&sizes, true) - sum(&freed_early, true);
        let region = cold.regions.figures;
        PlannedStats {
            planned_allocations: figures.planned_allocations,
            dynamic_allocations: figures.dynamic_allocations + self.idle.total(),
            idle_allocations: self.idle.total(),
            fallbacks: figures.fallbacks,
            recorded_iterations: figures.recorded_iterations,
            replayed_iterations: figures.replayed_iterations,
            arena_bytes: cold.regions.bytes(),
            arena_live: live as usize,
            arena_live_bytes: live_bytes,
            arena_live_block_bytes: live_block_bytes,
            planned_bytes: figures.planned_bytes,
            planned_block_bytes: figures.planned_block_bytes,
            arena_blocks_taken: region.taken,
            arena_bytes_taken: region.bytes_taken,
            arena_blocks_returned: region.returned,
            arena_bytes_returned: region.bytes_returned,
            plans: Vec::new(),
        }
    }

    /// How many times the epoch's steps have passed step count `reached`: once a wrap, and once in
    /// the iteration under way if it is that far.
    fn crossings(&self, cold: &Cold, reached: usize) -> u64 {
        let word = self.word.load(Acquire);
        let wraps = self.wraps.load(Relaxed) - cold.wraps_at_epoch;
        wraps + u64::from(Word::phase(word) == Phase::Serving && Word::position(word) >= reached)
    }

    /// Arms the peak of `schedule`, served from step `position`, over what the pool holds now.
    pub(crate) fn arm_peak(&self, cold: &mut Cold, schedule: &Schedule, position: usize) {
        let held = self.backing.held();
        let peak = std::array::from_fn(|k| held[k].saturating_add(schedule.peak.most[k]));
        cold.peaks.arm(peak, schedule.peak.drift, schedule.peak.reached, u64::from(position >= schedule.peak.reached));
    }

    /// Settles the epoch's peak as its serving ends at step `position` after `wraps` wraps.
    pub(crate) fn disarm_peak(&self, cold: &mut Cold, wraps: u64, position: usize) {
        let crossings = cold.peaks.armed_step().map_or(0, |reached| wraps + u64::from(position >= reached));
        cold.peaks.disarm(crossings);
    }

    /// Raises the peaks to what the pool holds now and `arena` (live arena buffers it does not count).
    pub(crate) fn raise_peaks(&self, cold: &mut Cold, arena: Four) {
        let held = self.backing.held();
        cold.peaks.raise(std::array::from_fn(|k| held[k] + arena[k]));
    }

    /// The peaks, raised to `current` (what the arena's users hold now, arena buffers included).
    pub fn peaks(&self, current: Four) -> Four {
        let Ok(mut cold) = self.lock() else { return current };
        let crossings = cold.peaks.armed_step().map_or(0, |reached| self.crossings(&cold, reached));
        cold.peaks.settle(crossings);
        cold.peaks.raise(current);
        cold.peaks.seen()
    }

    /// Starts the peaks again from `current`; a served iteration's peak is due again once its steps
    /// pass it again.
    pub fn reset_peaks(&self, current: Four) {
        let Ok(mut cold) = self.lock() else { return };
        let crossings = cold.peaks.armed_step().map_or(0, |reached| self.crossings(&cold, reached));
        cold.peaks.reset(current, crossings);
    }
}
