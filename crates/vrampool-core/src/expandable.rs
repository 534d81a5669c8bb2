//! Expandable segments, as PyTorch's `expandable_segments`: the best-fit tier of each stream grows
//! one reserved address range instead of allocating separate segments.
//!
//! Design: on its first growth an arena reserves an address range, then maps physical memory at
//! the end of the mapped range (whole units of the device's granularity) as the tier needs more.
//! The strategy sees one segment that grows (`Strategy::grow_segment`), so a free range at the old
//! end merges with the new space and a block can span two chunks; memory that plain segments
//! would strand between them (a free tail too small for the next request, next to a new segment)
//! stays usable. A give-back unmaps mappings that lie wholly in free space (`unused_ranges`): they
//! become holes (`unmap_free_ranges`) that a later growth maps again when that maps fewer bytes
//! than growing at the end (`plan_growth`, `map_hole`), and a hole at the end of the range is cut
//! off (`cut_unmapped_tail`). When nothing is mapped any more, the range is unreserved.
//!
//! PyTorch reserves the device's whole memory (and an eighth) at once. Here the first range is
//! 256 MiB (or the device's memory and an eighth, if less), and when a range is full the next one
//! is four times as large, up to that maximum: a stream that uses little memory holds little
//! address space (and the simulated device, which backs a reservation with host memory, stays
//! cheap), while a stream that grows to a whole 141 GiB device ends up with at most six ranges.
//!
//! A growth is mapped in at most `MAPS_PER_GROWTH` pieces of whole units (each one `cuMemCreate`,
//! `cuMemMap` and `cuMemSetAccess` on CUDA), not one per unit: a 40 GB growth would otherwise be
//! 20,000 map calls, and a 32 TiB simulated one millions of bookkeeping entries. Not one piece
//! either: a mapping is unmapped only whole (as with `cuMemUnmap`), so a trim gives a piece back
//! once all of it is free, and one piece per growth would keep a whole growth mapped for one live
//! block. A piece is a `MAPS_PER_GROWTH`th of the growth, and at least one unit and a
//! `PIECES_PER_HIGH_WATER`th of the most the pool has reserved: a small pool gives back in single
//! units, while a large one, where a unit is a sliver of the peak, maps (and gives back) in
//! pieces that keep its map calls near one per growth: 2 MiB pieces up to a 2 GiB pool, 27 MiB
//! ones at 27 GiB. Design: a piece is what a growth's give-back can return only once all of it is
//! free, so pieces of a thousandth of the peak keep a large pool's peak within a few thousandths of
//! its live bytes (gpt2-medium and Llama at 7 and 21 GiB: 1.009x and 1.008x the bound with pieces
//! of a 512th, 1.002x and 1.003x with a 1024th, for half as many map calls again in the first pass).
//!
//! This module holds the pool's settings (`Expandable`) and the device-side bookkeeping of an
//! arena's ranges (`VmArena`, which chunks are mapped), which each `Arena` owns beside its tiers;
//! the pool makes the device calls and keeps the counters, under the tier's strategy lock, so the
//! strategy's view and the mapped chunks change together.

use std::collections::BTreeMap;

use crate::config::PoolConfig;
use crate::device::Device;
use crate::sizes::{round_up, MIB};
use crate::strategy::{Segment, StrategyKind};

/// An arena's first reservation, and how much larger each next one is.
const FIRST_RESERVATION: u64 = 256 * MIB;
/// The most `map` calls one growth makes (see the module's documentation).
pub(crate) const MAPS_PER_GROWTH: u64 = 32;
/// The smallest piece is this fraction of the pool's high-water mark (see the module's
/// documentation).
pub(crate) const PIECES_PER_HIGH_WATER: u64 = 1024;
const RESERVATION_GROWTH: u64 = 4;

/// Expandable mode of a pool: which tier grows an expandable segment, in what unit, and how large
/// its reservations are. Each arena keeps its own segments (`Arena::with_vm`).
pub(crate) struct Expandable {
    /// The mapping unit: the device's granularity (a power of two).
    pub unit: u64,
    /// The index of the tier (in each arena) that grows an expandable segment.
    pub tier: u8,
    /// The size of an arena's first reservation, and the most any one may be.
    pub first_reservation: u64,
    pub max_reservation: u64,
}

/// One arena's expandable segments (usually one; none until its expandable tier first grows).
#[derive(Default)]
pub(crate) struct VmArena {
    /// In the order they were made: only the last one grows at its end.
    pub reservations: Vec<Reservation>,
    /// Reserving failed: the arena's tier uses plain segments from now on.
    pub unavailable: bool,
}

/// A reserved address range and the mappings in it.
pub(crate) struct Reservation {
    pub base: u64,
    pub size: u64,
    /// Bytes from `base` to the end of the strategy's segment (mappings and holes).
    pub extent: u64,
    /// Mappings by address -> size, each one `map` call.
    mapped: BTreeMap<u64, u64>,
}

impl Expandable {
    /// Expandable mode for a pool with `config` on `device`, if it is on and can work: the device
    /// maps in power-of-two units at least as large as the alignment, and the strategy has a
    /// best-fit tier.
    pub fn new(config: &PoolConfig, device: &dyn Device, device_total: u64) -> Option<Self> {
        // A shared pool's blocks must each lie in one physical allocation, which an importer
        // maps whole; an expandable segment's block can span two.
        if !config.expandable || config.ipc {
            return None;
        }
        let unit = device.vm_granularity()?;
        if !unit.is_power_of_two() || unit < config.alignment {
            return None;
        }
        let tier = match config.strategy {
            StrategyKind::Hybrid => 1,
            StrategyKind::BestFit => 0,
            // Buddy's power-of-two layout and slab's carving gain nothing from growing in place.
            StrategyKind::Slab | StrategyKind::Buddy => return None,
        };
        let max_reservation = round_up(device_total.saturating_add(device_total / 8), unit)?.max(unit);
        let first_reservation = round_up(FIRST_RESERVATION, unit)?.min(max_reservation);
        Some(Self { unit, tier, first_reservation, max_reservation })
    }

    /// The size of the reservation to make after `last` (None for the first) so that a block of
    /// `size` bytes fits; None if no reservation may be that large.
    pub fn next_reservation(&self, last: Option<u64>, size: u64) -> Option<u64> {
        let need = round_up(size, self.unit)?;
        let grown = last.map_or(self.first_reservation, |l| l.saturating_mul(RESERVATION_GROWTH));
        let size = grown.max(need).min(self.max_reservation);
        (size >= need).then_some(size)
    }
}

impl Reservation {
    pub fn new(base: u64, size: u64) -> Self {
        Self { base, size, extent: 0, mapped: BTreeMap::new() }
    }

    pub fn is_unmapped(&self) -> bool {
        self.mapped.is_empty()
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }

    /// The parts of `range` that no mapping covers, in address order.
    pub fn gaps(&self, range: Segment) -> Vec<Segment> {
        self.gaps_in(range).collect()
    }

    /// The bytes of `range` that no mapping covers (what mapping it would cost), with no
    /// allocation: a growth asks this of every hole it might fill.
    pub fn unmapped_bytes(&self, range: Segment) -> u64 {
        self.gaps_in(range).map(|g| g.size).sum()
    }

    fn gaps_in(&self, range: Segment) -> impl Iterator<Item = Segment> + '_ {
        let end = range.base + range.size;
        let mut at = range.base;
        // A mapping that starts below the range may reach into it.
        let below = self.mapped.range(..range.base).next_back();
        let mappings = below.into_iter().chain(self.mapped.range(range.base..end)).map(|(&s, &len)| (s, len));
        // Each mapping yields the gap before it, if any; the end yields the last gap.
        let before_each = mappings.map(Some).chain(std::iter::once(None));
        before_each.filter_map(move |mapping| {
            let (start, next) = mapping.map_or((end, end), |(start, len)| (start.min(end), start + len));
            let gap = (start > at).then(|| Segment { base: at, size: start - at });
            at = at.max(next);
            gap
        })
    }

    /// The mappings that lie wholly inside `[lo, hi)`.
    pub fn mappings_within(&self, lo: u64, hi: u64) -> Vec<Segment> {
        if lo >= hi {
            return Vec::new();
        }
        self.mapped.range(lo..hi).filter(|&(&s, &len)| s + len <= hi).map(|(&base, &size)| Segment { base, size }).collect()
    }

    /// Whether `range` is one mapping.
    pub fn has_mapping(&self, range: Segment) -> bool {
        self.mapped.get(&range.base) == Some(&range.size)
    }

    pub fn note_mapped(&mut self, range: Segment) {
        self.mapped.insert(range.base, range.size);
    }

    pub fn note_unmapped(&mut self, range: Segment) {
        self.mapped.remove(&range.base);
    }

    /// Every mapping (for the pool's drop).
    pub fn all_mappings(&self) -> Vec<Segment> {
        self.mapped.iter().map(|(&base, &size)| Segment { base, size }).collect()
    }
}

/// `gap` (whole units) cut into at most `MAPS_PER_GROWTH` pieces of whole units, each at least
/// `least` bytes (rounded down to whole units; the gap is one piece if it is smaller), in address
/// order, the last one possibly shorter.
pub(crate) fn pieces(gap: Segment, unit: u64, least: u64) -> impl Iterator<Item = Segment> {
    let units = gap.size / unit;
    let piece = (units.div_ceil(MAPS_PER_GROWTH).max(1) * unit).max(least / unit * unit);
    let end = gap.base + gap.size;
    (0..units.div_ceil(piece / unit)).map(move |k| {
        let base = gap.base + k * piece;
        Segment { base, size: piece.min(end - base) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: u64 = 2 * MIB;

    fn seg(base: u64, size: u64) -> Segment {
        Segment { base, size }
    }

    #[test]
    fn gaps_and_whole_mappings() {
        let mut r = Reservation::new(0, 64 * U);
        r.note_mapped(seg(0, 4 * U));
        r.note_mapped(seg(8 * U, 2 * U));
        assert_eq!(r.gaps(seg(0, 12 * U)), vec![seg(4 * U, 4 * U), seg(10 * U, 2 * U)]);
        assert_eq!(r.gaps(seg(2 * U, 4 * U)), vec![seg(4 * U, 2 * U)], "a mapping from below covers the start");
        assert!(r.gaps(seg(8 * U, 2 * U)).is_empty());
        let unmapped = [seg(0, 12 * U), seg(2 * U, 4 * U), seg(8 * U, 2 * U), seg(9 * U, 3 * U)].map(|range| r.unmapped_bytes(range) / U);
        assert_eq!(unmapped, [6, 2, 0, 2]);
        assert_eq!(r.mappings_within(0, 9 * U), vec![seg(0, 4 * U)], "the one at 8U reaches past 9U");
        assert_eq!(r.mappings_within(0, 10 * U), vec![seg(0, 4 * U), seg(8 * U, 2 * U)]);
        assert!(r.has_mapping(seg(0, 4 * U)) && !r.has_mapping(seg(0, 2 * U)) && !r.has_mapping(seg(2 * U, 2 * U)));
        r.note_unmapped(seg(0, 4 * U));
        assert!(!r.has_mapping(seg(0, 4 * U)));
        assert_eq!(r.all_mappings(), vec![seg(8 * U, 2 * U)]);
        assert!(!r.is_unmapped());
    }

    #[test]
    fn a_growth_is_cut_into_at_most_maps_per_growth_pieces() {
        let cut = |units: u64| pieces(seg(8 * U, units * U), U, U).collect::<Vec<_>>();
        assert_eq!(cut(3), vec![seg(8 * U, U), seg(9 * U, U), seg(10 * U, U)], "small growths: a unit a piece");
        assert_eq!(cut(MAPS_PER_GROWTH).len() as u64, MAPS_PER_GROWTH);
        let large = cut(20_000);
        assert_eq!(large.len() as u64, MAPS_PER_GROWTH, "a 40 GB growth is 32 maps, not 20,000");
        assert!(large.windows(2).all(|w| w[0].base + w[0].size == w[1].base), "contiguous");
        assert_eq!(large.iter().map(|p| p.size).sum::<u64>(), 20_000 * U);
        assert!(large.iter().all(|p| p.size % U == 0));
        assert_eq!(cut(33).len(), 17, "two units a piece, the last one alone");
        assert_eq!(pieces(seg(0, (1 << 45) / U * U), U, 0).count() as u64, MAPS_PER_GROWTH, "32 TiB");
    }

    #[test]
    fn pieces_are_at_least_the_pools_share() {
        let sizes = |units: u64, least: u64| pieces(seg(8 * U, units * U), U, least).map(|p| p.size / U).collect::<Vec<_>>();
        assert_eq!(sizes(10, 4 * U), vec![4, 4, 2], "the last one shorter");
        assert_eq!(sizes(10, 4 * U + U / 2), vec![4, 4, 2], "whole units");
        assert_eq!(sizes(3, 4 * U), vec![3], "a growth smaller than the least is one piece");
        assert_eq!(sizes(3, U / 2), vec![1, 1, 1], "never below one unit");
        assert_eq!(sizes(640, 4 * U), vec![20; 32], "a MAPS_PER_GROWTH th of the growth when that is more");
        // A 27 GiB pool's pieces: a 600 MiB growth is 24 maps, not 32.
        let least = 27 * 1024 * MIB / PIECES_PER_HIGH_WATER;
        assert_eq!(pieces(seg(0, 600 * MIB), U, least).count(), 24);
    }
}
