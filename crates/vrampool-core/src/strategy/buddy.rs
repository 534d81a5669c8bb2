//! Binary buddy allocator: power-of-two blocks that split in halves and merge with their buddy.
//!
//! Fast and with bounded external fragmentation, at the price of up to 50% internal waste; the pool
//! uses it for large blocks, where requests tend to repeat and halves get reused.
//!
//! With `trim`, a block keeps only what was asked (rounded to the smallest block): a request
//! that is not a power of two takes the run of buddies that its size spells in binary (a 160 MiB
//! request: a 128 MiB buddy and the 32 MiB one after it), either where such a run is free or at the
//! start of a power-of-two block whose unused tail goes back at once as smaller free buddies.
//! Freeing it frees each buddy of the run, and they merge as buddies do. Segments are then cut to
//! the request too (its size in whole 2 MiB units), so a large tensor costs at most a unit more
//! than its size, where plain buddy blocks cost up to twice it. A wholly free segment takes only a
//! request it fits closely (as a dedicated segment does): one much larger stays wholly free, so
//! that the pool can give it back, rather than being cut into pieces that keep it reserved.

use std::collections::{BTreeMap, BTreeSet};

use super::addr_map::AddrMap;
use super::bit_tree::BitTree;
use super::{Block, BlockInfo, Segment, Strategy, Usage};
use crate::sizes::{round_up, MIB, MIN_BLOCK};

/// Orders (log2 of block sizes) the buddy works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuddyConfig {
    /// The smallest block, 2^min_order bytes (9 = 512 B).
    pub min_order: u32,
    /// The largest block split out of a segment, 2^max_order bytes (30 = 1 GiB); larger requests
    /// get a dedicated segment served whole.
    pub max_order: u32,
    /// The smallest segment asked of the device, 2^min_segment_order bytes (21 = 2 MiB).
    pub min_segment_order: u32,
    /// Blocks and segments cut to the request, tails given back as smaller buddies (see the
    /// module's documentation); off, every block is a power of two.
    pub trim: bool,
}

impl Default for BuddyConfig {
    fn default() -> Self {
        Self { min_order: 9, max_order: 30, min_segment_order: 21, trim: false }
    }
}

/// Dedicated segments (requests above 2^max_order) are rounded up to this, as the device's
/// allocation granularity usually is.
const DEDICATED_ROUNDING: u64 = 2 * MIB;

/// Orders are kept in [9, 62]: blocks stay 512-aligned and 2^(order + 1) never overflows.
const LOWEST_ORDER: u32 = MIN_BLOCK.trailing_zeros();
const HIGHEST_ORDER: u32 = 62;

/// A block splits at most this many times (max_order <= min_order + 26), which keeps a segment's
/// free bitmaps under 2^27 bits (16 MiB of host memory for a 32 GiB segment of 512 B blocks).
const MAX_SPLITS: u32 = 26;

/// `Live::slot` of a block that is a whole dedicated segment.
const DEDICATED: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Live {
    size: u64,
    /// The segment's slot, or DEDICATED.
    slot: u32,
    order: u32,
}

/// A segment split into buddies.
struct BuddySegment {
    base: u64,
    size: u64,
    /// `free[k - min_order]`: positions p (offset p * 2^k) of the free blocks of order k, for
    /// every order up to the segment's largest piece. Design: a bitmap per order and segment makes
    /// "is my buddy free" one bit test and "lowest free block" a few word scans, with no hashing
    /// or tree node per block; it costs 2 bits of host memory per 2^min_order bytes of segment
    /// (512 KiB per GiB at 512 B, far less where min_order is larger).
    free: Vec<BitTree>,
    /// Blocks handed out from it.
    live: u32,
}

pub struct Buddy {
    min_order: u32,
    max_order: u32,
    min_segment_order: u32,
    trim: bool,
    /// Buddy segments by slot; slots of released segments are reused.
    slots: Vec<Option<BuddySegment>>,
    spare_slots: Vec<u32>,
    /// `with_free[k - min_order]`: the slots of segments with a free block of order k.
    /// Design: allocate takes the lowest such slot, then the lowest address in it, so blocks
    /// pack into the oldest segments and newer ones can empty out for `release_free_segments`.
    with_free: Vec<BitTree>,
    /// Bit i set when `with_free[i]` is non-empty: the smallest fitting order is one
    /// `trailing_zeros`.
    nonempty: u64,
    /// Live blocks by address (the only way `free` accepts an address: bogus ones change nothing).
    live: AddrMap<Live>,
    /// Every segment held, base -> (size, slot or DEDICATED); a size above 2^max_order marks a
    /// dedicated segment.
    segments: BTreeMap<u64, (u64, u32)>,
    /// Free dedicated segments as (size, base), for a best-fit pick among them.
    dedicated_free: BTreeSet<(u64, u64)>,
    reserved: u64,
    allocated: u64,
}

impl Default for Buddy {
    fn default() -> Self {
        Self::new(BuddyConfig::default())
    }
}

impl Buddy {
    /// Orders out of range are clamped: min_order to [9, 62], max_order to
    /// [min_order, min(62, min_order + 26)], min_segment_order to [min_order, max_order].
    pub fn new(config: BuddyConfig) -> Self {
        let min_order = config.min_order.clamp(LOWEST_ORDER, HIGHEST_ORDER);
        let max_order = config.max_order.clamp(min_order, HIGHEST_ORDER.min(min_order + MAX_SPLITS));
        let min_segment_order = config.min_segment_order.clamp(min_order, max_order);
        Self {
            min_order,
            max_order,
            min_segment_order,
            trim: config.trim,
            slots: Vec::new(),
            spare_slots: Vec::new(),
            with_free: (min_order..=max_order).map(|_| BitTree::new(0)).collect(),
            nonempty: 0,
            live: AddrMap::default(),
            segments: BTreeMap::new(),
            dedicated_free: BTreeSet::new(),
            reserved: 0,
            allocated: 0,
        }
    }

    pub fn config(&self) -> BuddyConfig {
        BuddyConfig { min_order: self.min_order, max_order: self.max_order, min_segment_order: self.min_segment_order, trim: self.trim }
    }

    fn max_block(&self) -> u64 {
        1 << self.max_order
    }

    fn is_dedicated(&self, segment_size: u64) -> bool {
        segment_size > self.max_block()
    }

    /// Marks block `pos` of order `min_order + i` in `slot` free.
    fn put_free(&mut self, slot: u32, i: u32, pos: u64) {
        let Some(Some(seg)) = self.slots.get_mut(slot as usize) else { return };
        let Some(set) = seg.free.get_mut(i as usize) else { return };
        let was_empty = set.is_empty();
        set.insert(pos as usize);
        if was_empty {
            self.with_free[i as usize].insert(slot as usize);
            self.nonempty |= 1 << i;
        }
    }

    /// Takes block `pos` of order `min_order + i` in `slot` if it is free.
    fn take_free(&mut self, slot: u32, i: u32, pos: u64) -> bool {
        let Some(Some(seg)) = self.slots.get_mut(slot as usize) else { return false };
        let Some(set) = seg.free.get_mut(i as usize) else { return false };
        if !set.remove(pos as usize) {
            return false;
        }
        if set.is_empty() {
            let segs = &mut self.with_free[i as usize];
            segs.remove(slot as usize);
            if segs.is_empty() {
                self.nonempty &= !(1 << i);
            }
        }
        true
    }

    /// The maximal power-of-two pieces of a segment of at most 2^max_order bytes, largest first,
    /// as (offset, order); each piece is aligned to its size relative to the base, and merging
    /// rebuilds exactly these pieces. A tail below 2^min_order (never with sizes from
    /// `segment_size_for`) is unusable; `snapshot` lists it as free.
    fn pieces(&self, size: u64) -> impl Iterator<Item = (u64, u32)> {
        let usable = self.usable(size);
        let mut offset = 0u64;
        std::iter::from_fn(move || {
            let rest = usable - offset;
            if rest == 0 {
                return None;
            }
            let order = 63 - rest.leading_zeros();
            let piece = (offset, order);
            offset += 1 << order;
            Some(piece)
        })
    }

    fn usable(&self, size: u64) -> u64 {
        size & !((1u64 << self.min_order) - 1)
    }

    fn allocate_dedicated(&mut self, size: u64) -> Option<Block> {
        // Design: a free dedicated segment is reused for a request it fits with at most 1/8 (plus
        // the 2 MiB rounding) to spare; a much larger one would waste more than a fresh segment,
        // and the pool frees cached segments and retries before it reports out of memory.
        let &(seg_size, base) = self.dedicated_free.range((size, 0)..).next()?;
        if seg_size - size > size / 8 + DEDICATED_ROUNDING {
            return None;
        }
        self.dedicated_free.remove(&(seg_size, base));
        self.live.insert(base, Live { size: seg_size, slot: DEDICATED, order: 0 });
        self.allocated += seg_size;
        Some(Block { addr: base, size: seg_size })
    }

    fn add_buddy_segment(&mut self, base: u64, size: u64) -> u32 {
        let usable = self.usable(size);
        let top = 63 - usable.leading_zeros(); // the largest piece's order
        let free = (self.min_order..=top).map(|k| BitTree::new((usable >> k) as usize)).collect();
        let seg = BuddySegment { base, size, free, live: 0 };
        let slot = match self.spare_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(seg);
                slot
            }
            None => {
                self.slots.push(Some(seg));
                for set in &mut self.with_free {
                    set.grow(self.slots.len());
                }
                (self.slots.len() - 1) as u32
            }
        };
        let pieces: Vec<_> = self.pieces(size).collect();
        for (offset, order) in pieces {
            self.put_free(slot, order - self.min_order, offset >> order);
        }
        slot
    }

    /// Whether the segment at `base` (of `size` bytes, in `slot`) holds no block.
    fn wholly_free(&self, base: u64, size: u64, slot: u32) -> bool {
        if slot == DEDICATED {
            return self.dedicated_free.contains(&(size, base));
        }
        let Some(Some(seg)) = self.slots.get(slot as usize) else { return false };
        self.pieces(size).all(|(offset, order)| seg.free[(order - self.min_order) as usize].contains((offset >> order) as usize))
    }

    /// Takes the lowest free block of at least order `order` (lowest slot, then lowest address)
    /// of a segment that welcomes a block of `exact` bytes, and splits it down to `order`, keeping
    /// the lower half each time: (slot, base, offset).
    fn take_block(&mut self, order: u32, exact: u64) -> Option<(u32, u64, u64)> {
        let want = order - self.min_order;
        let mut fitting = self.nonempty >> want;
        let (from, slot) = loop {
            if fitting == 0 {
                return None;
            }
            let from = want + fitting.trailing_zeros();
            let slot = if self.trim {
                self.with_free[from as usize].iter().find(|&slot| self.welcomes(slot as u32, exact))
            } else {
                self.with_free[from as usize].first()
            };
            if let Some(slot) = slot {
                break (from, slot as u32);
            }
            fitting &= fitting - 1;
        };
        let seg = self.slots.get(slot as usize)?.as_ref()?;
        let (base, pos) = (seg.base, seg.free.get(from as usize)?.first()? as u64);
        self.take_free(slot, from, pos);
        let offset = pos << (from + self.min_order);
        // Split: keep the lower half, mark each upper half free at its order.
        for i in (want..from).rev() {
            self.put_free(slot, i, (offset >> (i + self.min_order)) | 1);
        }
        Some((slot, base, offset))
    }

    /// Whether segment `slot` may take a block of `exact` bytes: a segment in use may, a wholly
    /// free one only if the block fills it to within an eighth (and the 2 MiB rounding), as a
    /// dedicated segment is reused.
    fn welcomes(&self, slot: u32, exact: u64) -> bool {
        let Some(Some(seg)) = self.slots.get(slot as usize) else { return false };
        seg.live > 0 || seg.size - exact.min(seg.size) <= exact / 8 + DEDICATED_ROUNDING
    }

    /// Counts a block handed out from segment `slot` (or given back, with `by` -1).
    fn count_live(&mut self, slot: u32, by: i32) {
        if let Some(Some(seg)) = self.slots.get_mut(slot as usize) {
            seg.live = seg.live.saturating_add_signed(by);
        }
    }

    /// Frees block `offset` of `order` in `slot`, merging upwards while its buddy lies inside the
    /// segment and is free at the same order. Free bits are per segment, so a merge never reaches
    /// into a segment that happens to be adjacent in address space.
    fn release(&mut self, slot: u32, mut offset: u64, mut order: u32) {
        let Some(Some(seg)) = self.slots.get(slot as usize) else { return };
        let seg_size = seg.size;
        while order < self.max_order {
            let block = 1u64 << order;
            let buddy = offset ^ block;
            if buddy + block > seg_size || !self.take_free(slot, order - self.min_order, buddy >> order) {
                break;
            }
            offset &= !block;
            order += 1;
        }
        self.put_free(slot, order - self.min_order, offset >> order);
    }

    /// The free block of `slot` that holds block `offset` of `order`, as (order, position).
    fn containing(&self, slot: u32, offset: u64, order: u32) -> Option<(u32, u64)> {
        let seg = self.slots.get(slot as usize)?.as_ref()?;
        (order..self.min_order + seg.free.len() as u32)
            .map(|k| (k, offset >> k))
            .find(|&(k, pos)| seg.free[(k - self.min_order) as usize].contains(pos as usize))
    }

    /// Takes block `offset` of `order` out of the free block that holds it, splitting that block
    /// down to it: the halves that do not hold it stay free.
    fn carve(&mut self, slot: u32, offset: u64, order: u32) -> bool {
        let Some((k, pos)) = self.containing(slot, offset, order) else { return false };
        self.take_free(slot, k - self.min_order, pos);
        for i in (order..k).rev() {
            self.put_free(slot, i - self.min_order, (offset >> i) ^ 1);
        }
        true
    }

    /// A trimmed block of `exact` bytes (a multiple of the smallest block, not a power of two):
    /// a free run of buddies spelling its size, else the start of a larger power-of-two block
    /// whose tail goes back free.
    fn allocate_trimmed(&mut self, exact: u64) -> Option<Block> {
        let high = 63 - exact.leading_zeros();
        let (slot, base, offset) = match self.take_run(high, exact) {
            Some(found) => found,
            None => {
                let (slot, base, offset) = self.take_block(high + 1, exact)?;
                for (piece, order) in pieces_of(offset + exact, offset + (1 << (high + 1))) {
                    self.put_free(slot, order - self.min_order, piece >> order);
                }
                (slot, base, offset)
            }
        };
        self.live.insert(base + offset, Live { size: exact, slot, order: high + 1 });
        self.count_live(slot, 1);
        self.allocated += exact;
        Some(Block { addr: base + offset, size: exact })
    }

    /// A free block of order `high` (the run's head) followed by free memory for the rest of
    /// `exact` bytes, carved out: (slot, base, offset). Every free block of that order is a
    /// candidate (a large tier holds few), so a segment just added for the request is found.
    fn take_run(&mut self, high: u32, exact: u64) -> Option<(u32, u64, u64)> {
        let level = (high - self.min_order) as usize;
        let heads: Vec<(u32, u64)> = self.with_free[level]
            .iter()
            .flat_map(|slot| {
                let seg = self.slots[slot].as_ref().expect("a slot with free blocks holds a segment");
                seg.free[level].iter().map(move |pos| (slot as u32, pos as u64))
            })
            .collect();
        let (slot, head) = heads.into_iter().find(|&(slot, pos)| {
            if !self.welcomes(slot, exact) {
                return false;
            }
            let start = pos << high;
            let Some(Some(seg)) = self.slots.get(slot as usize) else { return false };
            start + exact <= self.usable(seg.size)
                && pieces_of(start + (1 << high), start + exact).all(|(piece, order)| self.containing(slot, piece, order).is_some())
        })?;
        let offset = head << high;
        self.take_free(slot, high - self.min_order, head);
        for (piece, order) in pieces_of(offset + (1 << high), offset + exact) {
            let carved = self.carve(slot, piece, order);
            debug_assert!(carved, "the run was checked free");
        }
        let base = self.slots[slot as usize].as_ref()?.base;
        Some((slot, base, offset))
    }
}

impl Strategy for Buddy {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn segment_size_for(&self, size: u64) -> u64 {
        if size > self.max_block() {
            // Saturates instead of overflowing; a segment that large fails at the device.
            return round_up(size, DEDICATED_ROUNDING).unwrap_or(!(DEDICATED_ROUNDING - 1));
        }
        if self.trim {
            let unit = DEDICATED_ROUNDING.max(1 << self.min_order);
            return round_up(size.max(1), unit).unwrap_or(self.max_block()).clamp(1 << self.min_segment_order, self.max_block());
        }
        size.max(1).next_power_of_two().clamp(1 << self.min_segment_order, self.max_block())
    }

    fn add_segment(&mut self, segment: Segment) {
        let Segment { base, size } = segment;
        // A segment that is empty, wraps around, overlaps one held or is below the smallest
        // block is ignored: taking it would corrupt the address bookkeeping or serve nothing.
        let Some(end) = base.checked_add(size) else { return };
        if size < 1 << self.min_order || self.segments.range(..end).next_back().is_some_and(|(&b, &(s, _))| b + s > base) {
            return;
        }
        self.reserved += size;
        if self.is_dedicated(size) {
            self.segments.insert(base, (size, DEDICATED));
            self.dedicated_free.insert((size, base));
        } else {
            let slot = self.add_buddy_segment(base, size);
            self.segments.insert(base, (size, slot));
        }
    }

    fn allocate(&mut self, size: u64) -> Option<Block> {
        let size = size.max(1);
        if size > self.max_block() {
            return self.allocate_dedicated(size);
        }
        if self.trim {
            let exact = round_up(size, 1 << self.min_order)?;
            if !exact.is_power_of_two() {
                return self.allocate_trimmed(exact);
            }
        }
        let order = size.next_power_of_two().trailing_zeros().max(self.min_order);
        let block_size = 1u64 << order;
        let (slot, base, offset) = self.take_block(order, block_size)?;
        self.live.insert(base + offset, Live { size: block_size, slot, order });
        self.count_live(slot, 1);
        self.allocated += block_size;
        Some(Block { addr: base + offset, size: block_size })
    }

    fn free(&mut self, addr: u64) -> Option<u64> {
        let Live { size, slot, order } = self.live.remove(&addr)?;
        self.allocated -= size;
        if slot == DEDICATED {
            self.dedicated_free.insert((size, addr));
            return Some(size);
        }
        let Some(Some(seg)) = self.slots.get(slot as usize) else { return Some(size) };
        let offset = addr - seg.base;
        self.count_live(slot, -1);
        if size.is_power_of_two() {
            self.release(slot, offset, order);
        } else {
            // A trimmed block: each buddy of its run goes back and merges.
            for (piece, piece_order) in pieces_of(offset, offset + size) {
                self.release(slot, piece, piece_order);
            }
        }
        Some(size)
    }

    fn free_segments(&self) -> Vec<Segment> {
        self.segments
            .iter()
            .filter(|&(&base, &(size, slot))| self.wholly_free(base, size, slot))
            .map(|(&base, &(size, _))| Segment { base, size })
            .collect()
    }

    fn release_segments(&mut self, segments: &[Segment]) -> Vec<Segment> {
        let mut released = Vec::new();
        for &seg in segments {
            let Some(&(size, slot)) = self.segments.get(&seg.base) else { continue };
            if size != seg.size || !self.wholly_free(seg.base, size, slot) {
                continue;
            }
            self.segments.remove(&seg.base);
            self.reserved -= size;
            released.push(seg);
            if slot == DEDICATED {
                self.dedicated_free.remove(&(size, seg.base));
                continue;
            }
            let pieces: Vec<_> = self.pieces(size).collect();
            for (offset, order) in pieces {
                self.take_free(slot, order - self.min_order, offset >> order);
            }
            self.slots[slot as usize] = None;
            self.spare_slots.push(slot);
        }
        released
    }

    fn usage(&self) -> Usage {
        let largest_block = match self.nonempty {
            0 => 0,
            bits => 1u64 << (63 - bits.leading_zeros() + self.min_order),
        };
        let largest_dedicated = self.dedicated_free.last().map_or(0, |&(size, _)| size);
        Usage {
            reserved: self.reserved,
            allocated: self.allocated,
            largest_free: largest_block.max(largest_dedicated),
            segments: self.segments.len() as u64,
            live_blocks: self.live.len() as u64,
        }
    }

    fn snapshot(&self) -> Vec<(Segment, Vec<BlockInfo>)> {
        let mut blocks: Vec<BlockInfo> = self.live.iter().map(|(&addr, l)| BlockInfo { addr, size: l.size, allocated: true }).collect();
        for seg in self.slots.iter().flatten() {
            for (i, set) in seg.free.iter().enumerate() {
                let order = i as u32 + self.min_order;
                blocks.extend(set.iter().map(|pos| BlockInfo {
                    addr: seg.base + ((pos as u64) << order),
                    size: 1 << order,
                    allocated: false,
                }));
            }
        }
        blocks.extend(self.dedicated_free.iter().map(|&(size, addr)| BlockInfo { addr, size, allocated: false }));
        blocks.sort_unstable_by_key(|b| b.addr);
        let mut blocks = blocks.into_iter().peekable();
        self.segments
            .iter()
            .map(|(&base, &(size, slot))| {
                let mut list = Vec::new();
                while let Some(b) = blocks.next_if(|b| b.addr < base + size) {
                    list.push(b);
                }
                let usable = if slot == DEDICATED { size } else { self.usable(size) };
                if usable < size {
                    list.push(BlockInfo { addr: base + usable, size: size - usable, allocated: false });
                }
                (Segment { base, size }, list)
            })
            .collect()
    }
}

/// The aligned power-of-two blocks that tile `[from, to)`, in address order, each the largest
/// that starts where the last ended (offsets from the segment's base, multiples of the smallest
/// block): the binary spelling of a run, or a tail.
fn pieces_of(from: u64, to: u64) -> impl Iterator<Item = (u64, u32)> {
    let mut at = from;
    std::iter::from_fn(move || {
        if at >= to {
            return None;
        }
        let order = at.trailing_zeros().min(63 - (to - at).leading_zeros());
        let piece = (at, order);
        at += 1 << order;
        Some(piece)
    })
}

#[cfg(test)]
mod tests;
