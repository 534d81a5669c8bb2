//! Allocation strategies over the address ranges of device segments.
//!
//! A strategy knows nothing of devices, streams or threads: the pool hands it whole segments
//! (`add_segment`), asks it for blocks, and takes back the segments it reports wholly free. Each
//! strategy is a small single-threaded type; the pool puts each instance behind its own lock.

mod addr_map;
mod best_fit;
mod bit_tree;
mod buddy;
#[cfg(test)]
mod conformance;
mod first_fit;
mod free_ranges;
mod slab;

pub use best_fit::{BestFit, BestFitConfig};
pub use buddy::{Buddy, BuddyConfig};
pub use slab::{Slab, SlabConfig, SHARED_SLAB_MAX};

/// A block handed out by a strategy: its address and its real size (the request rounded up to
/// what the strategy gives out, e.g. a size class or a power of two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
}

/// A device segment's address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Segment {
    pub base: u64,
    pub size: u64,
}

/// What a strategy holds, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Sum of the sizes of the segments it holds.
    pub reserved: u64,
    /// Sum of the real sizes of its live blocks.
    pub allocated: u64,
    /// The largest block `allocate` could hand out right now without a new segment.
    pub largest_free: u64,
    pub segments: u64,
    pub live_blocks: u64,
}

/// Where an expandable segment should gain memory so that `allocate(size)` succeeds (see
/// `Strategy::plan_growth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowthPlan {
    /// The free bytes at the segment's end, which a growth at the end extends.
    pub tail: u64,
    /// Bytes to add at the segment's end: what its free tail lacks, in whole units.
    pub at_end: u64,
    /// The cheapest part of an unmapped hole that, mapped again, joins free neighbours into a
    /// range that fits, if any (whole units).
    pub hole: Option<Segment>,
}

/// One block or free range in a snapshot of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    pub addr: u64,
    pub size: u64,
    pub allocated: bool,
}

pub trait Strategy: Send {
    /// Short lower-case name ("slab", "best_fit", "buddy").
    fn name(&self) -> &'static str;

    /// The size of the segment to ask the device for so that a following `allocate(size)` succeeds.
    /// `size` is > 0 and a multiple of 512. May exceed `size` (segments are cached and split).
    fn segment_size_for(&self, size: u64) -> u64;

    /// Takes ownership of a new segment `[base, base + size)`; `base` is aligned to at least 512 B
    /// and `size` is a value `segment_size_for` returned.
    fn add_segment(&mut self, segment: Segment);

    /// A block of at least `size` bytes (> 0, a multiple of 512) at an address aligned to 512 B,
    /// or None when no free range fits (the pool then adds a segment and retries).
    fn allocate(&mut self, size: u64) -> Option<Block>;

    /// Frees the live block at `addr`, merging with free neighbours where the strategy merges;
    /// returns the block's real size, or None if `addr` is not a live block of this strategy
    /// (nothing changes then).
    fn free(&mut self, addr: u64) -> Option<u64>;

    /// Whether the live block at `addr`, freed now, is where the next allocation of its size
    /// would be placed: then caching it instead changes no placement. False unless the strategy
    /// places by address (the slab's first fit).
    fn placed_next(&self, _addr: u64) -> bool {
        false
    }

    /// The segments that are wholly free (expandable segments never are: they shrink instead).
    fn free_segments(&self) -> Vec<Segment>;

    /// Removes those of `segments` that are wholly free, and returns them.
    fn release_segments(&mut self, segments: &[Segment]) -> Vec<Segment>;

    /// Removes every segment that is wholly free and returns them (for trim / release on OOM).
    fn release_free_segments(&mut self) -> Vec<Segment> {
        let free = self.free_segments();
        self.release_segments(&free)
    }

    fn usage(&self) -> Usage;

    /// Every segment with its blocks and free ranges in address order (for snapshots and tests).
    /// An expandable segment with unmapped holes shows as one segment per mapped run.
    fn snapshot(&self) -> Vec<(Segment, Vec<BlockInfo>)>;

    // ---- expandable segments (virtual-memory growth) ----
    //
    // An expandable segment is one address range that the pool maps memory into as it grows and
    // unmaps as it trims, in whole `unit`s (the device's mapping granularity) counted from its
    // base. Only strategies that return true from `grow_segment` get one; the defaults say
    // "unsupported", and the pool then uses plain segments.

    /// Grows the expandable segment at `base` by `extra` bytes of free space at its end (merging
    /// with a free range there); with no segment at `base`, starts one of `extra` bytes. False
    /// (and nothing changes) if unsupported, if `base` is a plain segment, or if the new space
    /// would overlap another segment.
    fn grow_segment(&mut self, _base: u64, _extra: u64) -> bool {
        false
    }

    /// The ranges of the expandable segment at `base` that hold no block (free space and holes,
    /// each range as long as it runs), in address order.
    fn unused_ranges(&self, _base: u64) -> Vec<Segment> {
        Vec::new()
    }

    /// The free ranges of the expandable segment at `base` of at least `least` bytes (each as
    /// long as it runs up to a block or a hole), in address order.
    fn free_ranges_at_least(&self, _base: u64, _least: u64) -> Vec<Segment> {
        Vec::new()
    }

    /// Turns each of `ranges` (in address order, whole multiples of the alignment) that lies in
    /// free space of the expandable segment at `base` into a hole that no block is cut from;
    /// returns the ones it turned (a range that holds a block or a hole is left as it is).
    fn unmap_free_ranges(&mut self, _base: u64, _ranges: &[Segment]) -> Vec<Segment> {
        Vec::new()
    }

    /// Cuts the unmapped hole off the end of the expandable segment at `base`, if it ends in one;
    /// returns how many bytes its end moved down. A segment left with nothing but a hole is
    /// removed, and its whole size returned.
    fn cut_unmapped_tail(&mut self, _base: u64) -> u64 {
        0
    }

    /// How the expandable segment at `base` could grow so that `allocate(size)` succeeds; None
    /// if there is no such segment.
    fn plan_growth(&self, _base: u64, _size: u64, _unit: u64, _cost: &dyn Fn(Segment) -> u64) -> Option<GrowthPlan> {
        None
    }

    /// Makes `range`, which lies inside one unmapped hole, free space again (the pool mapped it).
    /// False (and nothing changes) if it does not lie inside a hole.
    fn map_hole(&mut self, _range: Segment) -> bool {
        false
    }
}

/// Which strategy a pool (or one tier of the hybrid) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrategyKind {
    Slab,
    BestFit,
    Buddy,
    /// Small blocks to slab, the middle to best-fit, large blocks to buddy.
    Hybrid,
}

impl StrategyKind {
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().replace('-', "_").as_str() {
            "slab" => Some(Self::Slab),
            "best_fit" | "bestfit" => Some(Self::BestFit),
            "buddy" => Some(Self::Buddy),
            "hybrid" => Some(Self::Hybrid),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Slab => "slab",
            Self::BestFit => "best_fit",
            Self::Buddy => "buddy",
            Self::Hybrid => "hybrid",
        }
    }
}
