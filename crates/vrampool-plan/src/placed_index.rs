//! The placed buffers' byte ranges, indexed by lifetime so that a query yields exactly those whose lifetimes
//! overlap a given one. A heuristic that asks this of every buffer costs O(n log n + total overlaps) instead of TFLite's
//! O(n^2) scan over all placed buffers.
//!
//! A placed buffer overlaps the query `[lo, hi)` iff it is live on segment `lo` (found by a stabbing query in a
//! segment tree holding each buffer on its canonical nodes) or it starts strictly inside `(lo, hi)` (found in
//! an ordered set of start segments). The two cases are disjoint, so nothing is reported twice. The lists
//! hold the byte ranges themselves rather than buffer ids, so that a query reads memory in order.

use std::collections::BTreeSet;

/// A placed buffer's bytes, `[start, end)`.
pub(crate) type Span = (u64, u64);

pub(crate) struct PlacedIndex {
    leaves: usize,
    cover: Vec<Vec<Span>>,
    starts: Vec<Vec<Span>>,
    start_segments: BTreeSet<u32>,
}

impl PlacedIndex {
    pub fn new(segments: usize) -> Self {
        let leaves = segments.max(1).next_power_of_two();
        PlacedIndex {
            leaves,
            cover: vec![Vec::new(); 2 * leaves],
            starts: vec![Vec::new(); segments.max(1)],
            start_segments: BTreeSet::new(),
        }
    }

    /// Records a buffer occupying `span`, live on segments `lo..hi`.
    pub fn insert(&mut self, span: Span, lo: u32, hi: u32) {
        let (mut l, mut r) = (lo as usize + self.leaves, hi as usize + self.leaves);
        while l < r {
            if l & 1 == 1 {
                self.cover[l].push(span);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.cover[r].push(span);
            }
            l >>= 1;
            r >>= 1;
        }
        self.starts[lo as usize].push(span);
        self.start_segments.insert(lo);
    }

    /// Appends to `out` the span of every recorded buffer live on some segment of `lo..hi`, each once.
    pub fn overlapping(&self, lo: u32, hi: u32, out: &mut Vec<Span>) {
        let mut node = lo as usize + self.leaves;
        while node >= 1 {
            out.extend_from_slice(&self.cover[node]);
            node >>= 1;
        }
        for &s in self.start_segments.range(lo + 1..hi) {
            out.extend_from_slice(&self.starts[s as usize]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_exactly_the_overlapping() {
        // Brute force over every pair of ranges in a small timeline.
        let ranges: Vec<(u32, u32)> = (0..9).flat_map(|lo| (lo + 1..=9).map(move |hi| (lo, hi))).collect();
        let mut index = PlacedIndex::new(9);
        for (id, &(lo, hi)) in ranges.iter().enumerate() {
            // The span carries the id, so that the query's answer can be checked.
            index.insert((id as u64, id as u64 + 1), lo, hi);
        }
        for &(lo, hi) in &ranges {
            let mut got = Vec::new();
            index.overlapping(lo, hi, &mut got);
            let mut got: Vec<u32> = got.iter().map(|&(id, _)| id as u32).collect();
            got.sort_unstable();
            let want: Vec<u32> = (0..ranges.len() as u32)
                .filter(|&j| {
                    let (l, h) = ranges[j as usize];
                    l < hi && lo < h
                })
                .collect();
            assert_eq!(got, want, "query {lo}..{hi}");
        }
    }
}
