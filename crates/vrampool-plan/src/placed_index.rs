//! The bytes taken by placed buffers, indexed by lifetime: a query yields the bytes taken by the buffers whose
//! lifetimes overlap a given one, as a few lists of ranges (they may overlap each other; their union is
//! exact). A heuristic only looks for gaps between taken bytes, so each list is kept as the merged union of
//! its buffers' ranges: in a packed plan the buffers live at a moment leave few gaps, and a query costs the
//! gaps rather than the buffers (on a training graph's backward pass, thousands of saved activations are
//! live at once).
//!
//! A placed buffer overlaps the query `[lo, hi)` iff it is live on segment `lo` or it starts strictly inside
//! `(lo, hi)`. The first are found by a stabbing query in a segment tree holding each buffer's bytes on the
//! canonical nodes of its lifetime; the second in a segment tree over start segments, holding each buffer's
//! bytes on every node above its start, read on the canonical nodes of `(lo, hi)`.

use smallvec::SmallVec;

/// A placed buffer's bytes, `[start, end)`.
pub(crate) type Span = (u64, u64);

/// Disjoint ranges, none touching another, by start: the union of the spans added. A sorted vector rather than
/// a tree: merged, a node's ranges are few (the gaps between the bytes its buffers take), so shifting them on an
/// insert costs less than a tree's allocations, and reading them is a copy. Most nodes hold one or two ranges,
/// kept inline: an index of tens of thousands of nodes then makes few heap allocations.
#[derive(Default, Clone)]
struct Union(SmallVec<[Span; 2]>);

impl Union {
    fn add(&mut self, (start, end): Span) {
        // The ranges that touch or overlap the span: those ending at or after its start and starting at or
        // before its end.
        let first = self.0.partition_point(|&(_, e)| e < start);
        let last = first + self.0[first..].partition_point(|&(s, _)| s <= end);
        if first == last {
            self.0.insert(first, (start, end));
            return;
        }
        let merged = (start.min(self.0[first].0), end.max(self.0[last - 1].1));
        self.0[first] = merged;
        self.0.drain(first + 1..last);
    }

    fn extend_into(&self, out: &mut Vec<Span>) {
        out.extend_from_slice(&self.0);
    }
}

pub(crate) struct PlacedIndex {
    leaves: usize,
    /// Per node, the bytes of the buffers live on all of its segments (and not on all of its parent's).
    cover: Vec<Union>,
    /// Per node, the bytes of the buffers starting on one of its segments.
    starts: Vec<Union>,
}

impl PlacedIndex {
    pub fn new(segments: usize) -> Self {
        let leaves = segments.max(1).next_power_of_two();
        PlacedIndex { leaves, cover: vec![Union::default(); 2 * leaves], starts: vec![Union::default(); 2 * leaves] }
    }

    /// Records a buffer occupying `span`, live on segments `lo..hi`.
    pub fn insert(&mut self, span: Span, lo: u32, hi: u32) {
        for node in canonical(self.leaves, lo, hi) {
            self.cover[node].add(span);
        }
        let mut node = lo as usize + self.leaves;
        while node >= 1 {
            self.starts[node].add(span);
            node >>= 1;
        }
    }

    /// Appends to `out` ranges whose union is the bytes of every recorded buffer live on some segment of
    /// `lo..hi`.
    pub fn overlapping(&self, lo: u32, hi: u32, out: &mut Vec<Span>) {
        let mut node = lo as usize + self.leaves;
        while node >= 1 {
            self.cover[node].extend_into(out);
            node >>= 1;
        }
        for node in canonical(self.leaves, lo + 1, hi) {
            self.starts[node].extend_into(out);
        }
    }
}

/// Frees `value` on a thread of its own where one can be started, else here. A run's index over a large part holds
/// hundreds of thousands of small vectors where thousands of long-lived buffers leave gaps between them, and
/// freeing them took 45-50 ms after a run stopped at its deadline (`plan` on 60,000 buffers of powers of two
/// ended 10-60 ms past its budget).
pub(crate) fn free_elsewhere<T: Send + 'static>(value: T) {
    // A thread that cannot be started hands the closure, and so the value, back to be dropped here.
    let _ = std::thread::Builder::new().name("vrampool-plan-free".into()).spawn(move || drop(value));
}

/// The canonical nodes of segments `lo..hi` in a segment tree of `leaves` leaves: the fewest nodes whose
/// segments make up the range.
pub(crate) fn canonical(leaves: usize, lo: u32, hi: u32) -> impl Iterator<Item = usize> {
    let (mut l, mut r) = (lo as usize + leaves, hi as usize + leaves);
    let mut right = None;
    std::iter::from_fn(move || loop {
        if let Some(node) = right.take() {
            return Some(node);
        }
        if l >= r {
            return None;
        }
        let mut left = None;
        if l & 1 == 1 {
            left = Some(l);
            l += 1;
        }
        if r & 1 == 1 {
            r -= 1;
            right = Some(r);
        }
        (l, r) = (l >> 1, r >> 1);
        if left.is_some() {
            return left;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_freed_elsewhere_is_dropped_on_another_thread() {
        struct Tell(std::sync::mpsc::Sender<std::thread::ThreadId>);
        impl Drop for Tell {
            fn drop(&mut self) {
                self.0.send(std::thread::current().id()).unwrap();
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        free_elsewhere(Tell(tx));
        let dropped_on = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("dropped");
        assert_ne!(dropped_on, std::thread::current().id());
    }

    #[test]
    fn reports_exactly_the_overlapping() {
        // Brute force over every pair of ranges in a small timeline. Buffer `id` takes bytes `2 id..2 id + 1`,
        // so no two ranges touch, none merges, and the query's answer names the buffers.
        let ranges: Vec<(u32, u32)> = (0..9).flat_map(|lo| (lo + 1..=9).map(move |hi| (lo, hi))).collect();
        let mut index = PlacedIndex::new(9);
        for (id, &(lo, hi)) in ranges.iter().enumerate() {
            index.insert((2 * id as u64, 2 * id as u64 + 1), lo, hi);
        }
        for &(lo, hi) in &ranges {
            let mut got = Vec::new();
            index.overlapping(lo, hi, &mut got);
            let mut got: Vec<u32> = got.iter().map(|&(start, _)| (start / 2) as u32).collect();
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

    #[test]
    fn a_union_holds_the_bytes_added_as_disjoint_ranges_by_start() {
        // Random spans on 0..64 against a plain array of bytes taken.
        let mut rng = crate::rng::SplitMix64(99);
        let mut below = |m: u64| rng.below(m);
        for _ in 0..200 {
            let (mut union, mut taken) = (Union::default(), [false; 64]);
            for _ in 0..1 + below(12) {
                let start = below(63);
                let end = start + 1 + below(64 - start - 1).min(below(8));
                union.add((start, end));
                taken[start as usize..end as usize].iter_mut().for_each(|t| *t = true);
                let mut ranges = Vec::new();
                union.extend_into(&mut ranges);
                assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "{ranges:?}");
                let mut held = [false; 64];
                ranges.iter().for_each(|&(s, e)| held[s as usize..e as usize].iter_mut().for_each(|t| *t = true));
                assert_eq!(held, taken, "{ranges:?}");
            }
        }
    }

    #[test]
    fn ranges_that_touch_or_overlap_merge() {
        let mut union = Union::default();
        for span in [(10, 12), (0, 4), (4, 6), (20, 30), (8, 10), (5, 9), (25, 26)] {
            union.add(span);
        }
        let mut out = Vec::new();
        union.extend_into(&mut out);
        assert_eq!(out, [(0, 12), (20, 30)]);
        union.add((11, 21));
        out.clear();
        union.extend_into(&mut out);
        assert_eq!(out, [(0, 30)]);
    }
}
