//! Expandable segments, as PyTorch's `expandable_segments`: the best-fit tier of each stream grows
//! one reserved address range instead of allocating separate segments.
//!
//! Design: on its first growth an arena reserves an address range, then maps physical memory at
//! the end of the mapped range, in chunks of the device's granularity, as the tier needs more.
//! The strategy sees one segment that grows (`Strategy::grow_segment`), so a free range at the old
//! end merges with the new space and a block can span two chunks; memory that plain segments
//! would strand between them (a free tail too small for the next request, next to a new segment)
//! stays usable. On trim, chunks that are wholly free are unmapped: at the end of the range
//! (`shrink_free_tail`) and inside it, where they become holes (`unmap_free_chunks`) that a later
//! growth maps again when that is cheaper than growing at the end (`plan_growth`, `map_hole`).
//! When nothing is mapped any more, the range is unreserved.
//!
//! PyTorch reserves the device's whole memory (and an eighth) at once. Here the first range is
//! 256 MiB (or the device's memory and an eighth, if less), and when a range is full the next one
//! is four times as large, up to that maximum: a stream that uses little memory holds little
//! address space (and the simulated device, which backs a reservation with host memory, stays
//! cheap), while a stream that grows to a whole 141 GiB device ends up with at most six ranges.
//!
//! Each chunk is its own `map` call, because a mapping can only be unmapped whole (as with
//! `cuMemUnmap`): so every wholly free chunk can be given back, wherever it lies.
//!
//! This module keeps the device-side bookkeeping of each arena's ranges (which chunks are
//! mapped); the pool makes the device calls and keeps the counters, under the tier's strategy
//! lock, so the strategy's view and the mapped chunks change together.

use std::collections::BTreeSet;

use foldhash::fast::FixedState;
use parking_lot::Mutex;

use crate::config::PoolConfig;
use crate::device::{Device, StreamId};
use crate::sizes::{round_up, MIB};
use crate::strategy::{Segment, StrategyKind};

/// An arena's first reservation, and how much larger each next one is.
const FIRST_RESERVATION: u64 = 256 * MIB;
const RESERVATION_GROWTH: u64 = 4;

/// Expandable mode of a pool: which tier grows an expandable segment, and in what unit.
pub(crate) struct Expandable {
    /// The mapping unit: the device's granularity (a power of two).
    pub unit: u64,
    /// The index of the tier (in each arena) that grows an expandable segment.
    pub tier: u8,
    /// The size of an arena's first reservation, and the most any one may be.
    pub first_reservation: u64,
    pub max_reservation: u64,
    /// Pinned with owned guards, as the pool's maps are (see `PoolCore::arenas`).
    arenas: papaya::HashMap<StreamId, Mutex<VmArena>, FixedState>,
}

/// One arena's expandable segments (usually one).
#[derive(Default)]
pub(crate) struct VmArena {
    /// In the order they were made: only the last one grows at its end.
    pub reservations: Vec<Reservation>,
    /// Reserving failed: the arena's tier uses plain segments from now on.
    pub unavailable: bool,
}

/// A reserved address range and the chunks mapped in it.
pub(crate) struct Reservation {
    pub base: u64,
    pub size: u64,
    /// Bytes from `base` to the end of the strategy's segment (mapped chunks and holes).
    pub extent: u64,
    /// Mapped chunks by address, each one `map` call of one unit.
    mapped: BTreeSet<u64>,
}

impl Expandable {
    /// Expandable mode for a pool with `config` on `device`, if it is on and can work: the device
    /// maps in power-of-two units at least as large as the alignment, and the strategy has a
    /// best-fit tier.
    pub fn new(config: &PoolConfig, device: &dyn Device, device_total: u64) -> Option<Self> {
        if !config.expandable {
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
        Some(Self { unit, tier, first_reservation, max_reservation, arenas: papaya::HashMap::default() })
    }

    /// Runs `f` on the expandable segments of `stream`'s arena (made on first use). Callers hold
    /// the arena's tier lock, so this lock is never contended.
    pub fn with_arena<R>(&self, stream: StreamId, f: impl FnOnce(&mut VmArena) -> R) -> R {
        let arenas = self.arenas.pin_owned();
        let cell = arenas.get_or_insert_with(stream, || Mutex::new(VmArena::default()));
        let mut arena = cell.lock();
        f(&mut arena)
    }

    /// The size of the reservation to make after `last` (None for the first) so that a block of
    /// `size` bytes fits; None if no reservation may be that large.
    pub fn next_reservation(&self, last: Option<u64>, size: u64) -> Option<u64> {
        let need = round_up(size, self.unit)?;
        let grown = last.map_or(self.first_reservation, |l| l.saturating_mul(RESERVATION_GROWTH));
        let size = grown.max(need).min(self.max_reservation);
        (size >= need).then_some(size)
    }

    /// Every arena's reservations as (stream, base, size).
    pub fn reservations(&self) -> Vec<(StreamId, u64, u64)> {
        let arenas = self.arenas.pin_owned();
        let mut out: Vec<_> = arenas
            .iter()
            .flat_map(|(&stream, cell)| cell.lock().reservations.iter().map(|r| (stream, r.base, r.size)).collect::<Vec<_>>())
            .collect();
        out.sort_unstable();
        out
    }

    /// Takes every reservation out (for the pool's drop).
    pub fn take_all(&self) -> Vec<Reservation> {
        let arenas = self.arenas.pin_owned();
        arenas.iter().flat_map(|(_, cell)| std::mem::take(&mut cell.lock().reservations)).collect()
    }
}

impl Reservation {
    pub fn new(base: u64, size: u64) -> Self {
        Self { base, size, extent: 0, mapped: BTreeSet::new() }
    }

    pub fn is_unmapped(&self) -> bool {
        self.mapped.is_empty()
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }

    /// The chunks of `range` that are not mapped.
    pub fn unmapped_chunks(&self, range: Segment, unit: u64) -> Vec<u64> {
        (0..range.size / unit).map(|k| range.base + k * unit).filter(|c| !self.mapped.contains(c)).collect()
    }

    /// The mapped chunks in `[lo, hi)`.
    pub fn mapped_chunks(&self, lo: u64, hi: u64) -> Vec<u64> {
        if lo >= hi {
            return Vec::new();
        }
        self.mapped.range(lo..hi).copied().collect()
    }

    pub fn note_mapped(&mut self, chunk: u64) {
        self.mapped.insert(chunk);
    }

    pub fn note_unmapped(&mut self, chunk: u64) {
        self.mapped.remove(&chunk);
    }

    /// Every mapped chunk (for the pool's drop).
    pub fn all_chunks(&self) -> Vec<u64> {
        self.mapped.iter().copied().collect()
    }
}
