//! Model-based conformance test run against every strategy: random allocate / free / bogus free /
//! release sequences, checked after every step against a model of live blocks and segments.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::{any, prop_oneof, proptest, Just, ProptestConfig};
use proptest::strategy::Strategy as Gen;
use proptest::test_runner::RngAlgorithm;

use super::{BestFit, BestFitConfig, Buddy, BuddyConfig, Segment, Slab, SlabConfig, Strategy, Usage};
use crate::sizes::{GIB, KIB, MIB, MIN_BLOCK};

#[derive(Debug, Clone)]
enum Op {
    /// Allocate `size`; if a segment is needed, place it per `gap` (adjacent, aligned, misaligned).
    Alloc {
        size: u64,
        gap: u8,
    },
    /// Free the n-th live block (modulo their number).
    Free(usize),
    /// Free an address that is not a live block.
    Bogus {
        kind: u8,
        pick: u64,
    },
    Release,
}

fn request() -> impl Gen<Value = u64> {
    prop_oneof![
        4 => (1u64..=16).prop_map(|k| k * 512),
        3 => (1u64..=256).prop_map(|k| k * 4 * KIB - 512 * (k % 2)),
        2 => (1u64..=48).prop_map(|k| k * 256 * KIB),
        1 => (1u64..=40).prop_map(|k| k * MIB + 512 * (k % 3)),
    ]
}

fn op() -> impl Gen<Value = Op> {
    prop_oneof![
        6 => (request(), 0u8..4).prop_map(|(size, gap)| Op::Alloc { size, gap }),
        4 => any::<usize>().prop_map(Op::Free),
        1 => (0u8..4, any::<u64>()).prop_map(|(kind, pick)| Op::Bogus { kind, pick }),
        1 => Just(Op::Release),
    ]
}

fn ops() -> impl Gen<Value = Vec<Op>> {
    vec(op(), 1..120)
}

struct Model<S> {
    strategy: S,
    /// Live blocks: address -> (real size, requested size).
    live: BTreeMap<u64, (u64, u64)>,
    /// Segments held: base -> size.
    segments: BTreeMap<u64, u64>,
    freed: Vec<u64>,
    next_base: u64,
}

impl<S: Strategy> Model<S> {
    fn new(strategy: S) -> Self {
        Self { strategy, live: BTreeMap::new(), segments: BTreeMap::new(), freed: Vec::new(), next_base: GIB }
    }

    fn add_segment(&mut self, size: u64, gap: u8) {
        let seg_size = self.strategy.segment_size_for(size);
        assert!(seg_size >= size, "segment_size_for({size}) = {seg_size}");
        let base = match gap {
            0 => self.next_base,                                 // right after the last one
            1 => (self.next_base | (2 * MIB - 1)) + 1 + 2 * MIB, // 2 MiB-aligned, with a hole
            2 => self.next_base + 3 * MIN_BLOCK,                 // only 512-aligned
            _ => (self.next_base | (GIB - 1)) + 1,               // 1 GiB-aligned
        };
        self.next_base = base + seg_size;
        self.strategy.add_segment(Segment { base, size: seg_size });
        self.segments.insert(base, seg_size);
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Alloc { size, gap } => {
                let block = match self.strategy.allocate(size) {
                    Some(block) => block,
                    None => {
                        self.add_segment(size, gap);
                        self.strategy.allocate(size).expect("allocate after adding segment_size_for(size)")
                    }
                };
                assert!(block.size >= size, "{block:?} for {size}");
                assert_eq!(block.addr % MIN_BLOCK, 0, "{block:?}");
                let end = block.addr + block.size;
                let (&base, &seg_size) = self.segments.range(..=block.addr).next_back().expect("in a segment");
                assert!(end <= base + seg_size, "{block:?} outside segment at {base:#x}+{seg_size:#x}");
                if let Some((&a, &(s, _))) = self.live.range(..end).next_back() {
                    assert!(a + s <= block.addr, "{block:?} overlaps live block at {a:#x}+{s:#x}");
                }
                self.live.insert(block.addr, (block.size, size));
            }
            Op::Free(n) => {
                if self.live.is_empty() {
                    return;
                }
                let (&addr, &(size, _)) = self.live.iter().nth(n % self.live.len()).expect("non-empty");
                assert_eq!(self.strategy.free(addr), Some(size), "free({addr:#x})");
                self.live.remove(&addr);
                self.freed.push(addr);
            }
            Op::Bogus { kind, pick } => {
                let addr = match kind {
                    0 if !self.freed.is_empty() => self.freed[pick as usize % self.freed.len()],
                    1 if !self.live.is_empty() => {
                        let (&a, &(s, _)) = self.live.iter().nth(pick as usize % self.live.len()).expect("non-empty");
                        if s <= MIN_BLOCK {
                            return;
                        }
                        a + MIN_BLOCK * (1 + (pick >> 20) % (s / MIN_BLOCK - 1))
                    }
                    2 if !self.segments.is_empty() => {
                        let (&b, &s) = self.segments.iter().nth(pick as usize % self.segments.len()).expect("non-empty");
                        b + MIN_BLOCK * ((pick >> 20) % (s / MIN_BLOCK))
                    }
                    _ => pick,
                };
                if self.live.contains_key(&addr) {
                    return;
                }
                let before = (self.strategy.snapshot(), self.strategy.usage());
                assert_eq!(self.strategy.free(addr), None, "bogus free({addr:#x})");
                assert_eq!((self.strategy.snapshot(), self.strategy.usage()), before, "after bogus free");
            }
            Op::Release => {
                for seg in self.strategy.release_free_segments() {
                    assert_eq!(self.segments.remove(&seg.base), Some(seg.size), "released {seg:?}");
                    let end = seg.base + seg.size;
                    assert!(self.live.range(seg.base..end).next().is_none(), "released {seg:?} holds a live block");
                }
                // Every segment left holds a live block: merging left nothing wholly free behind.
                for (&base, &size) in &self.segments {
                    assert!(self.live.range(base..base + size).next().is_some(), "segment {base:#x} kept while free");
                }
            }
        }
    }

    fn check(&self) {
        let u: Usage = self.strategy.usage();
        assert_eq!(u.allocated, self.live.values().map(|&(s, _)| s).sum::<u64>(), "allocated");
        assert_eq!(u.live_blocks, self.live.len() as u64, "live_blocks");
        assert_eq!(u.reserved, self.segments.values().sum::<u64>(), "reserved");
        assert_eq!(u.segments, self.segments.len() as u64, "segments");
        assert!(u.largest_free <= u.reserved - u.allocated, "{u:?}");
        let snapshot = self.strategy.snapshot();
        assert_eq!(snapshot.len(), self.segments.len(), "snapshot segments");
        let mut live_seen = 0;
        for ((seg, blocks), (&base, &size)) in snapshot.iter().zip(&self.segments) {
            assert_eq!(*seg, Segment { base, size });
            let mut cursor = base;
            for b in blocks {
                assert_eq!(b.addr, cursor, "snapshot of {seg:?} has a gap or overlap: {blocks:?}");
                assert!(b.size > 0);
                cursor += b.size;
                if b.allocated {
                    assert_eq!(self.live.get(&b.addr).map(|&(s, _)| s), Some(b.size), "snapshot block {b:?}");
                    live_seen += 1;
                }
            }
            assert_eq!(cursor, base + size, "snapshot of {seg:?} does not cover it");
        }
        assert_eq!(live_seen, self.live.len(), "live blocks missing from the snapshot");
    }
}

/// Runs `ops` against `strategy`, checking the model after every step, then frees everything and
/// checks that every segment comes back.
fn run<S: Strategy>(strategy: S, ops: &[Op]) {
    let mut model = Model::new(strategy);
    model.check();
    for op in ops {
        model.step(op);
        model.check();
    }
    while !model.live.is_empty() {
        model.step(&Op::Free(0));
    }
    model.check();
    model.step(&Op::Release);
    assert!(model.segments.is_empty());
    assert_eq!(model.strategy.usage(), Usage::default());
}

/// A free of an address that is no live block (inside one, foreign, out of range, or freed already) is
/// refused and changes nothing, in every strategy.
#[test]
fn invalid_frees_change_nothing_in_every_strategy() {
    let strategies: [Box<dyn Strategy>; 3] = [Box::new(BestFit::default()), Box::new(Buddy::default()), Box::new(Slab::default())];
    for mut s in strategies {
        s.add_segment(Segment { base: 0, size: 2 * MIB });
        let a = s.allocate(4 * KIB).unwrap();
        let _b = s.allocate(4 * KIB).unwrap();
        let before = (s.snapshot(), s.usage());
        for addr in [a.addr + 512, 8 * KIB, 64 * KIB, 2 * MIB, u64::MAX, 1] {
            assert_eq!(s.free(addr), None);
        }
        assert_eq!((s.snapshot(), s.usage()), before);
        assert_eq!(s.free(a.addr), Some(4 * KIB));
        let before = (s.snapshot(), s.usage());
        assert_eq!(s.free(a.addr), None);
        assert_eq!((s.snapshot(), s.usage()), before);
    }
}

proptest! {
    // XorShift: the default ChaCha generator is a fifth of the run time in a debug build.
    #![proptest_config(ProptestConfig {
        cases: 400,
        rng_algorithm: RngAlgorithm::XorShift,
        ..ProptestConfig::default()
    })]

    #[test]
    fn buddy_default_conforms(ops in ops()) {
        run(Buddy::default(), &ops);
    }

    #[test]
    fn buddy_with_dedicated_segments_conforms(ops in ops()) {
        // Blocks above 8 MiB get dedicated segments.
        run(Buddy::new(BuddyConfig { min_order: 9, max_order: 23, min_segment_order: 21, trim: false }), &ops);
    }

    #[test]
    fn trimmed_buddy_conforms(ops in ops()) {
        run(Buddy::new(BuddyConfig { trim: true, ..BuddyConfig::default() }), &ops);
    }

    #[test]
    fn trimmed_buddy_with_coarse_blocks_and_dedicated_segments_conforms(ops in ops()) {
        // 64 KiB smallest blocks (tails go back in 64 KiB multiples), dedicated above 16 MiB.
        run(Buddy::new(BuddyConfig { min_order: 16, max_order: 24, min_segment_order: 21, trim: true }), &ops);
    }

    #[test]
    fn best_fit_default_conforms(ops in ops()) {
        run(BestFit::default(), &ops);
    }

    #[test]
    fn best_fit_coarse_split_conforms(ops in ops()) {
        run(BestFit::new(BestFitConfig { min_split_remainder: MIB }), &ops);
    }

    #[test]
    fn slab_default_conforms(ops in ops()) {
        run(Slab::default(), &ops);
    }

    #[test]
    fn slab_small_conforms(ops in ops()) {
        run(Slab::new(SlabConfig { max_size: 64 * KIB, segment_size: MIB }), &ops);
    }

    #[test]
    fn slab_big_classes_conforms(ops in ops()) {
        // Classes up to 16 MiB, above the 2 MiB segment size.
        run(Slab::new(SlabConfig { max_size: 16 * MIB, segment_size: 2 * MIB }), &ops);
    }
}
