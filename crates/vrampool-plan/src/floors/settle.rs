//! The settle stage: a plan's buffers dropped as low as the buffers below them allow (after the
//! classes' plan, `exact/classes.rs`).

use super::skyline::Skyline;
use crate::instance::Instance;

/// The part's plan at `offsets` (parallel to the instance's buffers) settled: each buffer, from the lowest
/// offset up, dropped onto the buffers below it that overlap it in time. No buffer rises, and any two that
/// overlap in time keep their order; what goes is the room under a buffer that nothing below holds up, such as
/// the bytes a plan on sizes rounded up to classes (`Instance::in_classes`) keeps above each buffer.
pub(crate) fn settled(inst: &Instance, part: &[u32], offsets: &[u64]) -> Vec<(u32, u64)> {
    let mut skyline = Skyline::new(inst.segments);
    let mut by_offset = part.to_vec();
    by_offset.sort_unstable_by_key(|&i| offsets[i as usize]);
    by_offset
        .into_iter()
        .map(|i| {
            let (lo, hi) = (inst.lo[i as usize], inst.hi[i as usize]);
            let floor = skyline.highest(lo, hi);
            skyline.raise(lo, hi, floor + inst.size[i as usize]);
            (i, floor)
        })
        .collect()
}
