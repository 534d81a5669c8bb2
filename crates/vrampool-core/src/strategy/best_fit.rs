//! Coalescing best fit, as in PyTorch's caching allocator and RMM's pool: a block is cut from the
//! smallest free range that holds it, and a freed block merges with its free neighbours.

use std::collections::BTreeMap;

use super::addr_map::AddrMap;
use super::{Block, BlockInfo, GrowthPlan, Segment, Strategy, Usage};
use crate::sizes::{round_up, MIB, MIN_BLOCK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BestFitConfig {
    /// A free range is split only when what is left is at least this many bytes; otherwise the
    /// whole range is handed out (the block's size is then the range's size).
    pub min_split_remainder: u64,
}

impl Default for BestFitConfig {
    fn default() -> Self {
        Self { min_split_remainder: MIN_BLOCK }
    }
}

/// No neighbour / no node.
const NIL: u32 = u32::MAX;

/// Free ranges are filed in size bins, TLSF-style: one bin per 512 B below 8 KiB, then 16 bins per
/// power of two (a bin's sizes differ by less than 1/16). Design: bins are intrusive lists over
/// the node arena with a bitmap of non-empty bins, so filing, unfiling and finding the next
/// non-empty bin are O(1) (an alloc+free pair measured 50-90 ns, against 150-220 ns with a
/// `BTreeMap<(size, addr)>`); exact best fit comes from scanning the one or two bins searched, or
/// from a crowded bin's index.
const LINEAR_BINS: usize = 16;
const SUB_BINS_LOG2: u32 = 4;
const BINS: usize = LINEAR_BINS + (64 - 9 - SUB_BINS_LOG2 as usize) * (1 << SUB_BINS_LOG2);
const BITMAP_WORDS: usize = BINS.div_ceil(64);

/// Design: a bin is scanned whole up to this many ranges. A scan that meets more makes the bin
/// crowded: its ranges are also ordered by (size, address) in `crowded`, where its best fit is
/// one lookup, so a bin of thousands of ranges costs O(log n), as a tree does, and the fit stays
/// exact. A bin stops being crowded when it falls to half as many (so a bin at the edge does not
/// move in and out at every call). Bins that are not crowded are not counted: filing pays one
/// test.
const SCAN_LIMIT: u32 = 32;

/// The bin of a free range of `size` bytes (< 512 goes to bin 0, which no request searches).
fn bin_of(size: u64) -> usize {
    let units = size / MIN_BLOCK;
    if units < LINEAR_BINS as u64 {
        return units as usize;
    }
    let log = 63 - units.leading_zeros(); // >= 4
    let sub = (units >> (log - SUB_BINS_LOG2)) & ((1 << SUB_BINS_LOG2) - 1);
    LINEAR_BINS + ((log - SUB_BINS_LOG2) << SUB_BINS_LOG2) as usize + sub as usize
}

/// One block or free range. Design: each segment is a doubly linked list of nodes in address
/// order (PyTorch's `Block::prev/next`), so merging a freed block with its neighbours is O(1) and
/// never crosses a segment (a segment's first and last nodes have no neighbour beyond it), even
/// when two segments are adjacent in address space.
#[derive(Debug, Clone, Copy)]
struct Node {
    addr: u64,
    size: u64,
    /// Neighbours in address order within the segment.
    prev: u32,
    next: u32,
    /// Neighbours in the free range's bin list (unused while allocated).
    bin_prev: u32,
    bin_next: u32,
    allocated: bool,
}

pub struct BestFit {
    min_split_remainder: u64,
    /// Node arena; `spare` lists the unused slots.
    nodes: Vec<Node>,
    spare: Vec<u32>,
    /// First free range of each bin, and a bitmap of the non-empty bins with a summary word of
    /// the non-empty bitmap words.
    bin_heads: Vec<u32>,
    bitmap: [u64; BITMAP_WORDS],
    summary: u64,
    /// Free ranges in each crowded bin; 0 for the others.
    crowded_counts: Vec<u32>,
    /// The free ranges of the crowded bins: (size, address) -> node.
    crowded: BTreeMap<(u64, u64), u32>,
    /// Live blocks by address -> node.
    live: AddrMap<u32>,
    /// Segments by base -> (size, first node). The first node keeps its slot for the segment's
    /// life: splitting hands out the low part in place, merging keeps the lower node.
    segments: BTreeMap<u64, (u64, u32)>,
    /// Expandable segments: base -> end marker. Design: the marker is a zero-size node that
    /// looks allocated, so nothing merges past the end and its `prev` is always the segment's last
    /// node; the splits and merges of the hot paths keep that link up to date at no extra cost,
    /// so growing and trimming find the tail in O(1).
    ends: BTreeMap<u64, u32>,
    /// Unmapped holes inside expandable segments: address -> node. A hole looks allocated but is
    /// in neither `live` nor a bin, so no block is cut from it and no free range merges into it.
    holes: BTreeMap<u64, u32>,
    /// Bytes of the segments, less their holes.
    reserved: u64,
    allocated: u64,
}

impl Default for BestFit {
    fn default() -> Self {
        Self::new(BestFitConfig::default())
    }
}

impl BestFit {
    /// `min_split_remainder` below 512 acts as 512: no range is smaller than the smallest block.
    pub fn new(config: BestFitConfig) -> Self {
        Self {
            min_split_remainder: config.min_split_remainder.max(MIN_BLOCK),
            nodes: Vec::new(),
            spare: Vec::new(),
            bin_heads: vec![NIL; BINS],
            bitmap: [0; BITMAP_WORDS],
            summary: 0,
            crowded_counts: vec![0; BINS],
            crowded: BTreeMap::new(),
            live: AddrMap::default(),
            segments: BTreeMap::new(),
            ends: BTreeMap::new(),
            holes: BTreeMap::new(),
            reserved: 0,
            allocated: 0,
        }
    }

    pub fn config(&self) -> BestFitConfig {
        BestFitConfig { min_split_remainder: self.min_split_remainder }
    }

    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn node(&self, i: u32) -> &Node {
        &self.nodes[i as usize]
    }

    fn node_mut(&mut self, i: u32) -> &mut Node {
        &mut self.nodes[i as usize]
    }

    /// Files free node `i` at the front of its bin.
    fn file(&mut self, i: u32) {
        let size = self.node(i).size;
        let bin = bin_of(size);
        let head = self.bin_heads[bin];
        let node = self.node_mut(i);
        node.bin_prev = NIL;
        node.bin_next = head;
        if head != NIL {
            self.node_mut(head).bin_prev = i;
        }
        self.bin_heads[bin] = i;
        self.bitmap[bin / 64] |= 1 << (bin % 64);
        self.summary |= 1 << (bin / 64);
        if self.is_crowded(bin) {
            self.index(bin, i);
        }
    }

    /// Takes free node `i` out of its bin.
    fn unfile(&mut self, i: u32) {
        let Node { size, bin_prev, bin_next, .. } = *self.node(i);
        let bin = bin_of(size);
        if bin_next != NIL {
            self.node_mut(bin_next).bin_prev = bin_prev;
        }
        if bin_prev != NIL {
            self.node_mut(bin_prev).bin_next = bin_next;
        } else {
            self.bin_heads[bin] = bin_next;
            if bin_next == NIL {
                self.bitmap[bin / 64] &= !(1 << (bin % 64));
                if self.bitmap[bin / 64] == 0 {
                    self.summary &= !(1 << (bin / 64));
                }
            }
        }
        if self.is_crowded(bin) {
            self.unindex(bin, i);
        }
    }

    /// Enters node `i`, just filed in crowded `bin`, in `crowded`.
    #[cold]
    fn index(&mut self, bin: usize, i: u32) {
        let Node { addr, size, .. } = *self.node(i);
        self.crowded.insert((size, addr), i);
        self.crowded_counts[bin] += 1;
    }

    /// Takes node `i`, just unfiled from crowded `bin`, out of `crowded`; a bin that falls to
    /// half the scan limit stops being crowded.
    #[cold]
    fn unindex(&mut self, bin: usize, i: u32) {
        let Node { addr, size, .. } = *self.node(i);
        self.crowded.remove(&(size, addr));
        self.crowded_counts[bin] -= 1;
        if self.crowded_counts[bin] > SCAN_LIMIT / 2 {
            return;
        }
        self.crowded_counts[bin] = 0;
        let mut j = self.bin_heads[bin];
        while j != NIL {
            let Node { addr, size, bin_next, .. } = *self.node(j);
            self.crowded.remove(&(size, addr));
            j = bin_next;
        }
    }

    /// (No bin is crowded while the index is empty: the common case tests one word.)
    #[inline(always)]
    fn is_crowded(&self, bin: usize) -> bool {
        !self.crowded.is_empty() && self.crowded_counts[bin] != 0
    }

    /// Makes `bin` crowded: enters all its ranges in `crowded`.
    #[cold]
    fn crowd(&mut self, bin: usize) {
        let mut j = self.bin_heads[bin];
        while j != NIL {
            let Node { addr, size, bin_next, .. } = *self.node(j);
            self.crowded.insert((size, addr), j);
            self.crowded_counts[bin] += 1;
            j = bin_next;
        }
    }

    /// The first non-empty bin at or after `bin`.
    fn next_bin(&self, bin: usize) -> Option<usize> {
        let word = bin / 64;
        let bits = self.bitmap.get(word)? & (u64::MAX << (bin % 64));
        if bits != 0 {
            return Some(word * 64 + bits.trailing_zeros() as usize);
        }
        let words = self.summary & (u64::MAX << word << 1);
        if words == 0 {
            return None;
        }
        let word = words.trailing_zeros() as usize;
        Some(word * 64 + self.bitmap[word].trailing_zeros() as usize)
    }

    /// Every free range, bin by bin.
    fn free_nodes(&self) -> impl Iterator<Item = u32> + '_ {
        self.free_nodes_from(0)
    }

    /// The free ranges of bin `first` and the bins above it, bin by bin.
    fn free_nodes_from(&self, first: usize) -> impl Iterator<Item = u32> + '_ {
        let mut bin = self.next_bin(first);
        let mut i = bin.map_or(NIL, |b| self.bin_heads[b]);
        std::iter::from_fn(move || {
            while i == NIL {
                bin = self.next_bin(bin? + 1);
                i = self.bin_heads[bin?];
            }
            let found = i;
            i = self.node(found).bin_next;
            Some(found)
        })
    }

    /// The smallest range of `bin` of at least `size` bytes. A bin with more ranges than a scan
    /// looks at is crowded from then on, and asks the index.
    #[inline(always)]
    fn best_in_bin(&mut self, bin: usize, size: u64) -> Option<u32> {
        if self.is_crowded(bin) {
            return self.best_in_crowded(bin, size);
        }
        let (mut best, mut best_size) = (NIL, u64::MAX);
        let mut i = self.bin_heads[bin];
        for _ in 0..SCAN_LIMIT {
            if i == NIL {
                return (best != NIL).then_some(best);
            }
            let node = self.node(i);
            if node.size >= size && node.size < best_size {
                if node.size == size {
                    return Some(i);
                }
                (best, best_size) = (i, node.size);
            }
            i = node.bin_next;
        }
        if i == NIL {
            return (best != NIL).then_some(best);
        }
        self.crowd(bin);
        self.best_in_crowded(bin, size)
    }

    #[cold]
    fn best_in_crowded(&self, bin: usize, size: u64) -> Option<u32> {
        let (&(found, _), &i) = self.crowded.range((size, 0)..).next()?;
        (bin_of(found) == bin).then_some(i)
    }

    /// Best fit: the request's own bin holds ranges both smaller and larger than it, so it is
    /// searched first; failing that, every range of the next non-empty bin fits.
    fn find(&mut self, size: u64) -> Option<u32> {
        let bin = bin_of(size);
        if let Some(i) = self.best_in_bin(bin, size) {
            return Some(i);
        }
        let bin = self.next_bin(bin + 1)?;
        self.best_in_bin(bin, size)
    }

    /// Turns `[lo, hi)` of free node `i` into a hole, merged with neighbouring holes; the rest of
    /// `i` stays free (`i` keeps the lowest part, so a segment's head node keeps its slot).
    /// Returns the hole's node.
    fn make_hole(&mut self, i: u32, lo: u64, hi: u64) -> u32 {
        let Node { addr, size, .. } = *self.node(i);
        self.unfile(i);
        let mut hole = if lo > addr {
            self.node_mut(i).size = lo - addr;
            self.file(i);
            self.insert_after(i, lo, hi - lo, true)
        } else {
            let n = self.node_mut(i);
            n.size = hi - lo;
            n.allocated = true;
            i
        };
        if hi < addr + size {
            let rest = self.insert_after(hole, hi, addr + size - hi, false);
            self.file(rest);
        }
        self.reserved -= hi - lo;
        let prev = self.node(hole).prev;
        if self.is_hole(prev) {
            self.absorb_next(prev, hole);
            hole = prev;
        }
        let next = self.node(hole).next;
        if self.is_hole(next) {
            let next_addr = self.node(next).addr;
            self.holes.remove(&next_addr);
            self.absorb_next(hole, next);
        }
        self.holes.insert(self.node(hole).addr, hole);
        hole
    }

    /// A new node `[addr, addr + size)` linked in right after node `a`.
    fn insert_after(&mut self, a: u32, addr: u64, size: u64, allocated: bool) -> u32 {
        let next = self.node(a).next;
        let i = self.new_node(Node { addr, size, prev: a, next, bin_prev: NIL, bin_next: NIL, allocated });
        self.node_mut(a).next = i;
        if next != NIL {
            self.node_mut(next).prev = i;
        }
        i
    }

    fn is_hole(&self, i: u32) -> bool {
        i != NIL && self.node(i).allocated && self.holes.get(&self.node(i).addr) == Some(&i)
    }

    /// The size of node `i` if it is a free range, else 0.
    fn free_size(&self, i: u32) -> u64 {
        match i {
            NIL => 0,
            i if self.node(i).allocated => 0,
            i => self.node(i).size,
        }
    }

    /// Appends node `b` (just after `a` in address order) to `a` and drops `b`.
    fn absorb_next(&mut self, a: u32, b: u32) {
        let Node { size, next, .. } = *self.node(b);
        let node = self.node_mut(a);
        node.size += size;
        node.next = next;
        if next != NIL {
            self.node_mut(next).prev = a;
        }
        self.spare.push(b);
    }
}

impl Strategy for BestFit {
    fn name(&self) -> &'static str {
        "best_fit"
    }

    fn segment_size_for(&self, size: u64) -> u64 {
        // Small blocks share 2 MiB segments (PyTorch's choice); a mid-size block gets room for one
        // more of its size, not PyTorch's 20 MiB, so that a segment left partly used at the peak
        // strands less; large ones get a segment of their own size (rounded to 2 MiB, the usual
        // granularity).
        if size <= MIB {
            2 * MIB
        } else if size < 10 * MIB {
            round_up(2 * size, 2 * MIB).unwrap_or(20 * MIB)
        } else {
            round_up(size, 2 * MIB).unwrap_or(!(2 * MIB - 1))
        }
    }

    fn add_segment(&mut self, segment: Segment) {
        let Segment { base, size } = segment;
        // A segment that is empty, wraps around or overlaps one held is ignored: taking it would
        // corrupt the address bookkeeping.
        let Some(end) = base.checked_add(size) else { return };
        if size == 0 || self.segments.range(..end).next_back().is_some_and(|(&b, &(s, _))| b + s > base) {
            return;
        }
        let head = self.new_node(Node { addr: base, size, prev: NIL, next: NIL, bin_prev: NIL, bin_next: NIL, allocated: false });
        self.segments.insert(base, (size, head));
        self.file(head);
        self.reserved += size;
    }

    fn allocate(&mut self, size: u64) -> Option<Block> {
        let size = round_up(size.max(1), MIN_BLOCK)?;
        let i = self.find(size)?;
        self.unfile(i);
        let Node { addr, size: range_size, next, .. } = *self.node(i);
        let rest = range_size - size;
        if rest >= self.min_split_remainder {
            // Hand out the low part in place; the rest becomes a free node right after it.
            let tail = self.new_node(Node { addr: addr + size, size: rest, prev: i, next, bin_prev: NIL, bin_next: NIL, allocated: false });
            if next != NIL {
                self.node_mut(next).prev = tail;
            }
            let node = self.node_mut(i);
            node.next = tail;
            node.size = size;
            self.file(tail);
        }
        let node = self.node_mut(i);
        node.allocated = true;
        let block = Block { addr, size: node.size };
        self.live.insert(addr, i);
        self.allocated += block.size;
        Some(block)
    }

    fn free(&mut self, addr: u64) -> Option<u64> {
        let mut i = self.live.remove(&addr)?;
        let Node { size, prev, next, .. } = *self.node(i);
        self.allocated -= size;
        self.node_mut(i).allocated = false;
        if next != NIL && !self.node(next).allocated {
            self.unfile(next);
            self.absorb_next(i, next);
        }
        if prev != NIL && !self.node(prev).allocated {
            self.unfile(prev);
            self.absorb_next(prev, i);
            i = prev;
        }
        self.file(i);
        Some(size)
    }

    fn free_segments(&self) -> Vec<Segment> {
        self.segments
            .iter()
            .filter(|(_, &(_, head))| {
                let n = self.node(head);
                !n.allocated && n.next == NIL
            })
            .map(|(&base, &(size, _))| Segment { base, size })
            .collect()
    }

    fn release_segments(&mut self, segments: &[Segment]) -> Vec<Segment> {
        let mut released = Vec::new();
        for &seg in segments {
            let Some(&(size, head)) = self.segments.get(&seg.base) else { continue };
            let n = self.node(head);
            if size != seg.size || n.allocated || n.next != NIL {
                continue;
            }
            self.segments.remove(&seg.base);
            self.unfile(head);
            self.spare.push(head);
            self.reserved -= size;
            released.push(seg);
        }
        released
    }

    fn grow_segment(&mut self, base: u64, extra: u64) -> bool {
        if extra == 0 || extra % MIN_BLOCK != 0 || base % MIN_BLOCK != 0 {
            return false;
        }
        let (size, marker) = match (self.segments.get(&base), self.ends.get(&base)) {
            (None, _) => (0, NIL),
            (Some(&(size, _)), Some(&marker)) => (size, marker),
            (Some(_), None) => return false, // a plain segment does not grow
        };
        let start = base + size;
        let Some(new_end) = start.checked_add(extra) else { return false };
        // The new space must not overlap another segment (nor a new segment the one below).
        let clash = self.segments.range(..new_end).next_back().is_some_and(|(&b, &(s, _))| b != base && b + s > start);
        if clash {
            return false;
        }
        if marker == NIL {
            let free = Node { addr: base, size: extra, prev: NIL, next: NIL, bin_prev: NIL, bin_next: NIL, allocated: false };
            let head = self.new_node(free);
            let marker = self.insert_after(head, new_end, 0, true);
            self.segments.insert(base, (extra, head));
            self.ends.insert(base, marker);
            self.file(head);
        } else {
            let last = self.node(marker).prev;
            if self.node(last).allocated {
                let i = self.insert_after(last, start, extra, false);
                self.file(i);
            } else {
                self.unfile(last);
                self.node_mut(last).size += extra;
                self.file(last);
            }
            self.node_mut(marker).addr = new_end;
            if let Some(seg) = self.segments.get_mut(&base) {
                seg.0 += extra;
            }
        }
        self.reserved += extra;
        true
    }

    fn unused_ranges(&self, base: u64) -> Vec<Segment> {
        let (Some(&marker), true) = (self.ends.get(&base), self.segments.contains_key(&base)) else { return Vec::new() };
        let end = self.node(marker).addr;
        // The free ranges (from the bins) and the holes alone, not the segment's every node: a
        // growth asks this of every expandable range, and a range holds thousands of blocks
        // where it has a few free ranges.
        let free = self.free_nodes().map(|i| self.node(i)).filter(|n| (base..end).contains(&n.addr));
        let mut pieces: Vec<Segment> = free.map(|n| Segment { base: n.addr, size: n.size }).collect();
        pieces.extend(self.holes.range(base..end).map(|(&addr, &h)| Segment { base: addr, size: self.node(h).size }));
        pieces.sort_unstable_by_key(|p| p.base);
        let mut unused: Vec<Segment> = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match unused.last_mut() {
                Some(last) if last.base + last.size == piece.base => last.size += piece.size,
                _ => unused.push(piece),
            }
        }
        unused
    }

    fn free_ranges_at_least(&self, base: u64, least: u64) -> Vec<Segment> {
        let (Some(&marker), true) = (self.ends.get(&base), self.segments.contains_key(&base)) else { return Vec::new() };
        let end = self.node(marker).addr;
        // From the bins of `least` up: a growth asks this of every expandable range, where most
        // free ranges are small.
        let free = self.free_nodes_from(bin_of(least)).map(|i| self.node(i)).filter(|n| n.size >= least && (base..end).contains(&n.addr));
        let mut ranges: Vec<Segment> = free.map(|n| Segment { base: n.addr, size: n.size }).collect();
        ranges.sort_unstable_by_key(|r| r.base);
        ranges
    }

    fn unmap_free_ranges(&mut self, base: u64, ranges: &[Segment]) -> Vec<Segment> {
        let (Some(&marker), Some(&(_, head))) = (self.ends.get(&base), self.segments.get(&base)) else { return Vec::new() };
        let mut unmapped = Vec::new();
        let mut i = head;
        for &range in ranges {
            let (lo, Some(hi)) = (range.base, range.base.checked_add(range.size)) else { continue };
            if range.size == 0 || lo % MIN_BLOCK != 0 || hi % MIN_BLOCK != 0 {
                continue;
            }
            // The node that holds `lo` (ranges come in address order, so the walk goes on).
            while i != marker && self.node(i).addr + self.node(i).size <= lo {
                i = self.node(i).next;
            }
            if i == marker || self.node(i).addr > lo {
                break;
            }
            // Neighbouring free ranges are always one node: the range lies in free node `i`, or
            // a block or a hole is in the way.
            let Node { addr, size, allocated, .. } = *self.node(i);
            if allocated || addr + size < hi {
                continue;
            }
            i = self.make_hole(i, lo, hi);
            unmapped.push(range);
        }
        unmapped
    }

    fn cut_unmapped_tail(&mut self, base: u64) -> u64 {
        let (Some(&marker), Some(&(old_size, _))) = (self.ends.get(&base), self.segments.get(&base)) else { return 0 };
        let last = self.node(marker).prev;
        if !self.is_hole(last) {
            return 0;
        }
        // Neighbouring holes are one node, so there is at most one to cut.
        let Node { addr, prev, .. } = *self.node(last);
        self.holes.remove(&addr);
        if prev == NIL {
            // Nothing but a hole is left: the segment goes.
            self.segments.remove(&base);
            self.ends.remove(&base);
            self.spare.extend([last, marker]);
            return old_size;
        }
        self.node_mut(prev).next = marker;
        let m = self.node_mut(marker);
        m.prev = prev;
        m.addr = addr;
        self.spare.push(last);
        if let Some(seg) = self.segments.get_mut(&base) {
            seg.0 = addr - base;
        }
        old_size - (addr - base)
    }

    fn plan_growth(&self, base: u64, size: u64, unit: u64, cost: &dyn Fn(Segment) -> u64) -> Option<GrowthPlan> {
        let &marker = self.ends.get(&base)?;
        let size = round_up(size.max(1), MIN_BLOCK)?;
        if unit == 0 {
            return None;
        }
        // Whole units, at least one (a range that already fits but was not found still gains one).
        let units = |bytes: u64| bytes.div_ceil(unit).max(1) * unit;
        let tail = self.free_size(self.node(marker).prev);
        let at_end = units(size.saturating_sub(tail));
        let end = self.node(marker).addr;
        let mut best: Option<(u64, Segment)> = None;
        for (&addr, &h) in self.holes.range(base..end) {
            let Node { size: hole, prev, next, .. } = *self.node(h);
            let (before, after) = (self.free_size(prev), self.free_size(next));
            if before.saturating_add(hole).saturating_add(after) < size {
                continue;
            }
            // Map the hole's low part (joining the range before it), its high part (joining the
            // range after it), or all of it (joining both).
            let mut options = [None, None, Some(Segment { base: addr, size: hole })];
            if before + hole >= size && units(size.saturating_sub(before)) <= hole {
                options[0] = Some(Segment { base: addr, size: units(size.saturating_sub(before)) });
            }
            if hole + after >= size && units(size.saturating_sub(after)) <= hole {
                let n = units(size.saturating_sub(after));
                options[1] = Some(Segment { base: addr + hole - n, size: n });
            }
            // A hole is unmapped space, so each option costs its size, unless a mapping that failed
            // to go is left inside it: asked once for the whole hole, the options only then.
            let whole = options[2].expect("the whole hole");
            let unmapped = cost(whole) == hole;
            for option in options.into_iter().flatten() {
                let key = if unmapped { option.size } else { cost(option) };
                if best.is_none_or(|(best_key, b)| (key, option.size) < (best_key, b.size)) {
                    best = Some((key, option));
                }
            }
        }
        Some(GrowthPlan { tail, at_end, hole: best.map(|(_, hole)| hole) })
    }

    fn map_hole(&mut self, range: Segment) -> bool {
        let Segment { base: addr, size } = range;
        let Some((&hole_addr, &h)) = self.holes.range(..=addr).next_back() else { return false };
        let hole_end = hole_addr + self.node(h).size;
        if size == 0 || size % MIN_BLOCK != 0 || addr.checked_add(size).is_none_or(|end| end > hole_end) {
            return false;
        }
        let end = addr + size;
        // Split into hole [hole_addr, addr), free [addr, end), hole [end, hole_end).
        let mut free = if addr > hole_addr {
            self.node_mut(h).size = addr - hole_addr;
            self.insert_after(h, addr, size, false)
        } else {
            self.holes.remove(&hole_addr);
            let n = self.node_mut(h);
            n.size = size;
            n.allocated = false;
            h
        };
        if end < hole_end {
            let rest = self.insert_after(free, end, hole_end - end, true);
            self.holes.insert(end, rest);
        }
        let next = self.node(free).next;
        if next != NIL && !self.node(next).allocated {
            self.unfile(next);
            self.absorb_next(free, next);
        }
        let prev = self.node(free).prev;
        if prev != NIL && !self.node(prev).allocated {
            self.unfile(prev);
            self.absorb_next(prev, free);
            free = prev;
        }
        self.file(free);
        self.reserved += size;
        true
    }

    fn usage(&self) -> Usage {
        // The top non-empty bin holds the largest range: its last entry in `crowded` (no higher
        // bin has ranges), or else found by a scan.
        let top = (0..BITMAP_WORDS).rev().find(|&w| self.bitmap[w] != 0).map(|w| w * 64 + 63 - self.bitmap[w].leading_zeros() as usize);
        let mut largest_free = 0;
        let mut i = top.map_or(NIL, |bin| self.bin_heads[bin]);
        if top.is_some_and(|bin| self.is_crowded(bin)) {
            largest_free = self.crowded.last_key_value().map_or(0, |(&(size, _), _)| size);
            i = NIL;
        }
        while i != NIL {
            largest_free = largest_free.max(self.node(i).size);
            i = self.node(i).bin_next;
        }
        Usage {
            reserved: self.reserved,
            allocated: self.allocated,
            largest_free,
            segments: self.segments.len() as u64,
            live_blocks: self.live.len() as u64,
        }
    }

    fn snapshot(&self) -> Vec<(Segment, Vec<BlockInfo>)> {
        let mut out = Vec::with_capacity(self.segments.len());
        for (&base, &(size, head)) in &self.segments {
            // Holes split an expandable segment into its mapped runs; the end marker is skipped.
            let (mut start, mut list) = (base, Vec::new());
            let mut i = head;
            while i != NIL {
                let n = self.node(i);
                if n.allocated && !self.holes.is_empty() && self.is_hole(i) {
                    if !list.is_empty() {
                        out.push((Segment { base: start, size: n.addr - start }, std::mem::take(&mut list)));
                    }
                    start = n.addr + n.size;
                } else if n.size > 0 {
                    list.push(BlockInfo { addr: n.addr, size: n.size, allocated: n.allocated });
                }
                i = n.next;
            }
            if !list.is_empty() {
                out.push((Segment { base: start, size: base + size - start }, list));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
