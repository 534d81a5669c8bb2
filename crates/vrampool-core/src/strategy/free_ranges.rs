//! The free ranges of an address-ordered first fit, in address order, in chunks of at most
//! `CHUNK` ranges that each know their largest range. A first fit reads one word a chunk to skip
//! the chunks that hold nothing of the size, then scans one chunk's contiguous ranges; an insert
//! or a removal moves at most a chunk. Design: kept in a `BTreeMap` and scanned in order, the
//! free ranges of 64 live runs of 32 KiB-1 MiB (56 ranges, 22 scanned a call) cost the first fit's
//! allocate, free and placement check 38% of each call's instructions, all of it under the tier's
//! lock, which two threads then waited on.

/// The most ranges a chunk holds; a fuller one splits in two.
const CHUNK: usize = 64;

/// A free range `[base, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Range {
    pub base: u64,
    pub end: u64,
}

impl Range {
    pub fn len(self) -> u64 {
        self.end - self.base
    }
}

/// Where a range is held; valid until the next insert or removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pos {
    chunk: usize,
    index: usize,
}

#[derive(Default)]
struct Chunk {
    /// In address order, never empty.
    ranges: Vec<Range>,
    largest: u64,
}

impl Chunk {
    fn recompute(&mut self) {
        self.largest = self.ranges.iter().map(|r| r.len()).max().unwrap_or(0);
    }
}

/// Disjoint ranges in address order; see the module documentation.
#[derive(Default)]
pub(super) struct FreeRanges {
    chunks: Vec<Chunk>,
}

impl FreeRanges {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.ranges.len()).sum()
    }

    pub fn get(&self, pos: Pos) -> Range {
        self.chunks[pos.chunk].ranges[pos.index]
    }

    /// The lowest range of at least `size` bytes.
    pub fn first_fit(&self, size: u64) -> Option<Pos> {
        let chunk = self.chunks.iter().position(|c| c.largest >= size)?;
        let index = self.chunks[chunk].ranges.iter().position(|r| r.len() >= size)?;
        Some(Pos { chunk, index })
    }

    /// The lowest range that begins at or above `addr`.
    pub fn at_or_above(&self, addr: u64) -> Option<Pos> {
        let chunk = self.chunks.partition_point(|c| c.ranges[c.ranges.len() - 1].base < addr);
        let index = self.chunks.get(chunk)?.ranges.partition_point(|r| r.base < addr);
        Some(Pos { chunk, index })
    }

    /// The highest range that begins below `addr`, and the lowest that begins at or above it.
    pub fn around(&self, addr: u64) -> (Option<Pos>, Option<Pos>) {
        let above = self.at_or_above(addr);
        let (chunk, index) = match above {
            Some(Pos { chunk: 0, index: 0 }) => return (None, above),
            Some(Pos { chunk, index: 0 }) => (chunk - 1, self.chunks[chunk - 1].ranges.len()),
            Some(Pos { chunk, index }) => (chunk, index),
            None if self.chunks.is_empty() => return (None, None),
            None => (self.chunks.len() - 1, self.chunks[self.chunks.len() - 1].ranges.len()),
        };
        (Some(Pos { chunk, index: index - 1 }), above)
    }

    /// Adds a range that overlaps none held.
    pub fn insert(&mut self, range: Range) {
        if self.chunks.is_empty() {
            self.chunks.push(Chunk { ranges: vec![range], largest: range.len() });
            return;
        }
        let at = self.chunks.partition_point(|c| c.ranges[c.ranges.len() - 1].base < range.base).min(self.chunks.len() - 1);
        let chunk = &mut self.chunks[at];
        let index = chunk.ranges.partition_point(|r| r.base < range.base);
        chunk.ranges.insert(index, range);
        chunk.largest = chunk.largest.max(range.len());
        if chunk.ranges.len() > CHUNK {
            let mut upper = Chunk { ranges: chunk.ranges.split_off(CHUNK / 2), largest: 0 };
            upper.recompute();
            chunk.recompute();
            self.chunks.insert(at + 1, upper);
        }
    }

    pub fn remove(&mut self, pos: Pos) -> Range {
        let chunk = &mut self.chunks[pos.chunk];
        let range = chunk.ranges.remove(pos.index);
        if chunk.ranges.is_empty() {
            self.chunks.remove(pos.chunk);
        } else if range.len() == chunk.largest {
            chunk.recompute();
        }
        range
    }

    /// Replaces the range at `pos` with one that still lies between its neighbours.
    pub fn set(&mut self, pos: Pos, range: Range) {
        let chunk = &mut self.chunks[pos.chunk];
        let old = std::mem::replace(&mut chunk.ranges[pos.index], range);
        if range.len() >= chunk.largest {
            chunk.largest = range.len();
        } else if old.len() == chunk.largest {
            chunk.recompute();
        }
    }

    pub fn largest(&self) -> u64 {
        self.chunks.iter().map(|c| c.largest).max().unwrap_or(0)
    }

    /// Every range, in address order.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = Range> + '_ {
        self.chunks.iter().flat_map(|c| c.ranges.iter().copied())
    }

    /// The ranges that begin in `[lo, hi)`, in address order.
    pub fn within(&self, lo: u64, hi: u64) -> impl Iterator<Item = Range> + '_ {
        let start = self.at_or_above(lo).unwrap_or(Pos { chunk: self.chunks.len(), index: 0 });
        let rest = self.chunks.get(start.chunk..).unwrap_or_default();
        rest.iter()
            .enumerate()
            .flat_map(move |(i, c)| c.ranges[if i == 0 { start.index } else { 0 }..].iter().copied())
            .take_while(move |r| r.base < hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Checks `ranges` against `model` (base -> end), and that each chunk knows its largest.
    fn agrees(ranges: &FreeRanges, model: &BTreeMap<u64, u64>) {
        let held: Vec<(u64, u64)> = ranges.iter().map(|r| (r.base, r.end)).collect();
        assert_eq!(held, model.iter().map(|(&b, &e)| (b, e)).collect::<Vec<_>>());
        assert_eq!(ranges.len(), model.len());
        for c in &ranges.chunks {
            assert!(!c.ranges.is_empty() && c.ranges.len() <= CHUNK);
            assert_eq!(c.largest, c.ranges.iter().map(|r| r.len()).max().unwrap());
        }
        assert_eq!(ranges.largest(), model.iter().map(|(&b, &e)| e - b).max().unwrap_or(0));
    }

    proptest! {
        /// Ranges `[16 k, 16 k + len)` for k below 400: up to 400 ranges, so chunks split and empty.
        #[test]
        fn agrees_with_a_sorted_map(ops in prop::collection::vec((0u64..400, 1u64..16, 0u8..4), 1..1500)) {
            let mut ranges = FreeRanges::default();
            let mut model = BTreeMap::new();
            for (k, len, op) in ops {
                let base = 16 * k;
                let above = ranges.at_or_above(base).map(|p| ranges.get(p));
                prop_assert_eq!(above.map(|r| r.base), model.range(base..).next().map(|(&b, _)| b));
                let below = ranges.around(base).0.map(|p| ranges.get(p));
                prop_assert_eq!(ranges.around(base).1, ranges.at_or_above(base));
                prop_assert_eq!(below.map(|r| r.base), model.range(..base).next_back().map(|(&b, _)| b));
                let fit = ranges.first_fit(len).map(|p| ranges.get(p).base);
                prop_assert_eq!(fit, model.iter().find(|(&b, &e)| e - b >= len).map(|(&b, _)| b));
                let within: Vec<u64> = ranges.within(base, base + 16 * len).map(|r| r.base).collect();
                prop_assert_eq!(within, model.range(base..base + 16 * len).map(|(&b, _)| b).collect::<Vec<_>>());
                // Each range lies in its slot `[16 k, 16 k + 16)`.
                match (model.range(base..base + 16).next().map(|(&b, &e)| Range { base: b, end: e }), op) {
                    (None, _) => {
                        ranges.insert(Range { base, end: base + len });
                        model.insert(base, base + len);
                    }
                    (Some(r), 0 | 1) => {
                        prop_assert_eq!(ranges.remove(ranges.at_or_above(r.base).unwrap()), r);
                        model.remove(&r.base);
                    }
                    (Some(r), _) => {
                        // Shrunk from the front, or grown or shrunk at the end within its slot.
                        let new = if op == 2 && r.len() > 1 {
                            Range { base: r.base + 1, end: r.end }
                        } else {
                            Range { base: r.base, end: (r.base + len).min(base + 16) }
                        };
                        ranges.set(ranges.at_or_above(r.base).unwrap(), new);
                        model.remove(&r.base);
                        model.insert(new.base, new.end);
                    }
                }
                agrees(&ranges, &model);
            }
        }
    }
}
