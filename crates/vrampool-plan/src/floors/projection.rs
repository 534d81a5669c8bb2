//! How high a run of lowest floor first must end, seen from where it stands.
//!
//! Every buffer goes at or above the skyline over its lifetime, so the buffers still to place that are live
//! at one moment will all lie above the skyline there, and apart: the run ends at least as high as the
//! skyline plus the bytes still to place, at every moment. A run whose projection passes the arena to beat
//! can stop there, long before its skyline does.

/// Per moment, the skyline and the bytes still to place live then; per node, the most of the latter and of
/// their sum below it. A placement sets the skyline on its lifetime to its top (lowest floor first puts it at
/// the highest point there, so its top is above every moment's) and takes its bytes from what is left to
/// place, both lazily.
pub(super) struct Projection {
    leaves: usize,
    /// The most bytes still to place live at one moment below the node.
    rest: Vec<u64>,
    /// The most of skyline plus bytes still to place at one moment below the node.
    height: Vec<u64>,
    /// The skyline every moment below the node has been set to, and the bytes placed on all of them, not yet
    /// passed to the children.
    pending: Vec<Option<(u64, u64)>>,
}

impl Projection {
    /// Nothing placed yet, with `live[t]` bytes to place live at moment `t`.
    pub(super) fn new(live: &[u64]) -> Projection {
        let leaves = live.len().max(1).next_power_of_two();
        let mut rest = vec![0; 2 * leaves];
        rest[leaves..leaves + live.len()].copy_from_slice(live);
        for node in (1..leaves).rev() {
            rest[node] = rest[2 * node].max(rest[2 * node + 1]);
        }
        let height = rest.clone();
        Projection { leaves, rest, height, pending: vec![None; 2 * leaves] }
    }

    /// The least height the run can end at.
    pub(super) fn height(&self) -> u64 {
        self.height[1]
    }

    /// A buffer of `size` bytes live on moments `lo..hi` placed with its top at `top`, at or above the skyline
    /// on every one of them.
    pub(super) fn place(&mut self, lo: u32, hi: u32, top: u64, size: u64) {
        self.update(1, 0, self.leaves, (lo as usize, hi as usize), (top, size));
    }

    fn update(&mut self, node: usize, from: usize, to: usize, (lo, hi): (usize, usize), placed: (u64, u64)) {
        if hi <= from || to <= lo {
            return;
        }
        if lo <= from && to <= hi {
            self.apply(node, placed);
            return;
        }
        if let Some(pending) = self.pending[node].take() {
            self.apply(2 * node, pending);
            self.apply(2 * node + 1, pending);
        }
        let middle = (from + to) / 2;
        self.update(2 * node, from, middle, (lo, hi), placed);
        self.update(2 * node + 1, middle, to, (lo, hi), placed);
        self.rest[node] = self.rest[2 * node].max(self.rest[2 * node + 1]);
        self.height[node] = self.height[2 * node].max(self.height[2 * node + 1]);
    }

    /// Every moment below `node` has `size` bytes fewer to place and the skyline at `top`.
    fn apply(&mut self, node: usize, (top, size): (u64, u64)) {
        // Each moment below counted the buffer among those to place, so none has fewer than `size` left.
        self.rest[node] -= size;
        self.height[node] = top.saturating_add(self.rest[node]);
        // The later top is the higher, and the bytes placed add up.
        self.pending[node] = Some(self.pending[node].map_or((top, size), |(_, placed)| (top, placed + size)));
    }
}
