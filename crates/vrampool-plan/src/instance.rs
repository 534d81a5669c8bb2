//! A checked instance in the planners' working form: sizes rounded up to the alignment and lifetimes mapped
//! onto compressed time, where segment `k` is the span between the `k`-th and `k+1`-th distinct time value.
//! Buffer `i` is live on segments `lo[i]..hi[i]`, and two buffers overlap in time iff those ranges intersect.

use crate::bound::lower_bound_of;
use crate::buffer::{check_buffers, round_up};
use crate::{Buffer, PlanError};

pub(crate) struct Instance {
    pub size: Vec<u64>,
    /// Lifetime length in the input's time units.
    pub length: Vec<u64>,
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    pub segments: usize,
}

impl Instance {
    pub fn new(buffers: &[Buffer], alignment: u64) -> Result<Instance, PlanError> {
        check_buffers(buffers, alignment)?;
        let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.lower, b.upper]).collect();
        times.sort_unstable();
        times.dedup();
        let at = |t: u64| times.binary_search(&t).expect("time was collected") as u32;
        let (lo, hi) = (buffers.iter().map(|b| at(b.lower)).collect(), buffers.iter().map(|b| at(b.upper)).collect());
        Ok(Instance {
            // check_buffers has shown that rounding cannot overflow.
            size: buffers.iter().map(|b| round_up(b.size, alignment).unwrap_or(u64::MAX)).collect(),
            length: buffers.iter().map(|b| b.upper - b.lower).collect(),
            lo,
            hi,
            segments: times.len().saturating_sub(1),
        })
    }

    pub fn len(&self) -> usize {
        self.size.len()
    }

    /// The same buffers with time running backwards: a plan of one is a plan of the other.
    pub fn mirrored(&self) -> Instance {
        let last = self.segments as u32;
        Instance {
            size: self.size.clone(),
            length: self.length.clone(),
            lo: self.hi.iter().map(|&hi| last - hi).collect(),
            hi: self.lo.iter().map(|&lo| last - lo).collect(),
            segments: self.segments,
        }
    }

    /// The most bytes live at once: no plan needs less.
    pub fn lower_bound(&self) -> u64 {
        self.bound_of(0..self.len() as u32)
    }

    /// The most bytes of `part`'s buffers live at once.
    pub(crate) fn bound_of(&self, part: impl IntoIterator<Item = u32>) -> u64 {
        lower_bound_of(part.into_iter().map(|i| {
            let i = i as usize;
            (self.lo[i] as u64, self.hi[i] as u64, self.size[i])
        }))
    }

    /// Lifetime length in segments (the heuristics' tie-break).
    pub fn span(&self, i: usize) -> u32 {
        self.hi[i] - self.lo[i]
    }

    /// The same buffers with each size rounded up to a class of `bits` significant bits (at most 2^-bits more
    /// bytes) and to a multiple of the sizes' greatest common divisor (so of the alignment), if that leaves
    /// at most three quarters as many distinct sizes: where sizes are ragged, buffers of nearly one size
    /// become interchangeable and classes an octave apart nest, two in one. A plan of it is a plan of `self`.
    pub(crate) fn in_classes(&self, bits: u32) -> Option<Instance> {
        let unit = unit_of_sizes(self.size.iter().copied());
        let class = |size: u64| {
            let grain = 1u64 << size.checked_ilog2().unwrap_or(0).saturating_sub(bits);
            size.checked_next_multiple_of(grain)?.checked_next_multiple_of(unit)
        };
        let mut sizes = self.size.clone();
        sizes.sort_unstable();
        sizes.dedup();
        // Classes keep the order of sizes, so the distinct classes are the changes along the distinct sizes.
        let classes = sizes.iter().map(|&s| class(s)).collect::<Option<Vec<u64>>>()?;
        let merged = 1 + classes.windows(2).filter(|pair| pair[0] != pair[1]).count();
        if 4 * merged > 3 * sizes.len() {
            return None;
        }
        let size: Vec<u64> = self.size.iter().map(|&s| classes[sizes.binary_search(&s).expect("a size")]).collect();
        // The planners stack buffers as high as the total of the sizes, which must not overflow.
        size.iter().try_fold(0u64, |total, &s| total.checked_add(s))?;
        Some(Instance {
            size,
            length: self.length.clone(),
            lo: self.lo.clone(),
            hi: self.hi.clone(),
            segments: self.segments,
        })
    }

    /// The buffers `part` in order of start, ties by index.
    pub(crate) fn by_start(&self, part: impl IntoIterator<Item = u32>) -> Vec<u32> {
        let mut order: Vec<u32> = part.into_iter().collect();
        order.sort_unstable_by_key(|&i| (self.lo[i as usize], i));
        order
    }
}

/// The step between arenas of buffers of these sizes (see `exact/minimise.rs`): their greatest common divisor,
/// 1 for none.
pub(crate) fn unit_of_sizes(sizes: impl IntoIterator<Item = u64>) -> u64 {
    sizes.into_iter().fold(0, gcd).max(1)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random_instance;

    #[test]
    fn mirrored_buffers_overlap_as_the_originals_do() {
        let buffers = random_instance(300, 5);
        let (inst, back) = (Instance::new(&buffers, 1).unwrap(), Instance::new(&buffers, 1).unwrap().mirrored());
        let overlap = |inst: &Instance, i: usize, j: usize| inst.lo[i] < inst.hi[j] && inst.lo[j] < inst.hi[i];
        for i in 0..buffers.len() {
            assert!(back.lo[i] < back.hi[i] && back.hi[i] as usize <= back.segments);
            assert_eq!(back.hi[i] - back.lo[i], inst.span(i));
            for j in 0..buffers.len() {
                assert_eq!(overlap(&inst, i, j), overlap(&back, i, j), "{i} {j}");
            }
        }
        assert_eq!((back.size, back.length), (inst.size, inst.length));
    }

    #[test]
    fn classes_round_sizes_up_by_at_most_their_share_and_keep_the_alignment() {
        let buffers = random_instance(3_000, 7);
        for alignment in [1, 256, 768] {
            let inst = Instance::new(&buffers, alignment).unwrap();
            for bits in [4, 8, 10] {
                let Some(classes) = inst.in_classes(bits) else { continue };
                assert_eq!((&classes.lo, &classes.hi, &classes.length), (&inst.lo, &inst.hi, &inst.length));
                for (&class, &size) in classes.size.iter().zip(&inst.size) {
                    assert!(size <= class && class % alignment == 0, "{size} to {class}");
                    // At most a grain of 2^-bits of the size, then up to the next multiple of the alignment.
                    assert!(class - size < (size >> bits).max(1) + alignment, "{size} to {class}, {bits} bits");
                }
            }
        }
        // Sizes a power of two plus up to 16 KiB: the classes of 8 bits merge most of them.
        let inst = Instance::new(&buffers, 1).unwrap();
        let distinct = |sizes: &[u64]| sizes.iter().collect::<std::collections::BTreeSet<_>>().len();
        let classes = inst.in_classes(8).expect("ragged sizes merge");
        assert!(2 * distinct(&classes.size) < distinct(&inst.size), "{}", distinct(&classes.size));
    }

    #[test]
    fn classes_that_merge_few_sizes_or_overflow_are_not_made() {
        // Powers of two and three times them: 2 significant bits, no class of more bits merges any.
        let sizes: Vec<u64> = (10..40).flat_map(|e| [1u64 << e, 3 << e]).collect();
        let buffers: Vec<Buffer> = sizes.iter().enumerate().map(|(k, &s)| Buffer::new(k as u64, 0, 1, s)).collect();
        let inst = Instance::new(&buffers, 1).unwrap();
        assert!(inst.in_classes(8).is_none());
        // Near-equal sizes merge, but one at the top of the range would round past u64::MAX.
        let big = [Buffer::new(0, 0, 1, u64::MAX - 5000), Buffer::new(1, 1, 2, 1000), Buffer::new(2, 1, 2, 1001)];
        assert!(Instance::new(&big[1..], 1).unwrap().in_classes(4).is_some());
        assert!(Instance::new(&big, 1).unwrap().in_classes(4).is_none());
    }
}
