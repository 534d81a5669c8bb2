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

    /// The buffers `part` in order of start, ties by index.
    pub(crate) fn by_start(&self, part: impl IntoIterator<Item = u32>) -> Vec<u32> {
        let mut order: Vec<u32> = part.into_iter().collect();
        order.sort_unstable_by_key(|&i| (self.lo[i as usize], i));
        order
    }
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
}
