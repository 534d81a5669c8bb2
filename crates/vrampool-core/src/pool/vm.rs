//! Expandable segments: growing and shrinking a reservation by mapping and unmapping its pieces.

use super::growth::Spare;
use super::*;

impl PoolCore {
    /// Grows the arena's expandable segment so that a block of `rounded` bytes fits: maps part of
    /// an unmapped hole again where that maps no more than growing at the end would, else maps
    /// chunks at the end of the newest range (reserving a larger range when it is full). Ok(false)
    /// when no range can take it (reserving failed, or the block is larger than any range may
    /// be): the caller adds a plain segment. Runs under the tier's strategy lock.
    pub(super) fn grow_expandable(&self, vm: &Expandable, strategy: &mut dyn Strategy, arena: &Arena, rounded: u64) -> Result<bool> {
        let (unit, stream) = (vm.unit, arena.stream);
        arena.with_vm(|vm_arena| {
            if vm_arena.unavailable {
                return Ok(false);
            }
            let unmapped = |r: &Reservation, range: Segment| r.unmapped_bytes(range);
            let plans: Vec<_> =
                vm_arena.reservations.iter().map(|r| strategy.plan_growth(r.base, rounded, unit, &|range| unmapped(r, range))).collect();
            // The cheapest hole to map again, in any range.
            let mut hole: Option<(usize, Segment, u64)> = None;
            for (i, h) in plans.iter().enumerate().filter_map(|(i, p)| Some((i, p.as_ref()?.hole?))) {
                let cost = unmapped(&vm_arena.reservations[i], h);
                if hole.is_none_or(|(_, best, c)| (cost, h.size) < (c, best.size)) {
                    hole = Some((i, h, cost));
                }
            }
            // Growth at the end of the newest range, if it has room.
            let newest = vm_arena.reservations.len().checked_sub(1);
            let at_end = newest.and_then(|i| {
                let r = &vm_arena.reservations[i];
                let grow = match plans[i] {
                    Some(plan) => plan.at_end,
                    None if r.extent == 0 => round_up(rounded, unit)?,
                    None => return None, // the strategy lost the segment: leave this range be
                };
                let fits = r.extent.checked_add(grow).is_some_and(|end| end <= r.size);
                fits.then_some((i, Segment { base: r.base + r.extent, size: grow }))
            });
            let (i, range, into_hole) = match (hole, at_end) {
                (Some((i, h, cost)), end) if end.is_none_or(|(j, e)| cost <= unmapped(&vm_arena.reservations[j], e)) => (i, h, true),
                (_, Some((i, end))) => (i, end, false),
                (_, None) => {
                    // The newest range is full (or there is none): reserve a larger one.
                    let Some(size) = vm.next_reservation(vm_arena.reservations.last().map(|r| r.size), rounded) else {
                        return Ok(false);
                    };
                    match self.device.reserve(size) {
                        Ok(base) if base % unit == 0 => vm_arena.reservations.push(Reservation::new(base, size)),
                        other => {
                            if let Ok(base) = other {
                                let _ = self.device.unreserve(base, size);
                            }
                            // No more address space (or the device cannot reserve): plain
                            // segments from now on.
                            vm_arena.unavailable = true;
                            return Ok(false);
                        }
                    }
                    let Some(grow) = round_up(rounded, unit) else { return Ok(false) };
                    (
                        vm_arena.reservations.len() - 1,
                        Segment { base: vm_arena.reservations[vm_arena.reservations.len() - 1].base, size: grow },
                        false,
                    )
                }
            };
            let r = &mut vm_arena.reservations[i];
            let mapped = self.map_range(r, range, unit, stream);
            let taken = mapped.is_ok() && if into_hole { strategy.map_hole(range) } else { strategy.grow_segment(r.base, range.size) };
            if taken {
                if !into_hole {
                    r.extent += range.size;
                }
                return Ok(true);
            }
            if mapped.is_ok() {
                debug_assert!(false, "the strategy refused memory mapped for it");
                let mappings = r.mappings_within(range.base, range.base + range.size);
                self.unmap_ranges(r, mappings, stream);
            }
            // A range reserved just now with nothing mapped goes back at once.
            if r.extent == 0 && r.is_unmapped() && self.device.unreserve(r.base, r.size).is_ok() {
                vm_arena.reservations.remove(i);
            }
            mapped.map(|()| false)
        })
    }

    /// Maps what `range` (whole units) lacks, within the cap, in at most `MAPS_PER_GROWTH`
    /// pieces per unmapped part, each at least a `PIECES_PER_HIGH_WATER`th of the high-water mark
    /// (see `expandable::pieces`). On a failure, unmaps what it mapped and returns the error.
    pub(super) fn map_range(&self, r: &mut Reservation, range: Segment, unit: u64, stream: StreamId) -> Result<()> {
        let least = self.committed_high.load(Relaxed) / PIECES_PER_HIGH_WATER;
        let gaps: Vec<Segment> = r.gaps(range).into_iter().flat_map(|gap| pieces(gap, unit, least)).collect();
        let total: u64 = gaps.iter().map(|g| g.size).sum();
        self.commit(total)?;
        self.holding.note_growth(stream);
        for (k, &gap) in gaps.iter().enumerate() {
            self.counters.num_device_alloc.fetch_add(1, Relaxed);
            if let Err(e) = self.device.map(gap.base, gap.size) {
                self.committed.fetch_sub(gaps[k..].iter().map(|g| g.size).sum::<u64>(), Relaxed);
                self.unmap_ranges(r, gaps[..k].to_vec(), stream);
                return Err(e.into());
            }
            if r.is_unmapped() {
                self.counters.segment.add(1);
            }
            r.note_mapped(gap);
            self.counters.reserved_bytes.add(gap.size);
            self.log(EventKind::SegmentAlloc, gap.base, gap.size, stream);
        }
        Ok(())
    }

    /// Unmaps `mappings` (whole mappings of `r`); returns the bytes given back, the mappings that
    /// failed to unmap (they stay mapped and counted) and the first error.
    pub(super) fn unmap_ranges(
        &self,
        r: &mut Reservation,
        mappings: Vec<Segment>,
        stream: StreamId,
    ) -> (u64, Vec<Segment>, Option<DeviceError>) {
        let (mut bytes, mut kept, mut first_error) = (0, Vec::new(), None);
        for m in mappings {
            self.counters.num_device_free.fetch_add(1, Relaxed);
            match self.device.unmap(m.base, m.size) {
                Ok(()) => {
                    r.note_unmapped(m);
                    bytes += m.size;
                    self.committed.fetch_sub(m.size, Relaxed);
                    self.counters.reserved_bytes.sub(m.size);
                    self.log(EventKind::SegmentFree, m.base, m.size, stream);
                    if r.is_unmapped() {
                        self.counters.segment.sub(1);
                    }
                }
                Err(e) => {
                    kept.push(m);
                    first_error.get_or_insert(e);
                }
            }
        }
        (bytes, kept, first_error)
    }

    /// Unmaps the mappings among `chosen` (spares of this stream's expandable tier): each becomes
    /// a hole in the strategy, the hole at a range's end is cut off, and a range with nothing
    /// mapped is unreserved. A mapping that fails to unmap stays mapped, as free space. Runs
    /// under the tier's strategy lock, device calls included: a growth could otherwise take
    /// memory as mapped while it is unmapped.
    pub(super) fn unmap_spares(&self, strategy: &mut dyn Strategy, arena: &Arena, chosen: &[Spare]) -> (u64, Option<DeviceError>) {
        let stream = arena.stream;
        arena.with_vm(|vm_arena| {
            let (mut bytes, mut first_error) = (0, None);
            vm_arena.reservations.retain_mut(|r| {
                let end = r.base + r.extent;
                // Another give-back may have unmapped a spare since it was chosen.
                let mine: Vec<Segment> =
                    chosen.iter().filter(|s| s.reservation == Some(r.base) && r.has_mapping(s.range)).map(|s| s.range).collect();
                if mine.is_empty() {
                    r.extent -= strategy.cut_unmapped_tail(r.base);
                    return true;
                }
                let (inside, past_end): (Vec<Segment>, Vec<Segment>) = mine.into_iter().partition(|m| m.base < end);
                let mut mappings = strategy.unmap_free_ranges(r.base, &inside);
                mappings.extend(past_end);
                let (unmapped, kept, error) = self.unmap_ranges(r, mappings, stream);
                for m in kept.into_iter().filter(|m| m.base < end) {
                    let restored = strategy.map_hole(m);
                    debug_assert!(restored, "a mapping just made a hole is one");
                }
                bytes += unmapped;
                if let Some(e) = error {
                    first_error.get_or_insert(e);
                }
                r.extent -= strategy.cut_unmapped_tail(r.base);
                if r.extent != 0 || !r.is_unmapped() {
                    return true;
                }
                match self.device.unreserve(r.base, r.size) {
                    Ok(()) => false,
                    Err(e) => {
                        first_error.get_or_insert(e);
                        true
                    }
                }
            });
            (bytes, first_error)
        })
    }
}
