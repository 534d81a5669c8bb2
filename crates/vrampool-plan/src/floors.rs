//! Lowest floor first: the canonical placement of the exact search (see `exact/search.rs`) taken greedily,
//! for parts too large to search.
//!
//! A buffer's *floor* is the highest top among the placed buffers that overlap it in time. The heuristic
//! places, again and again, the unplaced buffer with the lowest floor (ties by an order's rank) at its floor,
//! as a pile settles from the bottom up: each placement fills the lowest free band there is. On a decoding
//! run, where best fit leaves the growing caches' old slots too small for their successors, this meets the
//! lower bound; which order breaks ties best differs from graph to graph, so the planner tries several.
//!
//! The floor of a buffer is the highest point of the *skyline* (the top of the placed buffers at each
//! moment) over its lifetime, a range maximum in a segment tree; floors only rise, so a heap keyed by floors
//! read earlier yields the lowest one once its key is read again and found current. Each read costs O(log n),
//! but a buffer is read again each time the pile has risen under it since its last read: on a training step
//! of 35,000 buffers, 17 million reads with longest first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use crate::exact::{Order, Traits};
use crate::instance::Instance;

/// Placements between looks at the clock.
const CLOCK_EVERY: u32 = 4_096;

/// Offsets of `part`'s buffers (parallel to it), lowest floor first, ties by `order`; `None` as soon as the
/// skyline rises above `beat` (the plan could not beat that arena) or the deadline passes.
pub(crate) fn lowest_floor_first(
    inst: &Instance,
    part: &[u32],
    order: Order,
    beat: u64,
    deadline: Instant,
) -> Option<Vec<u64>> {
    let rank = ranks(inst, part, order);
    let mut skyline = Skyline::new(inst.segments);
    let mut heap: BinaryHeap<Reverse<(u64, u32, u32)>> =
        (0..part.len() as u32).map(|p| Reverse((0, rank[p as usize], p))).collect();
    let mut offsets = vec![0u64; part.len()];
    let mut clock = 0u32;
    while let Some(Reverse((key, r, p))) = heap.pop() {
        clock += 1;
        if clock % CLOCK_EVERY == 0 && Instant::now() >= deadline {
            return None;
        }
        let i = part[p as usize] as usize;
        let floor = skyline.highest(inst.lo[i], inst.hi[i]);
        // Keys are floors read earlier, so never above the floors now: a buffer whose floor (and rank) is
        // below the least key left is the lowest, stale key or not.
        let lowest = floor == key || heap.peek().is_none_or(|Reverse((k, kr, _))| (floor, r) < (*k, *kr));
        if !lowest {
            heap.push(Reverse((floor, r, p)));
            continue;
        }
        let top = floor + inst.size[i];
        if top > beat {
            return None;
        }
        offsets[p as usize] = floor;
        skyline.raise(inst.lo[i], inst.hi[i], top);
    }
    Some(offsets)
}

/// Each buffer's rank (position in `part`'s order) under `order`; its T key is the most bytes of the part live
/// at a moment of its lifetime.
fn ranks(inst: &Instance, part: &[u32], order: Order) -> Vec<u32> {
    let mut load = vec![0i128; inst.segments + 1];
    for &i in part {
        load[inst.lo[i as usize] as usize] += inst.size[i as usize] as i128;
        load[inst.hi[i as usize] as usize] -= inst.size[i as usize] as i128;
    }
    let mut loads = Skyline::new(inst.segments);
    let mut live = 0i128;
    for (segment, delta) in load.iter().take(inst.segments).enumerate() {
        live += delta;
        loads.raise(segment as u32, segment as u32 + 1, live as u64);
    }
    let mut by: Vec<u32> = (0..part.len() as u32).collect();
    order.sort(&mut by, |p| {
        let i = part[p] as usize;
        Traits {
            size: inst.size[i],
            length: inst.length[i],
            lo: inst.lo[i],
            hi: inst.hi[i],
            tight: loads.highest(inst.lo[i], inst.hi[i]),
        }
    });
    let mut rank = vec![0u32; part.len()];
    for (r, &p) in by.iter().enumerate() {
        rank[p as usize] = r as u32;
    }
    rank
}

/// A value per segment that only rises: raise a range to at least a value, read a range's maximum, both in
/// O(log n). A node's `tag` is a value every segment below it has reached, `max` the most any has.
struct Skyline {
    leaves: usize,
    max: Vec<u64>,
    tag: Vec<u64>,
}

impl Skyline {
    fn new(segments: usize) -> Skyline {
        let leaves = segments.max(1).next_power_of_two();
        Skyline { leaves, max: vec![0; 2 * leaves], tag: vec![0; 2 * leaves] }
    }

    /// Every segment of `lo..hi` to at least `value`.
    fn raise(&mut self, lo: u32, hi: u32, value: u64) {
        let (mut l, mut r) = (lo as usize + self.leaves, hi as usize + self.leaves);
        let (first, last) = (l, r - 1);
        while l < r {
            if l & 1 == 1 {
                self.max[l] = self.max[l].max(value);
                self.tag[l] = self.tag[l].max(value);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.max[r] = self.max[r].max(value);
                self.tag[r] = self.tag[r].max(value);
            }
            l >>= 1;
            r >>= 1;
        }
        // Above the nodes raised, the maximum is at least the value.
        for mut node in [first >> 1, last >> 1] {
            while node >= 1 {
                self.max[node] = self.max[node].max(value);
                node >>= 1;
            }
        }
    }

    /// The most of any segment of `lo..hi`.
    fn highest(&self, lo: u32, hi: u32) -> u64 {
        let (mut l, mut r) = (lo as usize + self.leaves, hi as usize + self.leaves);
        let (first, last) = (l, r - 1);
        let mut most = 0;
        while l < r {
            if l & 1 == 1 {
                most = most.max(self.max[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                most = most.max(self.max[r]);
            }
            l >>= 1;
            r >>= 1;
        }
        // A tag above the range's first or last segment covers part of the range.
        for mut node in [first >> 1, last >> 1] {
            while node >= 1 {
                most = most.max(self.tag[node]);
                node >>= 1;
            }
        }
        most
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{random_instance, validate, Buffer};
    use std::time::Duration;

    fn whole(buffers: &[Buffer]) -> (Instance, Vec<u32>) {
        (Instance::new(buffers, 1).unwrap(), (0..buffers.len() as u32).collect())
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn the_skyline_reads_what_was_raised() {
        // Random raises and reads against a plain array, on timelines of every length up to 40.
        let mut state = 12_345u64;
        let mut below = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for n in 1..40u64 {
            let mut skyline = Skyline::new(n as usize);
            let mut plain = vec![0u64; n as usize];
            for _ in 0..200 {
                let lo = below(n);
                let hi = lo + 1 + below(n - lo);
                let value = below(1_000);
                skyline.raise(lo as u32, hi as u32, value);
                plain[lo as usize..hi as usize].iter_mut().for_each(|v| *v = (*v).max(value));
                let lo = below(n);
                let hi = lo + 1 + below(n - lo);
                let want = plain[lo as usize..hi as usize].iter().copied().max().unwrap();
                assert_eq!(skyline.highest(lo as u32, hi as u32), want, "n={n} {lo}..{hi}");
            }
        }
    }

    /// Lowest floor first the slow way: every floor read afresh at every step.
    fn plainly(inst: &Instance, part: &[u32], order: Order) -> Vec<u64> {
        let rank = ranks(inst, part, order);
        let mut top = vec![0u64; inst.segments];
        let mut offsets = vec![None; part.len()];
        while let Some((floor, _, p)) = (0..part.len())
            .filter(|&p| offsets[p].is_none())
            .map(|p| {
                let i = part[p] as usize;
                let floor = top[inst.lo[i] as usize..inst.hi[i] as usize].iter().copied().max().unwrap_or(0);
                (floor, rank[p], p)
            })
            .min()
        {
            let i = part[p] as usize;
            top[inst.lo[i] as usize..inst.hi[i] as usize].iter_mut().for_each(|t| *t = floor + inst.size[i]);
            offsets[p] = Some(floor);
        }
        offsets.into_iter().map(|o| o.unwrap()).collect()
    }

    #[test]
    fn the_heap_places_as_reading_every_floor_afresh_would() {
        for seed in 0..20 {
            let buffers = random_instance(120, seed);
            let (inst, part) = whole(&buffers);
            for order in [Order::Time, Order::Wat, Order::Taw, Order::Twa, Order::Area] {
                let fast = lowest_floor_first(&inst, &part, order, u64::MAX, far()).unwrap();
                assert_eq!(fast, plainly(&inst, &part, order), "seed {seed} {order:?}");
                validate(&buffers, &fast, 1).unwrap();
            }
        }
    }

    #[test]
    fn it_gives_up_above_the_arena_to_beat_or_at_the_deadline() {
        let buffers = random_instance(2_000, 3);
        let (inst, part) = whole(&buffers);
        let plan = lowest_floor_first(&inst, &part, Order::Wat, u64::MAX, far()).unwrap();
        let arena = validate(&buffers, &plan, 1).unwrap();
        assert_eq!(lowest_floor_first(&inst, &part, Order::Wat, arena, far()), Some(plan));
        assert_eq!(lowest_floor_first(&inst, &part, Order::Wat, arena - 1, far()), None);
        assert_eq!(lowest_floor_first(&inst, &part, Order::Wat, u64::MAX, Instant::now()), None);
    }

    #[test]
    fn a_growing_cache_leaves_no_hole_behind() {
        // A cache of 4 bytes grown to 5, then 6, with a temporary beside each copy: best fit by start leaves
        // each old slot too small for the next; lowest floor first puts the next above and the one after it
        // back at 0, at the bound.
        let buffers = [
            Buffer::new(0, 0, 3, 4),
            Buffer::new(1, 2, 5, 5),
            Buffer::new(2, 4, 7, 6),
            Buffer::new(3, 1, 2, 5),
            Buffer::new(4, 5, 6, 5),
        ];
        let (inst, part) = whole(&buffers);
        for order in [Order::Wat, Order::Twa, Order::Time] {
            let offsets = lowest_floor_first(&inst, &part, order, u64::MAX, far()).unwrap();
            assert_eq!(validate(&buffers, &offsets, 1).unwrap(), crate::lower_bound(&buffers), "{order:?}");
        }
    }
}
