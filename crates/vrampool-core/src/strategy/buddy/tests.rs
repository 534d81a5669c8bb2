use super::*;
use crate::sizes::{GIB, KIB};

fn seg(base: u64, size: u64) -> Segment {
    Segment { base, size }
}

fn with_segment(base: u64, size: u64) -> Buddy {
    let mut b = Buddy::default();
    b.add_segment(seg(base, size));
    b
}

#[test]
fn segment_sizes() {
    let b = Buddy::default();
    assert_eq!(b.segment_size_for(512), 2 * MIB);
    assert_eq!(b.segment_size_for(2 * MIB), 2 * MIB);
    assert_eq!(b.segment_size_for(2 * MIB + 512), 4 * MIB);
    assert_eq!(b.segment_size_for(GIB), GIB);
    assert_eq!(b.segment_size_for(GIB + 512), GIB + 2 * MIB);
    assert_eq!(b.segment_size_for(u64::MAX - 511), !(2 * MIB - 1));
    assert_eq!(b.segment_size_for(u64::MAX), !(2 * MIB - 1));
}

#[test]
fn split_gives_lowest_address_and_power_of_two() {
    let mut b = with_segment(GIB, 2 * MIB);
    let x = b.allocate(3 * KIB).unwrap();
    assert_eq!(x, Block { addr: GIB, size: 4 * KIB });
    let y = b.allocate(512).unwrap();
    assert_eq!(y, Block { addr: GIB + 4 * KIB, size: 512 });
    let z = b.allocate(4 * KIB).unwrap();
    assert_eq!(z, Block { addr: GIB + 8 * KIB, size: 4 * KIB });
    // 2 MiB = 4 + 4 + 0.5 (+0.5 free) + 8 + 16 + ... free
    let u = b.usage();
    assert_eq!(u.allocated, 8 * KIB + 512);
    assert_eq!(u.largest_free, MIB);
    assert_eq!(u.live_blocks, 3);
}

#[test]
fn merges_back_to_one_segment() {
    let mut b = with_segment(0, 2 * MIB);
    let blocks: Vec<_> = [512, 1024, 64 * KIB, 512, 300 * KIB, 512 * KIB].iter().map(|&s| b.allocate(s).unwrap()).collect();
    assert!(b.release_free_segments().is_empty());
    for blk in blocks.iter().rev() {
        assert_eq!(b.free(blk.addr), Some(blk.size));
    }
    let snap = b.snapshot();
    assert_eq!(snap, vec![(seg(0, 2 * MIB), vec![BlockInfo { addr: 0, size: 2 * MIB, allocated: false }])]);
    assert_eq!(b.usage().largest_free, 2 * MIB);
    assert_eq!(b.release_free_segments(), vec![seg(0, 2 * MIB)]);
    assert_eq!(b.usage(), Usage::default());
    assert!(b.snapshot().is_empty());
}

#[test]
fn adjacent_segments_never_merge() {
    let mut b = Buddy::default();
    b.add_segment(seg(0, 2 * MIB));
    b.add_segment(seg(2 * MIB, 2 * MIB));
    let x = b.allocate(2 * MIB).unwrap();
    let y = b.allocate(2 * MIB).unwrap();
    assert!(b.allocate(512).is_none());
    b.free(x.addr);
    b.free(y.addr);
    assert_eq!(b.usage().largest_free, 2 * MIB);
    assert!(b.allocate(4 * MIB).is_none());
    assert_eq!(b.release_free_segments().len(), 2);
}

#[test]
fn unaligned_base_and_odd_segment_sizes() {
    // Base only 512-aligned, size 3 MiB + 512: pieces 2 MiB, 1 MiB, 512 B.
    let base = 7 * 512;
    let mut b = with_segment(base, 3 * MIB + 512);
    // A neighbour right after it must not merge with the last piece.
    b.add_segment(seg(base + 3 * MIB + 512, 2 * MIB));
    let blocks: Vec<_> = (0..5).map(|_| b.allocate(MIB).unwrap()).collect();
    let tail = b.allocate(512).unwrap();
    assert_eq!(tail.addr, base + 3 * MIB);
    assert!(b.allocate(MIB).is_none());
    for blk in &blocks {
        b.free(blk.addr).unwrap();
    }
    b.free(tail.addr).unwrap();
    assert_eq!(b.snapshot()[0].1.len(), 3);
    assert_eq!(b.release_free_segments().len(), 2);
}

#[test]
fn dedicated_segments_are_served_whole() {
    let mut b = Buddy::new(BuddyConfig { max_order: 22, ..BuddyConfig::default() });
    assert_eq!(b.segment_size_for(5 * MIB), 6 * MIB);
    assert!(b.allocate(5 * MIB).is_none());
    b.add_segment(seg(0, 6 * MIB));
    assert!(b.allocate(512).is_none(), "dedicated segments are not split");
    let x = b.allocate(5 * MIB).unwrap();
    assert_eq!(x, Block { addr: 0, size: 6 * MIB });
    assert_eq!(b.usage().allocated, 6 * MIB);
    assert!(b.release_free_segments().is_empty());
    assert_eq!(b.free(0), Some(6 * MIB));
    assert_eq!(b.free(0), None);
    // Far too big a segment for a small dedicated request is not used.
    assert!(b.allocate(4 * MIB + 512).is_some());
    b.free(0).unwrap();
    b.add_segment(seg(GIB, 64 * MIB));
    assert_eq!(b.allocate(5 * MIB).unwrap().addr, 0);
    assert!(b.allocate(5 * MIB).is_none());
    assert_eq!(b.usage().largest_free, 64 * MIB);
    assert_eq!(b.allocate(60 * MIB).unwrap(), Block { addr: GIB, size: 64 * MIB });
}

fn trimmed() -> Buddy {
    Buddy::new(BuddyConfig { trim: true, ..BuddyConfig::default() })
}

#[test]
fn trimmed_blocks_and_segments_are_cut_to_the_request() {
    let mut b = trimmed();
    assert_eq!(b.segment_size_for(160 * MIB), 160 * MIB);
    assert_eq!(b.segment_size_for(160 * MIB + 1), 162 * MIB);
    assert_eq!(b.segment_size_for(4 * KIB), 2 * MIB);
    // A fresh 160 MiB segment is the run 128 + 32 MiB: served whole.
    b.add_segment(seg(0, 160 * MIB));
    assert_eq!(b.allocate(160 * MIB - 100), Some(Block { addr: 0, size: 160 * MIB }));
    assert_eq!(b.usage().allocated, 160 * MIB);
    assert_eq!(b.free(0), Some(160 * MIB));
    assert_eq!(b.release_free_segments(), vec![seg(0, 160 * MIB)]);
    // Powers of two are plain buddies.
    b.add_segment(seg(GIB, 2 * MIB));
    assert_eq!(b.allocate(MIB).unwrap().size, MIB);
}

#[test]
fn the_tail_of_a_larger_block_goes_back_as_smaller_buddies() {
    let mut b = trimmed();
    b.add_segment(seg(0, 256 * MIB));
    // 232 MiB spells no run in a 256 MiB piece: the piece is cut and its 24 MiB tail is free
    // as 8 MiB at 232 and 16 MiB at 240.
    assert_eq!(b.allocate(232 * MIB).unwrap(), Block { addr: 0, size: 232 * MIB });
    assert_eq!(b.usage().largest_free, 16 * MIB);
    assert_eq!(b.allocate(16 * MIB).unwrap().addr, 240 * MIB);
    assert_eq!(b.allocate(8 * MIB).unwrap().addr, 232 * MIB);
    assert!(b.allocate(512).is_none());
    for addr in [232 * MIB, 0, 240 * MIB] {
        b.free(addr).unwrap();
    }
    assert_eq!(b.release_free_segments(), vec![seg(0, 256 * MIB)], "every buddy merged back");
}

#[test]
fn a_run_takes_free_buddies_out_of_the_blocks_that_hold_them() {
    let mut b = trimmed();
    // Pieces 128 MiB at 0 and 64 MiB at 128: a 176 MiB run takes the first and 48 MiB of the
    // second (32 at 128, 16 at 160), which leaves 16 MiB at 176 free.
    b.add_segment(seg(0, 192 * MIB));
    assert_eq!(b.allocate(176 * MIB).unwrap(), Block { addr: 0, size: 176 * MIB });
    assert_eq!(b.usage().largest_free, 16 * MIB);
    assert_eq!(b.allocate(16 * MIB).unwrap().addr, 176 * MIB);
    b.free(0).unwrap();
    b.free(176 * MIB).unwrap();
    assert_eq!(b.release_free_segments(), vec![seg(0, 192 * MIB)]);
}

#[test]
fn a_new_segment_serves_its_request_behind_many_heads_that_cannot() {
    // Seventy segments whose free 128 MiB head is followed by a live 8 MiB block: no 144 MiB
    // run anywhere but in the segment added for it.
    let mut b = trimmed();
    for i in 0..70 {
        b.add_segment(seg(i * GIB, 136 * MIB));
    }
    let heads: Vec<u64> = (0..70).map(|_| b.allocate(128 * MIB).unwrap().addr).collect();
    for i in 0..70 {
        assert_eq!(b.allocate(8 * MIB).unwrap().addr, i * GIB + 128 * MIB);
    }
    for addr in heads {
        b.free(addr).unwrap();
    }
    b.add_segment(seg(100 * GIB, b.segment_size_for(144 * MIB)));
    assert_eq!(b.allocate(144 * MIB).unwrap().addr, 100 * GIB);
}

#[test]
fn a_wholly_free_segment_takes_only_a_block_that_nearly_fills_it() {
    let mut b = trimmed();
    b.add_segment(seg(0, GIB));
    assert!(b.allocate(100 * MIB).is_none(), "a 1 GiB segment kept whole for a 100 MiB block");
    b.add_segment(seg(2 * GIB, 100 * MIB));
    assert_eq!(b.allocate(100 * MIB).unwrap().addr, 2 * GIB);
    // The idle segment can go back whole.
    assert_eq!(b.release_free_segments(), vec![seg(0, GIB)]);
    // A segment in use takes any block that fits in it.
    b.add_segment(seg(4 * GIB, GIB));
    assert_eq!(b.allocate(920 * MIB).unwrap().addr, 4 * GIB);
    assert_eq!(b.allocate(64 * MIB).unwrap().addr, 4 * GIB + 960 * MIB);
    // Without `trim` the buddy cuts any free segment.
    let mut plain = Buddy::default();
    plain.add_segment(seg(0, GIB));
    assert_eq!(plain.allocate(100 * MIB).unwrap().size, 128 * MIB);
}

#[test]
fn extreme_sizes_do_not_panic() {
    let mut b = with_segment(0, 2 * MIB);
    for size in [0, 1, u64::MAX, u64::MAX - 511, 1 << 63, (1 << 62) + 1] {
        let _ = b.segment_size_for(size);
        let r = b.allocate(size);
        assert!(size > 2 * MIB || r.is_some());
    }
    b.add_segment(seg(u64::MAX - 512, 4 * MIB)); // wraps: ignored
    b.add_segment(seg(MIB, 2 * MIB)); // overlaps: ignored
    b.add_segment(seg(8 * MIB, 0)); // empty: ignored
    assert_eq!(b.usage().segments, 1);
    let mut big = Buddy::new(BuddyConfig { min_order: 0, max_order: 99, min_segment_order: 99, trim: false });
    assert_eq!(big.config(), BuddyConfig { min_order: 9, max_order: 35, min_segment_order: 35, trim: false });
    big.add_segment(seg(0, 1 << 35));
    assert_eq!(big.allocate(u64::MAX), None);
    assert_eq!(big.allocate(512).unwrap().size, 512);
    assert_eq!(big.free(0), Some(512));
    let mut huge = Buddy::new(BuddyConfig { min_order: 40, max_order: 99, min_segment_order: 99, trim: false });
    assert_eq!(huge.config(), BuddyConfig { min_order: 40, max_order: 62, min_segment_order: 62, trim: false });
    huge.add_segment(seg(0, 1 << 62));
    assert_eq!(huge.segment_size_for(u64::MAX), !(2 * MIB - 1));
    assert_eq!(huge.allocate(u64::MAX), None);
    assert_eq!(huge.allocate(1 << 62).unwrap().size, 1 << 62);
    assert_eq!(huge.free(0), Some(1 << 62));
    assert_eq!(huge.allocate(1).unwrap().size, 1 << 40);
}

#[test]
fn released_slots_are_reused_oldest_segment_first() {
    let mut b = Buddy::default();
    for i in 0..3 {
        b.add_segment(seg(i * 4 * MIB, 2 * MIB));
    }
    // Blocks pack into the first segment added.
    assert_eq!(b.allocate(MIB).unwrap().addr, 0);
    assert_eq!(b.allocate(MIB).unwrap().addr, MIB);
    assert_eq!(b.allocate(MIB).unwrap().addr, 4 * MIB);
    assert_eq!(b.release_free_segments(), vec![seg(8 * MIB, 2 * MIB)]);
    b.add_segment(seg(64 * MIB, 2 * MIB));
    assert_eq!(b.slots.len(), 3, "slot reused");
    assert_eq!(b.allocate(2 * MIB).unwrap().addr, 64 * MIB);
    assert!(b.allocate(2 * MIB).is_none());
}
