//! A checked instance in the planners' working form: sizes rounded up to the alignment and lifetimes mapped
//! onto compressed time, where segment `k` is the span between the `k`-th and `k+1`-th distinct time value.
//! Buffer `i` is live on segments `lo[i]..hi[i]`, and two buffers overlap in time iff those ranges intersect.

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

    /// Lifetime length in segments (the heuristics' tie-break).
    pub fn span(&self, i: usize) -> u32 {
        self.hi[i] - self.lo[i]
    }
}
