//! Slab allocator for small blocks: each slab holds objects of one size class, handed out and
//! taken back in O(1); slabs are runs of any size carved out of segments by an address-ordered first fit.

use super::addr_map::AddrMap;
use super::first_fit::{FirstFit, RunKind};
use super::{Block, BlockInfo, Segment, Strategy, Usage};
use crate::sizes::{round_up, size_class_index, size_class_of, KIB, MIB, MIN_BLOCK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabConfig {
    /// The largest request served from slabs; larger ones get a block of their own.
    pub max_size: u64,
    /// The size of the segments slabs are carved from (a power of two).
    pub segment_size: u64,
}

impl Default for SlabConfig {
    fn default() -> Self {
        Self { max_size: MIB, segment_size: 2 * MIB }
    }
}

/// Design: a class of up to half this size has slabs of this size; a larger class has slabs of
/// one object, a run of exactly the class's size (jemalloc's runs, mimalloc's pages). A class
/// with few objects then holds no more than they need: with slabs of two objects rounded to a
/// power of two, the small tier of a 50 MiB training step held 16 MiB for 13 MiB of blocks (its
/// 256 KiB, 768 KiB and 1 MiB classes each kept a half-empty slab), and the first fit that carves
/// the runs merges freed ones back into whole segments.
const MIN_SLAB: u64 = 64 * KIB;

/// The largest class that shares its slabs (several objects to a 64 KiB slab); every larger block
/// is a run of its own, carved from the first fit.
pub const SHARED_SLAB_MAX: u64 = MIN_SLAB / 2;

/// Segment sizes are kept in [64 KiB, 1 TiB].
const MAX_SEGMENT: u64 = 1 << 40;

/// Not in a class's partial list.
const NIL: u32 = u32::MAX;

struct Class {
    size: u64,
    slab_size: u64,
    /// Slabs of this class with at least one free slot. Design: allocation takes the last one
    /// (O(1), and the most recently used slab is the warmest); a slab leaves the list when it
    /// fills and is swap-removed when it empties.
    partial: Vec<u32>,
}

struct SlabRec {
    base: u64,
    class: u32,
    capacity: u32,
    /// Design: slots `bump..capacity` were never handed out since the slab was carved, so a new
    /// slab needs no free list built; returned slots go on the `free_slots` stack (O(1) both ways).
    bump: u32,
    free_slots: Vec<u32>,
    /// Live objects; 0 only for a spare record (an empty slab is returned at once).
    live: u32,
    /// Position in the class's `partial` list, or NIL when the slab is full.
    partial_pos: u32,
}

pub struct Slab {
    max_size: u64,
    segment_size: u64,
    /// Carves slabs out of segments and serves runs (one-object classes, requests above
    /// `max_size`): space that any class can reuse and that merges back into whole segments for
    /// release.
    space: FirstFit,
    /// Indexed by `size_class_index`, up to the class of `max_size`.
    classes: Vec<Class>,
    /// Slab records and the indices of unused ones.
    slabs: Vec<SlabRec>,
    spare: Vec<u32>,
    /// Live objects by address -> slab: free finds its slab in one lookup, and an address that
    /// is not a live object (double free, interior pointer) is refused without touching anything.
    objects: AddrMap<u32>,
    allocated: u64,
}

impl Default for Slab {
    fn default() -> Self {
        Self::new(SlabConfig::default())
    }
}

impl Slab {
    /// `segment_size` is rounded up to a power of two in [64 KiB, 1 TiB]; `max_size` is clamped
    /// to [512, 1 TiB]. A `max_size` above the segment size is honoured: a slab of a class above
    /// it gets a segment of its own, rounded up to a multiple of the segment size.
    pub fn new(config: SlabConfig) -> Self {
        let segment_size = config.segment_size.clamp(MIN_SLAB, MAX_SEGMENT).next_power_of_two();
        let max_size = config.max_size.clamp(MIN_BLOCK, MAX_SEGMENT);
        let last = size_class_of(max_size);
        let mut classes = Vec::new();
        let mut size = MIN_BLOCK;
        while size <= last {
            let slab_size = if size <= SHARED_SLAB_MAX { MIN_SLAB } else { size };
            debug_assert_eq!(size_class_index(size), classes.len());
            classes.push(Class { size, slab_size, partial: Vec::new() });
            size = size_class_of(size + 1);
        }
        Self {
            max_size,
            segment_size,
            space: FirstFit::default(),
            classes,
            slabs: Vec::new(),
            spare: Vec::new(),
            objects: AddrMap::default(),
            allocated: 0,
        }
    }

    pub fn config(&self) -> SlabConfig {
        SlabConfig { max_size: self.max_size, segment_size: self.segment_size }
    }

    /// Carves a new slab for class `ci` and puts it on the class's partial list.
    fn carve_slab(&mut self, ci: usize) -> Option<u32> {
        let class = &self.classes[ci];
        let base = self.space.allocate(class.slab_size, RunKind::Slab)?.addr;
        let capacity = (class.slab_size / class.size) as u32;
        let partial_pos = class.partial.len() as u32;
        let mut rec = SlabRec { base, class: ci as u32, capacity, bump: 0, free_slots: Vec::new(), live: 0, partial_pos };
        let s = match self.spare.pop() {
            Some(s) => {
                let old = &mut self.slabs[s as usize];
                rec.free_slots = std::mem::take(&mut old.free_slots);
                rec.free_slots.clear();
                *old = rec;
                s
            }
            None => {
                self.slabs.push(rec);
                (self.slabs.len() - 1) as u32
            }
        };
        self.classes[ci].partial.push(s);
        Some(s)
    }

    fn allocate_run(&mut self, size: u64) -> Option<Block> {
        let block = self.space.allocate(size, RunKind::Block)?;
        self.allocated += block.size;
        Some(block)
    }
}

impl Strategy for Slab {
    fn name(&self) -> &'static str {
        "slab"
    }

    fn segment_size_for(&self, size: u64) -> u64 {
        if size > self.max_size {
            return round_up(size, self.segment_size).unwrap_or(!(self.segment_size - 1));
        }
        // The segment size, or the slab of a class larger than it rounded up to segments.
        let slab_size = self.classes.get(size_class_index(size_class_of(size))).map_or(0, |c| c.slab_size);
        round_up(slab_size, self.segment_size).unwrap_or(self.segment_size)
    }

    fn add_segment(&mut self, segment: Segment) {
        self.space.add_segment(segment);
    }

    fn allocate(&mut self, size: u64) -> Option<Block> {
        let size = size.max(1);
        if size > self.max_size {
            return self.allocate_run(size);
        }
        let class_size = size_class_of(size);
        let ci = size_class_index(class_size);
        let class = self.classes.get(ci)?;
        // A run of one object needs no slab record: it is a block of the class's size.
        if class.slab_size == class_size {
            return self.allocate_run(class_size);
        }
        let s = match class.partial.last() {
            Some(&s) => s,
            None => self.carve_slab(ci)?,
        };
        let slab = &mut self.slabs[s as usize];
        let slot = slab.free_slots.pop().unwrap_or_else(|| {
            slab.bump += 1;
            slab.bump - 1
        });
        slab.live += 1;
        let addr = slab.base + u64::from(slot) * class_size;
        if slab.live == slab.capacity {
            slab.partial_pos = NIL;
            self.classes[ci].partial.pop();
        }
        self.objects.insert(addr, s);
        self.allocated += class_size;
        Some(Block { addr, size: class_size })
    }

    fn free(&mut self, addr: u64) -> Option<u64> {
        // Runs first: their frees all come here, while most objects' stop in the pool's caches.
        if let Some(size) = self.space.free(addr, RunKind::Block) {
            self.allocated -= size;
            return Some(size);
        }
        let s = self.objects.remove(&addr)?;
        let slab = &mut self.slabs[s as usize];
        let ci = slab.class as usize;
        let class_size = self.classes[ci].size;
        self.allocated -= class_size;
        slab.live -= 1;
        if slab.live > 0 {
            slab.free_slots.push(((addr - slab.base) / class_size) as u32);
            if slab.partial_pos == NIL {
                let partial = &mut self.classes[ci].partial;
                slab.partial_pos = partial.len() as u32;
                partial.push(s);
            }
            return Some(class_size);
        }
        // Design: an empty slab goes back to the buddy at once, so any class (or a large block)
        // can reuse its space and its segment can empty out for release.
        let (base, pos) = (slab.base, slab.partial_pos);
        if pos != NIL {
            let partial = &mut self.classes[ci].partial;
            partial.swap_remove(pos as usize);
            if let Some(&moved) = partial.get(pos as usize) {
                self.slabs[moved as usize].partial_pos = pos;
            }
        }
        self.space.free(base, RunKind::Slab);
        self.spare.push(s);
        Some(class_size)
    }

    fn placed_next(&self, addr: u64) -> bool {
        self.space.placed_next(addr)
    }

    fn free_segments(&self) -> Vec<Segment> {
        self.space.free_segments()
    }

    fn release_segments(&mut self, segments: &[Segment]) -> Vec<Segment> {
        self.space.release_segments(segments)
    }

    fn usage(&self) -> Usage {
        let space = self.space.usage();
        // The largest block allocate can hand out now: a large block as big as the buddy's
        // largest free block, or else the largest class with a free slot or room for a slab.
        let largest_free = if space.largest_free > self.max_size {
            space.largest_free
        } else {
            self.classes.iter().rev().find(|c| !c.partial.is_empty() || c.slab_size <= space.largest_free).map_or(0, |c| c.size)
        };
        Usage {
            reserved: space.reserved,
            allocated: self.allocated,
            largest_free,
            segments: space.segments,
            // The space's live runs are the blocks of their own and the slabs in use.
            live_blocks: self.objects.len() as u64 + space.live_blocks - (self.slabs.len() - self.spare.len()) as u64,
        }
    }

    fn snapshot(&self) -> Vec<(Segment, Vec<BlockInfo>)> {
        let slab_at: AddrMap<&SlabRec> = self.slabs.iter().filter(|r| r.live > 0).map(|r| (r.base, r)).collect();
        let mut objects: Vec<u64> = self.objects.keys().copied().collect();
        objects.sort_unstable();
        let mut objects = objects.into_iter().peekable();
        self.space
            .snapshot()
            .into_iter()
            .map(|(seg, blocks)| {
                let mut list = Vec::new();
                for b in blocks {
                    let Some(slab) = slab_at.get(&b.addr).filter(|_| b.allocated) else {
                        if b.allocated {
                            list.push(b);
                        } else {
                            push_free(&mut list, b.addr, b.size);
                        }
                        continue;
                    };
                    let class_size = self.classes[slab.class as usize].size;
                    let end = b.addr + b.size;
                    let mut cursor = b.addr;
                    while let Some(addr) = objects.next_if(|&a| a < end) {
                        push_free(&mut list, cursor, addr - cursor);
                        list.push(BlockInfo { addr, size: class_size, allocated: true });
                        cursor = addr + class_size;
                    }
                    push_free(&mut list, cursor, end - cursor);
                }
                (seg, list)
            })
            .collect()
    }
}

/// Appends a free range, merging it with a free range just before it (free slots of a slab and
/// free slab space read as one range in a snapshot).
fn push_free(list: &mut Vec<BlockInfo>, addr: u64, size: u64) {
    if size == 0 {
        return;
    }
    if let Some(last) = list.last_mut().filter(|l| !l.allocated && l.addr + l.size == addr) {
        last.size += size;
    } else {
        list.push(BlockInfo { addr, size, allocated: false });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes::GIB;

    fn seg(base: u64, size: u64) -> Segment {
        Segment { base, size }
    }

    fn info(addr: u64, size: u64, allocated: bool) -> BlockInfo {
        BlockInfo { addr, size, allocated }
    }

    fn with_segment() -> Slab {
        let mut s = Slab::default();
        s.add_segment(seg(0, 2 * MIB));
        s
    }

    #[test]
    fn classes_and_slab_sizes() {
        let s = Slab::default();
        assert_eq!(s.classes.len(), size_class_index(MIB) + 1);
        for (i, c) in s.classes.iter().enumerate() {
            assert_eq!(size_class_index(c.size), i);
            let expected = if c.size <= 32 * KIB { 64 * KIB } else { c.size };
            assert_eq!(c.slab_size, expected, "class {}", c.size);
        }
        assert_eq!(s.segment_size_for(512), 2 * MIB);
        assert_eq!(s.segment_size_for(MIB), 2 * MIB);
        assert_eq!(s.segment_size_for(MIB + 512), 2 * MIB);
        assert_eq!(s.segment_size_for(3 * MIB), 4 * MIB);
        assert_eq!(s.segment_size_for(5 * MIB), 6 * MIB);
        assert_eq!(s.segment_size_for(u64::MAX), !(2 * MIB - 1));
    }

    #[test]
    fn objects_of_a_class_share_a_slab_and_reuse_slots() {
        let mut s = with_segment();
        let a = s.allocate(1000).unwrap();
        let b = s.allocate(1024).unwrap();
        let c = s.allocate(5 * KIB).unwrap();
        assert_eq!((a.size, b.size, c.size), (1024, 1024, 5 * KIB));
        assert_eq!(b.addr, a.addr + 1024, "same class, same slab");
        assert_eq!(c.addr, 64 * KIB, "another class, another slab");
        assert_eq!(s.usage().allocated, 7 * KIB);
        assert_eq!(s.free(a.addr), Some(1024));
        assert_eq!(s.allocate(700).unwrap().addr, a.addr, "freed slot reused");
        assert_eq!(s.usage().live_blocks, 3);
    }

    #[test]
    fn classes_with_few_objects_hold_only_what_they_need() {
        // Slabs of two objects rounded to a power of two would take 2 MiB for the 768 KiB class
        // and 1 MiB for the 448 KiB one: 3 MiB for these three blocks.
        let mut s = with_segment();
        let blocks: Vec<_> = [768 * KIB, 768 * KIB, 448 * KIB].iter().map(|&size| s.allocate(size).unwrap()).collect();
        assert_eq!(blocks.iter().map(|b| b.addr).collect::<Vec<_>>(), vec![0, 768 * KIB, 1536 * KIB]);
        assert_eq!(s.usage().reserved, 2 * MIB);
        assert!(s.allocate(128 * KIB).is_none(), "64 KiB left");
        s.free(blocks[1].addr).unwrap();
        assert_eq!(s.allocate(640 * KIB).unwrap().addr, 768 * KIB, "a freed run serves another class");
    }

    #[test]
    fn full_slabs_leave_the_partial_list() {
        let mut s = with_segment();
        // 512 B class: 128 objects per 64 KiB slab.
        let objs: Vec<_> = (0..300).map(|_| s.allocate(512).unwrap()).collect();
        let mut addrs: Vec<_> = objs.iter().map(|o| o.addr).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 300);
        assert_eq!(s.classes[0].partial.len(), 1);
        // Free one object in each of the two full slabs: both come back to the partial list.
        s.free(objs[5].addr).unwrap();
        s.free(objs[200].addr).unwrap();
        assert_eq!(s.classes[0].partial.len(), 3);
        for o in &objs[256..] {
            s.free(o.addr).unwrap();
        }
        assert_eq!(s.classes[0].partial.len(), 2, "the emptied third slab is gone");
        assert_eq!(s.allocate(512).unwrap().addr, objs[5].addr);
        assert_eq!(s.allocate(512).unwrap().addr, objs[200].addr);
        assert_eq!(s.classes[0].partial.len(), 0);
    }

    #[test]
    fn empty_slab_is_reused_by_another_class() {
        let mut s = with_segment();
        let a = s.allocate(512).unwrap();
        assert_eq!(s.free(a.addr), Some(512));
        assert_eq!(s.snapshot()[0].1, vec![info(0, 2 * MIB, false)]);
        let b = s.allocate(48 * KIB).unwrap();
        assert_eq!((b.addr, b.size), (0, 48 * KIB));
        assert_eq!(s.snapshot()[0].1, vec![info(0, 48 * KIB, true), info(48 * KIB, 2 * MIB - 48 * KIB, false)]);
        s.free(b.addr).unwrap();
        assert_eq!(s.release_free_segments(), vec![seg(0, 2 * MIB)]);
        assert_eq!(s.usage(), Usage::default());
    }

    #[test]
    fn a_slab_is_never_freed_as_a_run() {
        let mut s = with_segment();
        let first = s.allocate(512).unwrap();
        let second = s.allocate(512).unwrap();
        let run = s.allocate(64 * KIB).unwrap();
        assert_eq!((run.addr, run.size), (64 * KIB, 64 * KIB), "a run of one object, above the 512 B class's slab");
        assert_eq!(s.usage().live_blocks, 3);
        s.free(first.addr).unwrap();
        // The slab's base is no live object now, and the slab is no block of its own.
        let before = (s.snapshot(), s.usage());
        assert_eq!(s.free(first.addr), None);
        assert_eq!((s.snapshot(), s.usage()), before);
        assert_eq!(s.usage().live_blocks, 2);
        assert_eq!(s.free(run.addr), Some(64 * KIB));
        assert_eq!(s.free(run.addr), None, "a double free of a run");
        assert_eq!(s.allocate(40 * KIB).unwrap(), Block { addr: 64 * KIB, size: 40 * KIB }, "the run's place is carved again");
        assert_eq!(s.free(second.addr), Some(512));
        assert_eq!(s.usage().live_blocks, 1);
    }

    #[test]
    fn large_blocks_and_release() {
        let mut s = Slab::default();
        assert!(s.allocate(3 * MIB).is_none());
        s.add_segment(seg(0, 4 * MIB));
        let big = s.allocate(3 * MIB).unwrap();
        assert_eq!(big, Block { addr: 0, size: 3 * MIB }, "a block of its own size, not a power of two");
        let small = s.allocate(512).unwrap();
        assert_eq!(small.addr, 3 * MIB, "the segment's rest holds slabs");
        // 1 MiB less a 64 KiB slab left: the largest class whose one-object slab fits is 896 KiB.
        assert_eq!(s.usage().largest_free, 896 * KIB);
        s.add_segment(seg(4 * MIB, 2 * MIB));
        let mid = s.allocate(MIB + 512).unwrap();
        assert_eq!(mid, Block { addr: 4 * MIB, size: MIB + 512 });
        assert_eq!(s.usage().allocated, 4 * MIB + 1024);
        assert!(s.release_free_segments().is_empty());
        assert_eq!(s.free(mid.addr), Some(MIB + 512));
        assert_eq!(s.usage().largest_free, 2 * MIB);
        assert_eq!(s.release_free_segments(), vec![seg(4 * MIB, 2 * MIB)]);
        s.free(big.addr).unwrap();
        assert_eq!(s.release_free_segments(), vec![], "the slab keeps its segment");
        s.free(small.addr).unwrap();
        assert_eq!(s.release_free_segments(), vec![seg(0, 4 * MIB)]);
    }

    #[test]
    fn snapshot_shows_objects_and_merged_free_space() {
        let mut s = with_segment();
        let a = s.allocate(512).unwrap();
        let b = s.allocate(512).unwrap();
        let c = s.allocate(512).unwrap();
        s.free(b.addr).unwrap();
        let d = s.allocate(64 * KIB).unwrap(); // 64 KiB class, a slab of one object
        let (segment, list) = &s.snapshot()[0];
        assert_eq!(*segment, seg(0, 2 * MIB));
        assert_eq!(
            *list,
            vec![
                info(a.addr, 512, true),
                info(512, 512, false),
                info(c.addr, 512, true),
                info(1536, 64 * KIB - 1536, false),
                info(d.addr, 64 * KIB, true),
                info(d.addr + 64 * KIB, 2 * MIB - d.addr - 64 * KIB, false),
            ]
        );
        assert_eq!(d.addr, 64 * KIB);
    }

    #[test]
    fn max_size_above_the_segment_size_is_honoured() {
        let mut s = Slab::new(SlabConfig { max_size: 64 * MIB, segment_size: 2 * MIB });
        assert_eq!(s.segment_size_for(512), 2 * MIB);
        assert_eq!(s.segment_size_for(MIB), 2 * MIB);
        assert_eq!(s.segment_size_for(3 * MIB), 4 * MIB, "class 3 MiB, a 3 MiB slab in whole segments");
        assert_eq!(s.segment_size_for(40 * MIB), 40 * MIB);
        assert_eq!(s.segment_size_for(64 * MIB + 512), 66 * MIB, "above max_size: a dedicated segment");
        s.add_segment(seg(0, 40 * MIB));
        let a = s.allocate(40 * MIB).unwrap();
        assert_eq!(a, Block { addr: 0, size: 40 * MIB });
        assert!(s.allocate(512).is_none(), "the 40 MiB slab fills its segment");
        s.add_segment(seg(GIB, 4 * MIB));
        let b = s.allocate(3 * MIB - 512).unwrap();
        assert_eq!(b, Block { addr: GIB, size: 3 * MIB });
        let c = s.allocate(512).unwrap();
        assert_eq!(c.addr, GIB + 3 * MIB, "the rest of the 3 MiB slab's segment serves small slabs");
        s.free(a.addr).unwrap();
        let d = s.allocate(MIB).unwrap();
        assert_eq!(d.addr, 0, "the emptied big slab's space serves other classes");
        for block in [b, c, d] {
            s.free(block.addr).unwrap();
        }
        assert_eq!(s.release_free_segments().len(), 2);
    }

    #[test]
    fn extreme_sizes_and_configs_do_not_panic() {
        let mut s = with_segment();
        for size in [u64::MAX, u64::MAX - 511, 1 << 63] {
            assert_eq!(s.allocate(size), None);
        }
        assert_eq!(s.allocate(0).unwrap().size, 512);
        let odd = Slab::new(SlabConfig { max_size: u64::MAX, segment_size: u64::MAX });
        assert_eq!(odd.config(), SlabConfig { max_size: 1 << 40, segment_size: 1 << 40 });
        let tiny = Slab::new(SlabConfig { max_size: 0, segment_size: 0 });
        assert_eq!(tiny.config(), SlabConfig { max_size: 512, segment_size: 64 * KIB });
        let mut odd = Slab::new(SlabConfig { max_size: 3 * MIB, segment_size: 3 * MIB });
        assert_eq!(odd.config(), SlabConfig { max_size: 3 * MIB, segment_size: 4 * MIB });
        assert_eq!(odd.segment_size_for(3 * MIB), 4 * MIB);
        odd.add_segment(seg(0, 4 * MIB));
        assert_eq!(odd.allocate(3 * MIB - 512).unwrap().size, 3 * MIB);
    }
}
