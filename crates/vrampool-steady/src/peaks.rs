//! Peaks of allocated, requested and active bytes and of blocks, arena buffers included. The pool
//! leaves its carved regions out of its own peaks, and the serving path counts nothing, so a
//! served iteration's peak is taken from its schedule: what the pool held when serving began, plus
//! the most the iteration holds at once less what it has freed by then of the older buffers (a
//! training step frees the last one's gradients midway), due once the steps pass the step where
//! it is reached (`stats.rs` keeps them).

use vrampool_core::stats::Stats;

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

/// The served epoch's peak: due once its step has been passed more often than `crossings` times,
/// higher by `drift` each iteration after the first.
struct Armed {
    peak: Four,
    drift: Four,
    reached: usize,
    crossings: u64,
}

impl Peaks {
    pub(crate) fn seen(&self) -> Four {
        self.seen
    }

    pub(crate) fn raise(&mut self, values: Four) {
        for (seen, value) in self.seen.iter_mut().zip(values) {
            *seen = (*seen).max(value);
        }
    }

    /// Arms `peak`, reached at step count `reached`, which the steps have passed `crossings` times,
    /// and `drift` higher in each iteration after the first.
    pub(crate) fn arm(&mut self, peak: Four, drift: Four, reached: usize, crossings: u64) {
        self.armed = Some(Armed { peak, drift, reached, crossings });
    }

    /// The step count where the armed peak is reached, if one is armed.
    pub(crate) fn armed_step(&self) -> Option<usize> {
        self.armed.as_ref().map(|a| a.reached)
    }

    /// Raises the peaks to the armed one if its step has now been passed `crossings` times, more
    /// than when it was armed (the last pass in the epoch's iteration `crossings - 1`).
    pub(crate) fn settle(&mut self, crossings: u64) {
        let due = self.armed.as_ref().filter(|a| crossings > a.crossings);
        if let Some(peak) = due.map(|a| std::array::from_fn(|k| a.peak[k].saturating_add(a.drift[k].saturating_mul(crossings - 1)))) {
            self.raise(peak);
        }
    }

    /// Settles the armed peak as its serving ends, and forgets it.
    pub(crate) fn disarm(&mut self, crossings: u64) {
        self.settle(crossings);
        self.armed = None;
    }

    /// Starts again from `current`; the armed peak is due once its step is passed again.
    pub(crate) fn reset(&mut self, current: Four, crossings: u64) {
        self.seen = current;
        if let Some(armed) = self.armed.as_mut() {
            armed.crossings = crossings;
        }
    }
}
