use super::*;
use crate::sizes::KIB;

fn seg(base: u64, size: u64) -> Segment {
    Segment { base, size }
}

fn info(addr: u64, size: u64, allocated: bool) -> BlockInfo {
    BlockInfo { addr, size, allocated }
}

#[test]
fn bins_are_monotone_and_tight() {
    let mut last = 0;
    let mut lowest_in_bin = MIN_BLOCK;
    let mut size = MIN_BLOCK;
    while size < 1 << 40 {
        let bin = bin_of(size);
        assert!(bin >= last && bin < BINS, "size {size} bin {bin}");
        if bin != last {
            lowest_in_bin = size;
        }
        assert!(size - lowest_in_bin <= lowest_in_bin / 16, "size {size} shares a bin with {lowest_in_bin}");
        last = bin;
        size += MIN_BLOCK.max((size / 97) & !(MIN_BLOCK - 1));
    }
    assert!(bin_of(u64::MAX) < BINS);
    assert_eq!(bin_of(0), 0);
}

#[test]
fn crowded_bins_stay_correct() {
    // 200 free holes of 64..76 KiB (one bin) between live 512 B blocks.
    let mut b = BestFit::default();
    b.add_segment(seg(0, 64 * MIB));
    let holes: Vec<_> = (0..200u64)
        .map(|k| {
            let hole = b.allocate(64 * KIB + (k * 7 % 25) * 512).unwrap();
            b.allocate(512).unwrap();
            hole
        })
        .collect();
    for h in &holes {
        b.free(h.addr).unwrap();
    }
    let want = 64 * KIB + 24 * 512;
    let got = b.allocate(want).unwrap();
    assert_eq!(got.size, want, "an exact fit");
    // 64.5 KiB fits one of the 64.5 KiB holes (k = 18, 43, ...) exactly: nothing is split off.
    let got = b.allocate(64 * KIB + 512).unwrap();
    assert!(holes.iter().any(|h| h.addr == got.addr && h.size == got.size), "{got:?}");
}

#[test]
fn segment_sizes() {
    let b = BestFit::default();
    assert_eq!(b.segment_size_for(512), 2 * MIB);
    assert_eq!(b.segment_size_for(MIB), 2 * MIB);
    assert_eq!(b.segment_size_for(MIB + 512), 4 * MIB, "room for two, in 2 MiB units");
    assert_eq!(b.segment_size_for(3 * MIB), 6 * MIB);
    assert_eq!(b.segment_size_for(10 * MIB - 512), 20 * MIB);
    assert_eq!(b.segment_size_for(10 * MIB), 10 * MIB);
    assert_eq!(b.segment_size_for(10 * MIB + 512), 12 * MIB);
    assert_eq!(b.segment_size_for(u64::MAX), !(2 * MIB - 1));
}

#[test]
fn splits_and_merges_both_sides() {
    let mut b = BestFit::default();
    b.add_segment(seg(0, 2 * MIB));
    let x = b.allocate(64 * KIB).unwrap();
    let y = b.allocate(1000).unwrap();
    let z = b.allocate(4 * KIB).unwrap();
    assert_eq!((x.addr, y.addr, y.size, z.addr), (0, 64 * KIB, 1024, 65 * KIB));
    assert_eq!(b.usage().allocated, 69 * KIB);
    b.free(x.addr).unwrap();
    b.free(z.addr).unwrap();
    assert_eq!(b.snapshot()[0].1, vec![info(0, 64 * KIB, false), info(64 * KIB, KIB, true), info(65 * KIB, 2 * MIB - 65 * KIB, false)]);
    assert_eq!(b.free(y.addr), Some(KIB));
    assert_eq!(b.snapshot()[0].1, vec![info(0, 2 * MIB, false)]);
    assert_eq!(b.nodes.len() - b.spare.len(), 1);
}

#[test]
fn picks_the_smallest_fitting_range() {
    let mut b = BestFit::default();
    b.add_segment(seg(0, 2 * MIB));
    // Carve free holes of 64, 16, 32 and 16 KiB separated by live blocks.
    let sizes = [64, 4, 16, 4, 32, 4, 16, 4];
    let blocks: Vec<_> = sizes.iter().map(|&k| b.allocate(k * KIB).unwrap()).collect();
    for i in [0, 2, 4, 6] {
        b.free(blocks[i].addr).unwrap();
    }
    assert_eq!(b.allocate(20 * KIB).unwrap().addr, blocks[4].addr, "32 KiB hole, not 64 KiB");
    let twins = [b.allocate(16 * KIB).unwrap().addr, b.allocate(16 * KIB).unwrap().addr];
    assert!(twins.contains(&blocks[2].addr) && twins.contains(&blocks[6].addr), "the two 16 KiB holes");
    assert_eq!(b.allocate(12 * KIB).unwrap().addr, blocks[4].addr + 20 * KIB, "12 KiB left of 32");
    assert_eq!(b.allocate(48 * KIB).unwrap().addr, 0);
}

/// Free ranges of `sizes` in address order, each followed by a live 512 B block so that none
/// merges with the next; returns the addresses. They are freed in address order, so a bin's
/// list meets them in the opposite order (each freed range goes in front).
fn holes(b: &mut BestFit, sizes: &[u64]) -> Vec<u64> {
    let ranges: Vec<u64> = sizes
        .iter()
        .map(|&size| {
            let range = b.allocate(size).unwrap().addr;
            b.allocate(512).unwrap();
            range
        })
        .collect();
    for &addr in &ranges {
        b.free(addr).unwrap();
    }
    ranges
}

#[test]
fn best_fit_is_not_first_fit_across_bins() {
    // In address order: 1 MiB, 96 KiB, 65 KiB. First fit would cut 64.5 KiB from the 1 MiB
    // range, many bins above the 65 KiB one that best fit takes.
    let mut b = BestFit::default();
    b.add_segment(seg(0, 4 * MIB));
    let at = holes(&mut b, &[MIB, 96 * KIB, 65 * KIB]);
    assert_ne!(bin_of(MIB), bin_of(65 * KIB));
    assert_eq!(b.allocate(64 * KIB + 512).unwrap().addr, at[2]);
    assert_eq!(b.allocate(90 * KIB).unwrap().addr, at[1]);
}

#[test]
fn best_fit_is_not_first_fit_inside_a_bin() {
    // 65.5 and 67.5 KiB share the bin [64, 68) KiB; the bin's list meets 67.5 KiB first.
    for request in [65 * KIB, 63 * KIB + 512] {
        let mut b = BestFit::default();
        b.add_segment(seg(0, 2 * MIB));
        let at = holes(&mut b, &[65 * KIB + 512, 67 * KIB + 512]);
        assert_eq!(bin_of(65 * KIB + 512), bin_of(67 * KIB + 512));
        // 65 KiB searches its own bin; 63.5 KiB (bin [62, 64) KiB, empty) the next one.
        assert_eq!(b.allocate(request).unwrap().addr, at[0], "request {request}: the smaller range of the bin");
        assert_eq!(b.allocate(request).unwrap().addr, at[1], "request {request}");
    }
}

#[test]
fn best_fit_is_exact_in_a_crowded_bin() {
    // 40 ranges of one bin, more than a scan looks at: the smallest (65.5 KiB) is met last.
    let mut b = BestFit::default();
    b.add_segment(seg(0, 8 * MIB));
    let sizes: Vec<u64> = std::iter::once(65 * KIB + 512).chain((0..39).map(|k| 66 * KIB + (k % 4) * 512)).collect();
    assert!(sizes.len() > SCAN_LIMIT as usize && sizes.iter().all(|&s| bin_of(s) == bin_of(64 * KIB)));
    let at = holes(&mut b, &sizes);
    let size_at = |addr: u64| sizes[at.iter().position(|&a| a == addr).unwrap()];
    assert_eq!(size_at(b.allocate(63 * KIB + 512).unwrap().addr), 65 * KIB + 512, "from the next bin");
    // Each request takes the smallest range left, as the bin empties (and stops being crowded).
    let mut taken: Vec<u64> = (1..sizes.len()).map(|_| size_at(b.allocate(65 * KIB).unwrap().addr)).collect();
    let mut sorted = taken.clone();
    sorted.sort_unstable();
    assert_eq!(taken, sorted);
    taken.dedup();
    assert_eq!(taken, [66 * KIB, 66 * KIB + 512, 67 * KIB, 67 * KIB + 512]);
    check_invariants(&b);
}

#[test]
fn remainder_rule() {
    let mut b = BestFit::new(BestFitConfig { min_split_remainder: 64 * KIB });
    b.add_segment(seg(0, 2 * MIB));
    let whole = b.allocate(2 * MIB - 63 * KIB).unwrap();
    assert_eq!(whole.size, 2 * MIB, "63 KiB left: too little to split");
    assert_eq!(b.usage().allocated, 2 * MIB);
    assert_eq!(b.free(0), Some(2 * MIB));
    let split = b.allocate(2 * MIB - 64 * KIB).unwrap();
    assert_eq!(split.size, 2 * MIB - 64 * KIB);
    assert_eq!(b.usage().largest_free, 64 * KIB);

    let mut b = BestFit::default();
    b.add_segment(seg(0, 2 * MIB));
    assert_eq!(b.allocate(2 * MIB - 512).unwrap().size, 2 * MIB - 512);
    assert_eq!(b.allocate(512).unwrap(), Block { addr: 2 * MIB - 512, size: 512 });
    assert_eq!(BestFit::new(BestFitConfig { min_split_remainder: 0 }).config().min_split_remainder, 512);
}

#[test]
fn adjacent_segments_never_merge_and_are_released() {
    let mut b = BestFit::default();
    b.add_segment(seg(0, 2 * MIB));
    b.add_segment(seg(2 * MIB, 2 * MIB));
    let x = b.allocate(2 * MIB).unwrap();
    let y = b.allocate(2 * MIB).unwrap();
    assert!(b.allocate(512).is_none());
    b.free(y.addr).unwrap();
    b.free(x.addr).unwrap();
    assert_eq!(b.usage().largest_free, 2 * MIB);
    assert!(b.allocate(3 * MIB).is_none());
    let held = b.allocate(512).unwrap();
    let (holding, other) = if held.addr < 2 * MIB { (0, 2 * MIB) } else { (2 * MIB, 0) };
    assert_eq!(b.release_free_segments(), vec![seg(other, 2 * MIB)]);
    assert_eq!(b.usage().reserved, 2 * MIB);
    b.free(held.addr).unwrap();
    assert_eq!(b.release_free_segments(), vec![seg(holding, 2 * MIB)]);
    assert_eq!(b.usage(), Usage::default());
}

#[test]
fn extreme_sizes_do_not_panic() {
    let mut b = BestFit::default();
    b.add_segment(seg(0, 2 * MIB));
    for size in [u64::MAX, u64::MAX - 511, 1 << 63] {
        assert_eq!(b.allocate(size), None);
    }
    assert_eq!(b.allocate(0).unwrap().size, 512);
    assert_eq!(b.allocate(1).unwrap().size, 512);
    b.add_segment(seg(u64::MAX - 512, 4 * MIB));
    b.add_segment(seg(MIB, 2 * MIB));
    b.add_segment(seg(8 * MIB, 0));
    assert_eq!(b.usage().segments, 1);
}

/// Checks what every strategy state must satisfy: runs tile, reserved is their sum, live
/// blocks lie inside runs.
fn check_invariants(b: &BestFit) {
    let snapshot = b.snapshot();
    let mut reserved = 0;
    let mut allocated = 0;
    for (segment, blocks) in &snapshot {
        let mut cursor = segment.base;
        for block in blocks {
            assert_eq!(block.addr, cursor, "{snapshot:?}");
            assert!(block.size > 0);
            cursor += block.size;
            if block.allocated {
                allocated += block.size;
                assert!(b.live.contains_key(&block.addr), "an allocated node in a run is live");
            }
        }
        assert_eq!(cursor, segment.base + segment.size);
        reserved += segment.size;
    }
    assert_eq!(reserved, b.usage().reserved);
    assert_eq!(allocated, b.usage().allocated);
    assert_eq!(b.live.len() as u64, b.usage().live_blocks);
    // Each bin's count is its list's length, and `crowded` holds the crowded bins' ranges.
    let mut indexed = 0;
    for bin in 0..BINS {
        let (mut len, mut i) = (0, b.bin_heads[bin]);
        while i != NIL {
            let n = b.node(i);
            assert!(!b.is_crowded(bin) || b.crowded.get(&(n.size, n.addr)) == Some(&i), "bin {bin}");
            len += 1;
            i = n.bin_next;
        }
        if b.is_crowded(bin) {
            assert_eq!(len, b.crowded_counts[bin], "bin {bin}");
            assert!(len > SCAN_LIMIT / 2, "bin {bin} of {len} ranges is still crowded");
            indexed += len;
        }
    }
    assert_eq!(indexed as usize, b.crowded.len());
    // Each expandable segment's unused ranges, from the bins and holes, are its nodes' that hold no block.
    for (&base, &marker) in &b.ends {
        let (mut walked, mut i) = (Vec::<Segment>::new(), b.segments[&base].1);
        while i != marker {
            let n = *b.node(i);
            if !n.allocated || b.is_hole(i) {
                match walked.last_mut() {
                    Some(last) if last.base + last.size == n.addr => last.size += n.size,
                    _ => walked.push(seg(n.addr, n.size)),
                }
            }
            i = n.next;
        }
        assert_eq!(b.unused_ranges(base), walked, "segment at {base}");
        // Its free ranges of at least a size are its free nodes of that size or more.
        for least in [1, MIN_BLOCK, 4 * MIN_BLOCK + 1, 1 << 20, 2 << 20] {
            let (mut free, mut i) = (Vec::new(), b.segments[&base].1);
            while i != marker {
                let n = *b.node(i);
                if !n.allocated && n.size >= least {
                    free.push(seg(n.addr, n.size));
                }
                i = n.next;
            }
            assert_eq!(b.free_ranges_at_least(base, least), free, "segment at {base}, at least {least}");
        }
    }
}

#[test]
fn random_crowded_bins_give_the_exact_best_fit() {
    // Sizes of a few neighbouring bins; 1,500 blocks, then 1,000 of them freed (each range
    // apart from the next), then random frees and allocations. Every allocation must take a
    // smallest free range that fits, as a search over the snapshot finds it.
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut b = BestFit::default();
    b.add_segment(seg(0, 256 * MIB));
    let mut live: Vec<Block> = Vec::new();
    let allocate = |b: &mut BestFit, live: &mut Vec<Block>, r: u64, check: bool| {
        let size = 48 * KIB + 512 * (r % 64);
        let free: Vec<BlockInfo> =
            if check { b.snapshot().into_iter().flat_map(|(_, blocks)| blocks).filter(|x| !x.allocated).collect() } else { Vec::new() };
        let block = b.allocate(size).unwrap();
        if check {
            let best = free.iter().filter(|x| x.size >= size).map(|x| x.size).min().unwrap();
            let range = free.iter().find(|x| x.addr == block.addr).expect("a block is cut from the start of a free range");
            assert_eq!(range.size, best, "{size} B from a {} B range, the best is {best} B", range.size);
        }
        live.push(block);
        // A 512 B block after it, never freed, so that freed ranges stay apart.
        b.allocate(512).unwrap();
    };
    for _ in 0..1500 {
        allocate(&mut b, &mut live, next() >> 8, false);
    }
    for _ in 0..1000 {
        let block = live.swap_remove((next() >> 8) as usize % live.len());
        b.free(block.addr).unwrap();
    }
    check_invariants(&b);
    let mut crowded_bins = 0;
    for step in 0..3000 {
        let r = next();
        if r % 2 == 0 {
            let block = live.swap_remove((r >> 8) as usize % live.len());
            assert_eq!(b.free(block.addr), Some(block.size));
        } else {
            allocate(&mut b, &mut live, r >> 8, true);
        }
        if step % 97 == 0 {
            check_invariants(&b);
        }
        crowded_bins = crowded_bins.max((0..BINS).filter(|&bin| b.is_crowded(bin)).count());
    }
    assert!(crowded_bins >= 4, "{crowded_bins} crowded bins at most");
    check_invariants(&b);
}

#[test]
fn grow_segment_extends_the_free_tail_and_blocks_span_the_old_end() {
    let mut b = BestFit::default();
    assert!(b.grow_segment(64 * MIB, 2 * MIB), "no segment yet: starts one");
    let x = b.allocate(3 * MIB / 2).unwrap();
    assert!(b.allocate(MIB).is_none());
    assert!(b.grow_segment(64 * MIB, 2 * MIB));
    assert_eq!(
        b.snapshot(),
        vec![(seg(64 * MIB, 4 * MIB), vec![info(x.addr, 3 * MIB / 2, true), info(x.addr + 3 * MIB / 2, 5 * MIB / 2, false)])]
    );
    let y = b.allocate(5 * MIB / 2).unwrap();
    assert_eq!(y.addr, 64 * MIB + 3 * MIB / 2, "one block across the old end");
    assert!(b.allocate(512).is_none());
    // The tail is allocated: growth adds a new free range after it.
    assert!(b.grow_segment(64 * MIB, 2 * MIB));
    assert_eq!(b.allocate(2 * MIB).unwrap().addr, 68 * MIB);
    assert_eq!(b.usage().reserved, 6 * MIB);
    assert_eq!(b.usage().segments, 1);
    check_invariants(&b);

    // Plain segments do not grow; growth never overlaps another segment.
    b.add_segment(seg(0, 2 * MIB));
    assert!(!b.grow_segment(0, 2 * MIB));
    b.add_segment(seg(72 * MIB, 2 * MIB));
    assert!(!b.grow_segment(64 * MIB, 4 * MIB), "would run into the segment at 72 MiB");
    assert!(b.grow_segment(64 * MIB, 2 * MIB), "up to it is fine");
    assert!(!b.grow_segment(MIB, 2 * MIB), "a new one inside a segment");
    assert!(!b.grow_segment(80 * MIB, 0) && !b.grow_segment(80 * MIB, 100));
    assert!(!b.grow_segment(u64::MAX - 511, 2 * MIB));
    check_invariants(&b);
}

/// The whole units of `b`'s free space at `base` made holes (as the pool unmaps mappings of
/// one unit), and the hole at the end cut off: (bytes made holes, bytes the end moved).
fn unmap_free_units(b: &mut BestFit, base: u64, unit: u64) -> (u64, u64) {
    let units: Vec<Segment> = b
        .unused_ranges(base)
        .iter()
        .flat_map(|r| {
            let lo = base + (r.base - base).div_ceil(unit) * unit;
            let hi = base + (r.base + r.size - base) / unit * unit;
            (lo..hi).step_by(unit as usize).map(move |at| seg(at, unit))
        })
        .collect();
    let holes = b.unmap_free_ranges(base, &units).iter().map(|h| h.size).sum();
    (holes, b.cut_unmapped_tail(base))
}

#[test]
fn free_ranges_become_holes_and_the_tail_hole_is_cut() {
    let mut b = BestFit::default();
    assert!(b.grow_segment(0, 8 * MIB));
    let x = b.allocate(3 * MIB).unwrap();
    assert_eq!(b.unused_ranges(0), vec![seg(3 * MIB, 5 * MIB)]);
    let asked = [seg(2 * MIB, 2 * MIB), seg(4 * MIB, 2 * MIB), seg(6 * MIB, 2 * MIB)];
    assert_eq!(b.unmap_free_ranges(0, &asked), asked[1..].to_vec(), "[2, 4) MiB holds the block");
    assert_eq!(b.cut_unmapped_tail(0), 4 * MIB, "the two holes are one, at the end");
    assert_eq!(b.snapshot(), vec![(seg(0, 4 * MIB), vec![info(0, 3 * MIB, true), info(3 * MIB, MIB, false)])]);
    assert_eq!(b.usage().reserved, 4 * MIB);
    assert_eq!(b.cut_unmapped_tail(0), 0, "the tail is free space, not a hole");
    assert!(b.unmap_free_ranges(0, &[seg(3 * MIB + 1, 512)]).is_empty(), "not aligned");
    assert!(b.unmap_free_ranges(0, &[seg(3 * MIB, 2 * MIB)]).is_empty(), "runs past the free range");
    let y = b.allocate(MIB).unwrap();
    assert!(b.unused_ranges(0).is_empty());
    b.free(x.addr).unwrap();
    b.free(y.addr).unwrap();
    assert_eq!(b.unmap_free_ranges(0, &[seg(2 * MIB, 2 * MIB)]), vec![seg(2 * MIB, 2 * MIB)]);
    assert!(b.unmap_free_ranges(0, &[seg(2 * MIB, 2 * MIB)]).is_empty(), "a hole is not unmapped twice");
    assert_eq!(b.unused_ranges(0), vec![seg(0, 4 * MIB)], "free space and the hole, as one range");
    assert_eq!(unmap_free_units(&mut b, 0, 2 * MIB), (2 * MIB, 4 * MIB), "only a hole left: the segment goes");
    assert_eq!(b.usage(), Usage::default());
    assert!(b.snapshot().is_empty());
    assert_eq!(b.cut_unmapped_tail(0), 0);
    assert!(b.grow_segment(0, 2 * MIB), "and can start again");
    // Plain segments are not touched.
    b.add_segment(seg(64 * MIB, 4 * MIB));
    assert!(b.unused_ranges(64 * MIB).is_empty());
    assert!(b.unmap_free_ranges(64 * MIB, &[seg(64 * MIB, 2 * MIB)]).is_empty());
    assert_eq!(b.usage().reserved, 6 * MIB);
    assert_eq!(b.free_segments(), vec![seg(64 * MIB, 4 * MIB)], "an expandable segment is never wholly free");
    assert!(b.release_segments(&[seg(64 * MIB, 2 * MIB), seg(0, 2 * MIB)]).is_empty(), "not a segment's size, not a plain segment");
    assert!(b.release_free_segments() == vec![seg(64 * MIB, 4 * MIB)]);
    check_invariants(&b);
}

#[test]
fn free_chunks_inside_become_holes_that_map_back() {
    const U: u64 = 2 * MIB;
    let holes_cost = |h: Segment| h.size;
    let mut b = BestFit::default();
    assert!(b.grow_segment(0, 10 * MIB));
    let a = b.allocate(MIB).unwrap();
    let hole_block = b.allocate(6 * MIB).unwrap();
    let c = b.allocate(MIB).unwrap();
    b.free(hole_block.addr).unwrap();
    assert_eq!(unmap_free_units(&mut b, 0, U), (6 * MIB, 2 * MIB), "[2, 6) inside, the free [8, 10) MiB tail");
    assert_eq!(unmap_free_units(&mut b, 0, U), (0, 0), "nothing whole left");
    assert_eq!(
        b.snapshot(),
        vec![
            (seg(0, 2 * MIB), vec![info(0, MIB, true), info(MIB, MIB, false)]),
            (seg(6 * MIB, 2 * MIB), vec![info(6 * MIB, MIB, false), info(7 * MIB, MIB, true)]),
        ]
    );
    assert_eq!(b.usage().reserved, 4 * MIB);
    assert_eq!(b.usage().largest_free, MIB);
    check_invariants(&b);
    assert!(b.allocate(2 * MIB).is_none(), "no block is cut from a hole");

    // 3 MiB: 1 MiB free before the hole plus its low 2 MiB, rather than 4 MiB at the end.
    let plan = b.plan_growth(0, 3 * MIB, U, &holes_cost).unwrap();
    assert_eq!(plan, GrowthPlan { tail: 0, at_end: 4 * MIB, hole: Some(seg(2 * MIB, 2 * MIB)) });
    // 6 MiB: only the whole hole (with both neighbours) fits.
    assert_eq!(b.plan_growth(0, 6 * MIB, U, &holes_cost).unwrap().hole, Some(seg(2 * MIB, 4 * MIB)));
    assert_eq!(b.plan_growth(0, 7 * MIB, U, &holes_cost).unwrap(), GrowthPlan { tail: 0, at_end: 8 * MIB, hole: None });
    assert!(b.plan_growth(64 * MIB, MIB, U, &holes_cost).is_none(), "no segment there");
    // What a part of the hole costs to map decides between parts that fit.
    let high_is_mapped = |h: Segment| (h.base + h.size).min(4 * MIB).saturating_sub(h.base);
    assert_eq!(
        b.plan_growth(0, 3 * MIB, U, &high_is_mapped).unwrap().hole,
        Some(seg(4 * MIB, 2 * MIB)),
        "the high part, with the free range after it"
    );

    assert!(!b.map_hole(seg(MIB, 2 * MIB)), "not inside a hole");
    assert!(!b.map_hole(seg(4 * MIB, 4 * MIB)), "runs past the hole");
    assert!(b.map_hole(seg(2 * MIB, 2 * MIB)));
    assert_eq!(b.usage().reserved, 6 * MIB);
    let d = b.allocate(3 * MIB).unwrap();
    assert_eq!(d, Block { addr: MIB, size: 3 * MIB }, "the mapped part merged with the free range before it");
    assert!(b.map_hole(seg(4 * MIB, 2 * MIB)), "the rest of the hole");
    assert_eq!(b.usage().largest_free, 3 * MIB, "merged with the free range after it");
    check_invariants(&b);

    // Holes merge with each other, and trailing holes go with the tail.
    for x in [a, c, d] {
        b.free(x.addr).unwrap();
    }
    let e = b.allocate(512).unwrap();
    assert_eq!(e.addr, 0);
    assert_eq!(unmap_free_units(&mut b, 0, U), (6 * MIB, 6 * MIB), "the holes are one, and the tail");
    assert_eq!(b.snapshot(), vec![(seg(0, 2 * MIB), vec![info(0, 512, true), info(512, 2 * MIB - 512, false)])]);
    check_invariants(&b);
    b.free(e.addr).unwrap();
    assert_eq!(b.unmap_free_ranges(0, &[seg(0, 2 * MIB)]), vec![seg(0, 2 * MIB)], "the head can be a hole too");
    assert!(b.snapshot().is_empty());
    assert_eq!(b.usage().reserved, 0);
    assert!(b.map_hole(seg(0, 2 * MIB)));
    assert_eq!(b.allocate(2 * MIB).unwrap().addr, 0);
    assert!(b.unmap_free_ranges(0, &[seg(0, 2 * MIB)]).is_empty(), "a block is in the way");
    b.free(0).unwrap();
    assert_eq!(unmap_free_units(&mut b, 0, U), (2 * MIB, 2 * MIB), "only a hole left: the segment goes");
    assert_eq!(b.usage(), Usage::default());
    assert_eq!(b.nodes.len(), b.spare.len(), "every node slot is back");
}

#[test]
fn random_growth_trim_and_holes_keep_the_invariants() {
    const U: u64 = 2 * MIB;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut holes_made, mut holes_mapped, mut tails_cut) = (0, 0, 0);
    for round in 0..40 {
        let mut b = BestFit::default();
        let base = 1 << 30;
        let mut live: Vec<Block> = Vec::new();
        for _ in 0..300 {
            let r = next();
            match r % 10 {
                0..=4 => {
                    let size = match (r >> 8) % 4 {
                        0 => 512 * (1 + (r >> 16) % 16),
                        1 => 64 * KIB * (1 + (r >> 16) % 32),
                        _ => 512 * KIB * (1 + (r >> 16) % 24),
                    };
                    let block = match b.allocate(size) {
                        Some(block) => block,
                        None => {
                            let plan = b.plan_growth(base, size, U, &|h| h.size);
                            match plan.and_then(|p| p.hole).filter(|h| plan.is_some_and(|p| h.size <= p.at_end)) {
                                Some(hole) => {
                                    assert!(b.map_hole(hole));
                                    holes_mapped += 1;
                                }
                                None => assert!(b.grow_segment(base, plan.map_or(round_up(size, U).unwrap(), |p| p.at_end))),
                            }
                            b.allocate(size).expect("the growth makes room")
                        }
                    };
                    assert!(block.size >= size);
                    live.push(block);
                }
                5..=7 if !live.is_empty() => {
                    let block = live.swap_remove((r >> 8) as usize % live.len());
                    assert_eq!(b.free(block.addr), Some(block.size));
                }
                8 => {
                    let before = b.usage().reserved;
                    let (holes, moved) = unmap_free_units(&mut b, base, U);
                    assert!(moved % U == 0, "round {round}: moved {moved}");
                    tails_cut += u64::from(moved > 0);
                    holes_made += u64::from(holes > 0);
                    assert_eq!(b.usage().reserved, before - holes);
                    assert_eq!(unmap_free_units(&mut b, base, U), (0, 0));
                }
                _ => {}
            }
            check_invariants(&b);
            for (segment, _) in b.snapshot() {
                assert!((segment.base - base) % U == 0 && segment.size % U == 0, "runs are whole units: {segment:?}");
            }
        }
        for block in live.drain(..) {
            b.free(block.addr).unwrap();
        }
        unmap_free_units(&mut b, base, U);
        assert_eq!(b.usage(), Usage::default(), "round {round}");
        assert_eq!(b.nodes.len(), b.spare.len());
    }
    assert!(holes_made > 20 && holes_mapped > 20 && tails_cut > 20, "{holes_made} {holes_mapped} {tails_cut}");
}
