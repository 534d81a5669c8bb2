//! The skyline: the top of the placed buffers at each moment.

/// A value per segment that only rises: raise a range to at least a value, read a range's maximum, both in
/// O(log n). A node's `tag` is a value every segment below it has reached, `max` the most any has.
pub(super) struct Skyline {
    leaves: usize,
    max: Vec<u64>,
    tag: Vec<u64>,
    /// Nodes visited so far: the work done, which `quick_plan` reports.
    pub(super) visits: std::cell::Cell<u64>,
}

impl Skyline {
    pub(super) fn new(segments: usize) -> Skyline {
        let leaves = segments.max(1).next_power_of_two();
        Skyline { leaves, max: vec![0; 2 * leaves], tag: vec![0; 2 * leaves], visits: std::cell::Cell::new(0) }
    }

    /// Every segment of `lo..hi` to at least `value`.
    pub(super) fn raise(&mut self, lo: u32, hi: u32, value: u64) {
        let (mut l, mut r) = (lo as usize + self.leaves, hi as usize + self.leaves);
        let (first, last) = (l, r - 1);
        while l < r {
            self.visits.set(self.visits.get() + 1);
            if l & 1 == 1 {
                self.max[l] = self.max[l].max(value);
                self.tag[l] = self.tag[l].max(value);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.max[r] = self.max[r].max(value);
                self.tag[r] = self.tag[r].max(value);
            }
            l >>= 1;
            r >>= 1;
        }
        // Above the nodes raised, the maximum is at least the value.
        for mut node in [first >> 1, last >> 1] {
            while node >= 1 {
                self.visits.set(self.visits.get() + 1);
                self.max[node] = self.max[node].max(value);
                node >>= 1;
            }
        }
    }

    /// The most of any segment of `lo..hi`.
    pub(super) fn highest(&self, lo: u32, hi: u32) -> u64 {
        let (mut l, mut r) = (lo as usize + self.leaves, hi as usize + self.leaves);
        let (first, last) = (l, r - 1);
        let mut most = 0;
        while l < r {
            self.visits.set(self.visits.get() + 1);
            if l & 1 == 1 {
                most = most.max(self.max[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                most = most.max(self.max[r]);
            }
            l >>= 1;
            r >>= 1;
        }
        // A tag above the range's first or last segment covers part of the range.
        for mut node in [first >> 1, last >> 1] {
            while node >= 1 {
                self.visits.set(self.visits.get() + 1);
                most = most.max(self.tag[node]);
                node >>= 1;
            }
        }
        most
    }
}
