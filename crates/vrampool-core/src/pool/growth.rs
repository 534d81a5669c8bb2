//! Growth and give-back: reserving from the device within the cap, and returning what is wholly free.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

impl PoolCore {
    /// Returns every wholly free segment to the device (`torch.cuda.empty_cache`); returns the
    /// bytes given back. Growths after it give back as a new pool's would, measured against
    /// what stays reserved rather than the pool's old high-water mark.
    pub fn trim(&self) -> Result<u64> {
        self.ensure_open()?;
        let released = self.release_free();
        // Design: below the old mark a growth gives nothing back, so after a trim at a step's
        // end each tier would regrow beside the others' idle memory and the next step reserve
        // more than the first (simulated, trimmed after each pass: gpt x8 1.035x of the bound
        // against 1.019x with the mark taken afresh).
        self.give_back_mark.store(self.committed.load(Relaxed), Relaxed);
        released
    }

    /// Alias of `trim`, under PyTorch's name.
    pub fn empty_cache(&self) -> Result<u64> {
        self.trim()
    }

    /// What a growth of `tier` for a block of `rounded` bytes will ask of the device (what an
    /// expandable range would map, at its end or in a hole, else a plain segment), and what of the
    /// tier's free memory it joins: where it extends the newest range at its end, the free bytes
    /// there; where it maps part of a hole, that part, whose free neighbours it joins.
    pub(super) fn growth_estimate(&self, arena: &Arena, tier: u8, rounded: u64) -> (u64, Option<u64>, Option<Segment>) {
        let strategy = self.lock_tier(arena, tier);
        let plain = strategy.segment_size_for(rounded);
        let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier) else { return (plain, None, None) };
        arena.with_vm(|vm_arena| {
            let newest = vm_arena.reservations.last().map(|r| r.base);
            let unmapped = |r: &Reservation, range: Segment| r.unmapped_bytes(range);
            let (mut tail, mut best): (Option<u64>, Option<(u64, Option<Segment>)>) = (None, None);
            for r in &vm_arena.reservations {
                let Some(plan) = strategy.plan_growth(r.base, rounded, vm.unit, &|range| unmapped(r, range)) else { continue };
                let end = Segment { base: r.base + r.extent, size: plan.at_end };
                if newest == Some(r.base) && r.extent + plan.at_end <= r.size {
                    tail = Some(plan.tail);
                    best = best.filter(|&(bytes, _)| bytes <= unmapped(r, end)).or(Some((unmapped(r, end), None)));
                }
                if let Some(hole) = plan.hole {
                    // As `grow_expandable` chooses: a hole when it costs no more than the end.
                    best = best.filter(|&(bytes, _)| bytes < unmapped(r, hole)).or(Some((unmapped(r, hole), Some(hole))));
                }
            }
            match best {
                Some((bytes, hole)) => (bytes, tail, hole),
                None => (round_up(rounded, vm.unit).unwrap_or(plain), None, None),
            }
        })
    }

    /// Counts `bytes` about to be asked of the device as committed, raising the high-water mark;
    /// out of memory, counting nothing, when that would pass the cap.
    pub(super) fn commit(&self, bytes: u64) -> Result<()> {
        let before = self.committed.fetch_add(bytes, Relaxed);
        if before.saturating_add(bytes) > self.cap.load(Relaxed) {
            self.committed.fetch_sub(bytes, Relaxed);
            return Err(DeviceError::OutOfMemory.into());
        }
        self.committed_high.fetch_max(before + bytes, Relaxed);
        self.give_back_mark.fetch_max(before + bytes, Relaxed);
        Ok(())
    }

    /// A new segment of `size` bytes from the device, within the cap.
    pub(super) fn grow(&self, size: u64, stream: StreamId) -> Result<u64> {
        self.commit(size)?;
        self.holding.note_growth(stream);
        self.counters.num_device_alloc.fetch_add(1, Relaxed);
        match self.device.alloc_segment(size) {
            Ok(base) => {
                self.counters.reserved_bytes.add(size);
                self.counters.segment.add(1);
                self.log(EventKind::SegmentAlloc, base, size, stream);
                Ok(base)
            }
            Err(e) => {
                self.committed.fetch_sub(size, Relaxed);
                Err(e.into())
            }
        }
    }

    /// Empties every thread's cache and the magazines into their strategies, then gives every
    /// wholly free segment back and unmaps every wholly free expandable chunk.
    pub(super) fn release_free(&self) -> Result<u64> {
        self.flush_caches();
        self.give_back_free(None, u64::MAX)
    }

    /// Gives back to the device wholly free segments and wholly free mappings of the expandable
    /// ranges, in every tier and stream: all of them for a `need` of `u64::MAX`, else enough for
    /// `need` bytes (see `choose_spares`). Before the growth of `growing`, that tier's newest
    /// expandable range keeps the free bytes at its end that the growth extends (see `spares`).
    /// The caches keep their blocks: see `release_free`.
    pub(super) fn give_back_free(&self, growing: Option<Growing>, need: u64) -> Result<u64> {
        let mut chosen = choose_spares(self.spares(growing), need);
        chosen.sort_unstable_by_key(|s| (s.stream, s.tier, s.reservation, s.range.base));
        let (mut bytes, mut first_error) = (0, None);
        // Design: the memory goes back once the streams whose blocks used it are idle, each
        // waited for alone: a context-wide sync would also wait for every other stream's work.
        // (Other streams that used a block were waited for through events before it was freed.)
        // A stream that cannot be waited for keeps its memory.
        let mut idle = Vec::new();
        for stream in chosen.iter().map(|s| s.stream).collect::<std::collections::BTreeSet<_>>() {
            match self.device.synchronize_stream(lanes::real(stream)) {
                Ok(()) => idle.push(stream),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        chosen.retain(|s| idle.contains(&s.stream));
        let mut released = Vec::new();
        for group in chosen.chunk_by(|a, b| (a.stream, a.tier) == (b.stream, b.tier)) {
            let (stream, tier) = (group[0].stream, group[0].tier);
            let arena = self.arena(stream);
            let mut strategy = self.lock_tier(arena, tier);
            let plain: Vec<Segment> = group.iter().filter(|s| s.reservation.is_none()).map(|s| s.range).collect();
            released.extend(strategy.release_segments(&plain).into_iter().map(|s| (s, stream, tier)));
            if self.vm.as_ref().is_some_and(|vm| vm.tier == tier) {
                let (unmapped, error) = self.unmap_spares(&mut **strategy, arena, group);
                bytes += unmapped;
                if let Some(e) = error {
                    first_error.get_or_insert(e);
                }
            }
        }
        for (segment, stream, tier) in released {
            self.counters.num_device_free.fetch_add(1, Relaxed);
            match self.device.free_segment(segment.base, segment.size) {
                Ok(()) => {
                    bytes += segment.size;
                    self.committed.fetch_sub(segment.size, Relaxed);
                    self.counters.reserved_bytes.sub(segment.size);
                    self.counters.segment.sub(1);
                    self.log(EventKind::SegmentFree, segment.base, segment.size, stream);
                }
                Err(e) => {
                    // Still the pool's: back into its tier, where snapshots show it and the next
                    // trim, close or drop tries again.
                    self.lock_tier(self.arena(stream), tier).add_segment(segment);
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(bytes),
            Some(e) => Err(e.into()),
        }
    }

    /// Everything a give-back could return: every tier's wholly free segments, and the mappings
    /// of the expandable ranges that lie wholly in free space (or past the range's end, where an
    /// unmap failed), less the free bytes at the end of the newest range of the tier growing, where
    /// the growth extends that range from them (`Growing::extended_tail`), less the free ranges
    /// beside the part of a hole that the growth maps, which it joins (`Growing::joined_hole`), less
    /// all of the growing tier's in the pool's first rise (`Growing::first_rise`), and less what
    /// the other lanes of its stream that a thread is in hold (`is_occupied_sibling`). Nothing else
    /// is kept for it: a growth that needs a new range had kept a whole 170 MiB range mapped beside
    /// the new one, and one that extends the last free range had kept the free ranges below it,
    /// past unmapped holes.
    pub(super) fn spares(&self, growing: Option<Growing>) -> Vec<Spare> {
        let mut spares = Vec::new();
        self.for_each_holding_arena(|arena| {
            let stream = arena.stream;
            if growing.is_some_and(|g| self.is_occupied_sibling(g.stream, stream)) {
                return;
            }
            for tier_index in 0..arena.tiers.len() as u8 {
                // A kept run's segment may be otherwise free: the lock files the run back first.
                let strategy = self.lock_tier(arena, tier_index);
                spares.extend(strategy.free_segments().into_iter().map(|range| Spare {
                    stream,
                    tier: tier_index,
                    range,
                    reservation: None,
                }));
                let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier_index) else { continue };
                let growing_here = growing.filter(|g| (g.stream, g.tier) == (stream, tier_index));
                // Design: unmapped in a rise, the tier's holes were mapped again by its next growths
                // and left partial units idle (a decode growing its caches by copy, 636 MiB: 1.049x
                // of its bound against 1.011x; the other tiers' idle memory still goes, which the
                // training traces' first steps need).
                if growing_here.is_some_and(|g| g.first_rise) {
                    continue;
                }
                let extended_tail = growing_here.and_then(|g| g.extended_tail);
                let joined_hole = growing_here.and_then(|g| g.joined_hole);
                arena.with_vm(|vm_arena| {
                    let newest = vm_arena.reservations.last().map(|r| r.base);
                    for r in &vm_arena.reservations {
                        let end = r.base + r.extent;
                        // A mapping is whole units and never spans a hole, so a wholly free one lies
                        // in one free range of a unit or more.
                        let mut free = strategy.free_ranges_at_least(r.base, vm.unit);
                        // Design: unmapped before the growth, they made it map a hole again beside
                        // the one it planned, and left partial units mapped and idle at each end (a
                        // decode growing its caches by copy: 1.077x of its bound against 1.049x).
                        if let Some(hole) = joined_hole.filter(|h| r.contains(h.base)) {
                            free.retain(|f| f.base + f.size != hole.base && f.base != hole.base + hole.size);
                        }
                        let kept_tail = extended_tail.filter(|_| newest == Some(r.base));
                        if let Some(tail) = kept_tail.filter(|_| free.last().is_some_and(|f| f.base + f.size == end)) {
                            // Only the tail's last free range: what lies below it the growth leaves
                            // as it is.
                            let last = free.pop().expect("a last free range");
                            let below = last.size.saturating_sub(tail);
                            free.extend((below > 0).then_some(Segment { base: last.base, size: below }));
                        }
                        free.push(Segment { base: end, size: r.base + r.size - end });
                        let mappings = free.iter().flat_map(|f| r.mappings_within(f.base, f.base + f.size));
                        spares.extend(mappings.map(|range| Spare { stream, tier: tier_index, range, reservation: Some(r.base) }));
                    }
                });
            }
        });
        spares
    }

    /// Gives the completed deferred frees, every thread's cache (busy, idle or exiting) and the
    /// magazines back to their strategies.
    pub(super) fn flush_caches(&self) {
        self.complete_deferred_frees();
        // Cached blocks keep their slabs from being wholly free: on the demo's traces, slab
        // segments holding only cached blocks were most of what hybrid reserved above the bound.
        let _one_flush = self.flushing.lock();
        let blocks = thread_cache::take_all(&self.thread_caches.lock());
        self.adopt(blocks);
        self.for_each_holding_arena(|arena| {
            // Locking the first tier files its kept run back, whether or not the magazines hold any of its blocks.
            drop(self.lock_tier(arena, 0));
            arena.magazines.drain(
                |_| true,
                |index, addr| {
                    let freed = self.file_back(&mut **self.lock_tier(arena, self.class_tier(index)), addr);
                    debug_assert!(freed.is_some(), "a cached block belongs to the tier of its size");
                },
            );
        });
    }
}

/// A growth under way in `tier` of `stream`'s arena; where it extends the newest expandable range
/// at its end, the free bytes there that it extends (`PoolCore::growth_estimate`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Growing {
    pub(super) stream: StreamId,
    pub(super) tier: u8,
    pub(super) extended_tail: Option<u64>,
    /// Where the growth maps part of a hole: that part. The free ranges beside it stay mapped.
    pub(super) joined_hole: Option<Segment>,
    /// Live memory has not yet fallen from a peak (`FastCounters::has_fallen`): the growing tier
    /// keeps its free memory, which the rest of the rise fills again.
    pub(super) first_rise: bool,
}

/// Memory a give-back can return to the device: a wholly free plain segment of a tier, or a
/// wholly free mapping of the tier's expandable range at `reservation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Spare {
    pub(super) stream: StreamId,
    pub(super) tier: u8,
    pub(super) range: Segment,
    pub(super) reservation: Option<u64>,
}

/// The spares to give back for `need` bytes: every one for `u64::MAX`; else, until the need is
/// met, the smallest spare that meets what is still needed, or the largest one if none does.
/// Design: a give-back is for the peak, and giving back more than the growth needs cannot lower
/// it; what stays reserved is reused without device calls, and each call gives back the most it
/// can.
pub(super) fn choose_spares(spares: Vec<Spare>, need: u64) -> Vec<Spare> {
    if need == u64::MAX {
        return spares;
    }
    // Largest first; ties in a fixed order, so that replays are deterministic. A growth asks this
    // of every wholly free mapping, thousands where the pool holds gigabytes, and takes a few: a
    // heap yields them largest first without sorting them all.
    let key = |i: usize| (Reverse(spares[i].range.size), spares[i].stream, spares[i].tier, spares[i].range.base, i);
    let mut heap: BinaryHeap<_> = (0..spares.len()).map(|i| Reverse(key(i))).collect();
    let mut chosen = Vec::new();
    let mut still = need;
    while still > 0 {
        let Some(&Reverse(first)) = heap.peek() else { break };
        let i = first.4;
        if spares[i].range.size >= still {
            // The smallest spare that meets the need: the last of those in the order.
            let meets = heap.iter().map(|&Reverse(k)| k).filter(|k| spares[k.4].range.size >= still);
            chosen.extend(meets.max().map(|k| spares[k.4]));
            break;
        }
        heap.pop();
        still -= spares[i].range.size;
        chosen.push(spares[i]);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes::MIB;

    #[test]
    fn a_growth_into_a_new_range_gives_back_the_free_tail_of_the_full_one() {
        // 240 MiB of the expandable tier's first range (256 MiB) used once and freed: a 300 MiB
        // block fits neither in its free tail nor at its end, so it takes a new range, and the
        // growth past the high-water mark gives the old range's memory back first.
        let mut config = PoolConfig::default();
        config.apply_text("large_min:1GB").unwrap();
        let pool = Pool::new(Arc::new(crate::device::SimDevice::new(64 << 30, crate::device::SimMode::AddressOnly)), config).unwrap();
        let blocks: Vec<u64> = (0..30).map(|_| pool.allocate(8 * MIB, StreamId(0)).unwrap()).collect();
        blocks.into_iter().for_each(|addr| pool.free(addr, None, None).unwrap());
        let before = pool.stats().reserved_bytes;
        assert_eq!(before.current, 240 * MIB);
        let addr = pool.allocate(300 * MIB, StreamId(0)).unwrap();
        let after = pool.stats().reserved_bytes;
        assert!(after.peak <= 302 * MIB, "{} MiB reserved at the peak, for 300 MiB live", after.peak / MIB);
        pool.free(addr, None, None).unwrap();
    }

    #[test]
    fn a_growth_at_the_end_gives_back_the_free_ranges_below_its_tail() {
        // The expandable range ends [8 MiB free][8 MiB unmapped][8 MiB free]: a 30 MiB block takes
        // the last 8 MiB and 22 MiB mapped past them, past the high-water mark, so the first 8 MiB
        // (which the growth does not use) go back first.
        let pool = Pool::new(Arc::new(crate::device::SimDevice::new(64 << 30, crate::device::SimMode::AddressOnly)), PoolConfig::default())
            .unwrap();
        let [a, b, c] = [0; 3].map(|_| pool.allocate(8 * MIB, StreamId(0)).unwrap());
        pool.free(b, None, None).unwrap();
        pool.trim().unwrap();
        pool.free(a, None, None).unwrap();
        pool.free(c, None, None).unwrap();
        assert_eq!(pool.stats().reserved_bytes.current, 16 * MIB);
        let addr = pool.allocate(30 * MIB, StreamId(0)).unwrap();
        assert_eq!(addr, c, "the free tail, grown");
        let reserved = pool.stats().reserved_bytes;
        assert_eq!((reserved.current, reserved.peak), (30 * MIB, 30 * MIB));
        pool.free(addr, None, None).unwrap();
    }

    #[test]
    fn a_growth_into_a_hole_keeps_the_free_range_it_joins() {
        // [a: 4 MiB free][b: 4 MiB unmapped][c, d: live]: a 6 MiB block fits in a and the low
        // half of b's hole, a growth past the mark (the trim took it to 12 MiB). The give-back
        // before it must leave a mapped: one map of 2 MiB, nothing unmapped.
        let pool = Pool::new(Arc::new(crate::device::SimDevice::new(64 << 30, crate::device::SimMode::AddressOnly)), PoolConfig::default())
            .unwrap();
        let [a, b, c, d] = [0; 4].map(|_| pool.allocate(4 * MIB, StreamId(0)).unwrap());
        assert_eq!((b, c, d), (a + 4 * MIB, a + 8 * MIB, a + 12 * MIB), "one expandable range");
        pool.free(b, None, None).unwrap();
        pool.trim().unwrap();
        pool.free(a, None, None).unwrap();
        let before = pool.stats();
        assert_eq!(before.reserved_bytes.current, 12 * MIB);
        let addr = pool.allocate(6 * MIB, StreamId(0)).unwrap();
        let after = pool.stats();
        assert_eq!(addr, a, "the free range and the hole beside it");
        assert_eq!(after.num_device_free, before.num_device_free, "nothing given back");
        assert_eq!(after.num_device_alloc, before.num_device_alloc + 1);
        assert_eq!(after.reserved_bytes.current, 14 * MIB);
        [addr, c, d].into_iter().for_each(|addr| pool.free(addr, None, None).unwrap());
    }

    #[test]
    fn in_the_first_rise_a_growth_keeps_its_tiers_free_memory_and_after_a_fall_gives_it_back() {
        // Five 8 MiB blocks, the second freed (live stays above three quarters of its peak), then a
        // 12 MiB block that fits nowhere: a growth past the high-water mark. In the first rise the
        // tier keeps the 8 MiB hole; once live memory has fallen from its peak, the hole goes back.
        let grown = |fall_first: bool| {
            let pool =
                Pool::new(Arc::new(crate::device::SimDevice::new(64 << 30, crate::device::SimMode::AddressOnly)), PoolConfig::default())
                    .unwrap();
            let mut blocks: Vec<u64> = (0..5).map(|_| pool.allocate(8 * MIB, StreamId(0)).unwrap()).collect();
            if fall_first {
                blocks.drain(1..).for_each(|addr| pool.free(addr, None, None).unwrap());
                pool.counters.fast.checkpoint();
                blocks.extend((0..4).map(|_| pool.allocate(8 * MIB, StreamId(0)).unwrap()));
            }
            assert_eq!(pool.counters.fast.has_fallen(), fall_first);
            pool.free(blocks.remove(1), None, None).unwrap();
            let before = pool.stats();
            blocks.push(pool.allocate(12 * MIB, StreamId(0)).unwrap());
            let after = pool.stats();
            blocks.into_iter().for_each(|addr| pool.free(addr, None, None).unwrap());
            (after.num_device_free - before.num_device_free, after.reserved_bytes.current)
        };
        assert_eq!(grown(false), (0, 52 * MIB), "the first rise keeps the hole");
        let (given_back, reserved) = grown(true);
        assert!(given_back > 0 && reserved == 44 * MIB, "after a fall the hole goes back: {given_back} unmaps, {} MiB", reserved / MIB);
    }

    fn spare(size_mib: u64, base: u64) -> Spare {
        Spare { stream: StreamId(0), tier: 1, range: Segment { base: base * MIB, size: size_mib * MIB }, reservation: None }
    }

    fn sizes(chosen: &[Spare]) -> Vec<u64> {
        chosen.iter().map(|s| s.range.size / MIB).collect()
    }

    #[test]
    fn spares_for_a_need_are_the_smallest_that_covers_it_else_the_largest_first() {
        let all = vec![spare(8, 0), spare(2, 100), spare(32, 200), spare(2, 300), spare(4, 400)];
        assert_eq!(sizes(&choose_spares(all.clone(), 3 * MIB)), vec![4], "4 MiB covers 3, 8 and 32 are more than needed");
        assert_eq!(sizes(&choose_spares(all.clone(), 8 * MIB)), vec![8]);
        assert_eq!(sizes(&choose_spares(all.clone(), 40 * MIB)), vec![32, 8]);
        assert_eq!(sizes(&choose_spares(all.clone(), 45 * MIB)), vec![32, 8, 4, 2], "the last 1 MiB: a 2 MiB spare");
        assert_eq!(sizes(&choose_spares(all.clone(), 100 * MIB)), vec![32, 8, 4, 2, 2], "all of them, short of the need");
        assert!(choose_spares(all.clone(), 0).is_empty());
        assert_eq!(choose_spares(all.clone(), u64::MAX), all, "everything, for a trim");
        // Of equal spares, the same one whatever the order they come in: replays are deterministic.
        let reversed: Vec<Spare> = all.iter().rev().copied().collect();
        assert_eq!(choose_spares(all, MIB), choose_spares(reversed, MIB));
    }

    /// The rule as written: sort largest first, then take the smallest that meets what is still
    /// needed, else the largest.
    fn chosen_by_sorting(mut spares: Vec<Spare>, need: u64) -> Vec<Spare> {
        spares.sort_by_key(|s| (Reverse(s.range.size), s.stream, s.tier, s.range.base));
        let (mut chosen, mut still) = (Vec::new(), need);
        while still > 0 && !spares.is_empty() {
            let meets = spares.partition_point(|s| s.range.size >= still);
            let spare = spares.remove(meets.saturating_sub(1));
            still = still.saturating_sub(spare.range.size);
            chosen.push(spare);
        }
        chosen
    }

    #[test]
    fn the_heap_chooses_as_sorting_all_would() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |below: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % below
        };
        for _ in 0..2_000 {
            let spares: Vec<Spare> = (0..next(40))
                .map(|base| Spare {
                    stream: StreamId(next(3)),
                    tier: next(2) as u8,
                    range: Segment { base: base * 64 * MIB, size: (1 + next(8)) * 2 * MIB },
                    reservation: None,
                })
                .collect();
            let need = next(100) * MIB;
            assert_eq!(choose_spares(spares.clone(), need), chosen_by_sorting(spares, need), "need {need}");
        }
    }
}
