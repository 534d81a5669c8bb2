//! Peaks of allocated, requested and active bytes and of blocks, arena buffers included. The pool
//! leaves its carved regions out of its own peaks, and the serving path counts nothing, so a
//! served iteration's peak is taken from its schedule: what the pool held when serving began, plus
//! the most the schedule holds live at once, due once the steps pass the step where it is reached.

use std::sync::atomic::Ordering::{Acquire, Relaxed};

use vrampool_core::stats::Stats;
use vrampool_core::MemoryResource;

use crate::pool::PlannedPool;
use crate::schedule::Schedule;
use crate::serving::{Phase, Word};
use crate::state::Cold;

/// `[allocated bytes, requested bytes, active bytes, blocks]`, as `Stats` has them.
pub(crate) type Four = [u64; 4];

pub(crate) fn currents(stats: &Stats) -> Four {
    [stats.allocated_bytes.current, stats.requested_bytes.current, stats.active_bytes.current, stats.allocation.current]
}

#[derive(Default)]
pub(crate) struct Peaks {
    /// The highest readings (and due schedule peaks) since the last reset.
    seen: Four,
    armed: Option<Armed>,
}

/// The served epoch's peak: due once the steps have passed `reached` more often than `crossings`.
struct Armed {
    peak: Four,
    reached: usize,
    crossings: u64,
}

impl Peaks {
    fn raise(&mut self, values: Four) {
        for (seen, value) in self.seen.iter_mut().zip(values) {
            *seen = (*seen).max(value);
        }
    }

    /// Raises the peaks to the armed schedule peak if its step has been passed more often than
    /// when it was armed (`crossings` of that step).
    fn settle(&mut self, crossings: impl Fn(usize) -> u64) {
        if let Some(peak) = self.armed.as_ref().filter(|a| crossings(a.reached) > a.crossings).map(|a| a.peak) {
            self.raise(peak);
        }
    }
}

impl<B: MemoryResource> PlannedPool<B> {
    /// How many times the epoch's steps have passed step count `reached`: once a wrap, and once in
    /// the iteration under way if it is that far.
    fn crossings(&self, cold: &Cold, reached: usize) -> u64 {
        let word = self.word.load(Acquire);
        let wraps = self.wraps.load(Relaxed) - cold.wraps_at_epoch;
        let under_way = Word::phase(word) == Phase::Serving && Word::position(word) >= reached;
        wraps + u64::from(under_way)
    }

    /// Arms the peak of `schedule`, served from step `position`, over what the pool holds now.
    pub(crate) fn arm_peak(&self, cold: &mut Cold, schedule: &Schedule, position: usize) {
        let live = schedule.peak.live;
        let held = self.backing.held();
        let peak = [live.live_block_bytes, live.live_bytes, live.live_block_bytes, live.live];
        let peak = std::array::from_fn(|k| held[k].saturating_add(peak[k]));
        let reached = schedule.peak.reached;
        cold.peaks.armed = Some(Armed { peak, reached, crossings: u64::from(position >= reached) });
    }

    /// Settles the epoch's peak as its serving ends at step `position` after `wraps` wraps.
    pub(crate) fn disarm_peak(&self, cold: &mut Cold, wraps: u64, position: usize) {
        cold.peaks.settle(|reached| wraps + u64::from(position >= reached));
        cold.peaks.armed = None;
    }

    /// Raises the peaks to what the pool holds now and `arena` (live arena buffers it does not count).
    pub(crate) fn raise_peaks(&self, cold: &mut Cold, arena: Four) {
        let held = self.backing.held();
        cold.peaks.raise(std::array::from_fn(|k| held[k] + arena[k]));
    }

    /// The peaks, raised to `current` (what the arena's users hold now, arena buffers included).
    pub fn peaks(&self, current: Four) -> Four {
        let Ok(mut cold) = self.lock() else { return current };
        let crossings = cold.peaks.armed.as_ref().map_or(0, |a| self.crossings(&cold, a.reached));
        cold.peaks.settle(|_| crossings);
        cold.peaks.raise(current);
        cold.peaks.seen
    }

    /// Starts the peaks again from `current`; a served iteration's peak is due again once its steps
    /// pass it again.
    pub fn reset_peaks(&self, current: Four) {
        let Ok(mut cold) = self.lock() else { return };
        let crossings = cold.peaks.armed.as_ref().map_or(0, |a| self.crossings(&cold, a.reached));
        if let Some(armed) = cold.peaks.armed.as_mut() {
            armed.crossings = crossings;
        }
        cold.peaks.seen = current;
    }
}
