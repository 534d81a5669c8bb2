//! What the planned arena shows of itself: its figures, its live buffers and its regions.

use std::sync::atomic::Ordering::{Acquire, Relaxed};

use vrampool_core::{MemoryResource, PoolError, StreamId};

use crate::cold::Cold;
use crate::pool::PlannedPool;
use crate::schedule::Schedule;
use crate::serving::{Phase, Word};

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
    /// Of those, the allocations passed to the pool while backing off (nothing repeated: see
    /// `idle.rs`).
    pub idle_allocations: u64,
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

#[derive(Debug, Clone, Default)]
pub(crate) struct Figures {
    pub(crate) planned_allocations: u64,
    pub(crate) planned_bytes: u64,
    pub(crate) dynamic_allocations: u64,
    pub(crate) fallbacks: u64,
    pub(crate) recorded_iterations: u64,
    pub(crate) replayed_iterations: u64,
}

impl Figures {
    /// `iterations` whole iterations of `schedule`, then its first `steps` steps (all of them: one
    /// more iteration replayed).
    pub(crate) fn add_served(&mut self, schedule: &Schedule, iterations: u64, steps: usize) {
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
        let (mut live, mut live_bytes) = (cold.loose.len() as u64, cold.loose.values().map(|l| l.size).sum::<u64>());
        if let (Phase::Serving, Some(serving)) = (Word::phase(word), &cold.serving) {
            let schedule = &serving.schedule;
            let position = Word::position(word).min(schedule.steps.len());
            figures.add_served(schedule, self.wraps.load(Relaxed) - cold.wraps_at_epoch, position);
            let served = schedule.served_in(position);
            live += served.live;
            live_bytes += served.live_bytes;
            // Frees taken ahead of their steps.
            for step in cold.early.iter().map(|&at| schedule.steps[at]).filter(|s| s.in_arena()) {
                live -= 1;
                live_bytes -= step.size();
            }
        }
        for (_, size, _) in Self::ahead_buffers(cold) {
            live += 1;
            live_bytes += size;
        }
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
            planned_bytes: figures.planned_bytes,
            arena_blocks_taken: region.taken,
            arena_bytes_taken: region.bytes_taken,
            arena_blocks_returned: region.returned,
            arena_bytes_returned: region.bytes_returned,
            plans: Vec::new(),
        }
    }
}
