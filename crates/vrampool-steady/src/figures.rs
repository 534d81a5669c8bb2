//! What the planned arena shows of itself: its figures, its live buffers and its regions.

use vrampool_core::StreamId;

use crate::schedule::Schedule;

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
    /// What placed its largest region: "greedy-by-size", "best-fit-by-start", "ring" or "floors-by-start"
    /// (in O(n log n)), or "search" (the planner's search, within the budget, where it did better).
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
    /// The bytes of the live arena buffers, as requested and as blocks (each rounded up to the
    /// pool's alignment).
    pub arena_live_bytes: u64,
    pub arena_live_block_bytes: u64,
    /// The bytes of every arena buffer handed out, as requested and as blocks.
    pub planned_bytes: u64,
    pub planned_block_bytes: u64,
    /// Regions taken from the pool and given back to it, with their bytes.
    pub arena_blocks_taken: u64,
    pub arena_bytes_taken: u64,
    pub arena_blocks_returned: u64,
    pub arena_bytes_returned: u64,
    /// Per key, in key order.
    pub plans: Vec<KeyPlan>,
}

impl PlannedStats {
    /// Adds `other`'s figures to these (the lanes of one mode: `thread_lanes.rs`).
    pub(crate) fn absorb(&mut self, mut other: PlannedStats) {
        for (mine, theirs) in self.counts().into_iter().zip(other.counts()) {
            *mine += *theirs;
        }
        self.arena_live += other.arena_live;
        self.plans.append(&mut other.plans);
        self.plans.sort_by_key(|p| p.key);
    }

    fn counts(&mut self) -> [&mut u64; 15] {
        [
            &mut self.planned_allocations,
            &mut self.dynamic_allocations,
            &mut self.idle_allocations,
            &mut self.fallbacks,
            &mut self.recorded_iterations,
            &mut self.replayed_iterations,
            &mut self.arena_bytes,
            &mut self.arena_live_bytes,
            &mut self.arena_live_block_bytes,
            &mut self.planned_bytes,
            &mut self.planned_block_bytes,
            &mut self.arena_blocks_taken,
            &mut self.arena_bytes_taken,
            &mut self.arena_blocks_returned,
            &mut self.arena_bytes_returned,
        ]
    }
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
    pub(crate) planned_block_bytes: u64,
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
        let whole = schedule.served_in(schedule.steps.len());
        self.planned_allocations += iterations * schedule.arena_buffers;
        self.planned_bytes += iterations * whole.arena_bytes;
        self.planned_block_bytes += iterations * whole.arena_block_bytes;
        self.dynamic_allocations += iterations * (schedule.allocations - schedule.arena_buffers);
        self.replayed_iterations += iterations;
        let served = schedule.served_in(steps);
        self.planned_allocations += served.arena;
        self.planned_bytes += served.arena_bytes;
        self.planned_block_bytes += served.arena_block_bytes;
        self.dynamic_allocations += served.pool;
    }
}
