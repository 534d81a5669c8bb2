//! Buffers that die in the order they are born (a sliding window, a pipeline's queue), placed round a
//! ring: each right after the one born before it, back to the start where the end is reached, in a
//! ring of the lower bound plus the largest buffer. Whatever live at a moment takes one arc of the
//! ring, of their bytes and at most one gap left at a wrap (less than the largest buffer), so the
//! next always finds room: the plan never needs more than that capacity, in O(n log n). Where
//! greedy by size cannot finish, the floors stack such an instance up to twice its bound.

use std::collections::VecDeque;

use crate::instance::Instance;

/// The ring's offsets for an instance whose buffers end in the order they start; None for any other.
pub(crate) fn ring_plan(inst: &Instance) -> Option<Vec<u64>> {
    let mut order: Vec<u32> = (0..inst.len() as u32).collect();
    order.sort_unstable_by_key(|&i| (inst.lo[i as usize], inst.hi[i as usize]));
    if !order.windows(2).all(|w| inst.hi[w[0] as usize] <= inst.hi[w[1] as usize]) {
        return None;
    }
    let capacity = inst.lower_bound() + inst.size.iter().max().copied().unwrap_or(0);
    let mut offsets = vec![0; inst.len()];
    // The live buffers, oldest first: (end of life, offset, end of bytes).
    let mut live: VecDeque<(u32, u64, u64)> = VecDeque::new();
    for i in order.into_iter().map(|i| i as usize) {
        while live.front().is_some_and(|&(hi, _, _)| hi <= inst.lo[i]) {
            live.pop_front();
        }
        let size = inst.size[i];
        let offset = match (live.front(), live.back()) {
            (Some(&(_, tail, _)), Some(&(_, newest, head))) => {
                let fits = |at: u64, limit: u64| at + size <= limit;
                if newest >= tail && fits(head, capacity) {
                    head
                } else if newest >= tail && fits(0, tail) {
                    0
                } else if newest < tail && fits(head, tail) {
                    head
                } else {
                    // Never, by the arc's length above; the caller then has another plan.
                    return None;
                }
            }
            _ => 0,
        };
        offsets[i] = offset;
        live.push_back((inst.hi[i], offset, offset + size));
    }
    Some(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{validate, Buffer};

    #[test]
    fn a_sliding_window_fits_in_its_bound_plus_its_largest_buffer() {
        // 1,000 buffers, each live for the next 7 starts, sizes ragged.
        let buffers: Vec<Buffer> =
            (0..1000u64).map(|i| Buffer::new(i, i, i + 7, 512 * (1 + (i * 7919) % 13))).collect();
        let inst = Instance::new(&buffers, 512).unwrap();
        let offsets = ring_plan(&inst).unwrap();
        let arena = validate(&buffers, &offsets, 512).unwrap();
        assert!(arena <= inst.lower_bound() + 13 * 512, "{arena} against {}", inst.lower_bound());
    }

    #[test]
    fn buffers_that_do_not_die_in_birth_order_are_not_a_ring() {
        let nested = [Buffer::new(0, 0, 10, 512), Buffer::new(1, 1, 5, 512)];
        assert!(ring_plan(&Instance::new(&nested, 512).unwrap()).is_none());
    }
}
