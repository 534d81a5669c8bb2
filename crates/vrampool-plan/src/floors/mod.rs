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
//! but a buffer is read again each time the pile has risen under it since its last read: where thousands of
//! buffers are live at one moment, each placement there makes the keys of all the others stale, some 17
//! million times on a pipelined step of 30,000 buffers. Most of those are stale by the buffer placed last,
//! whose top is then the new key without a read, which halves the run's time there.
//!
//! A run that cannot beat the arena it is given stops as soon as its projection (`projection.rs`: the skyline
//! plus the bytes still to place, at every moment) shows it, rather than when its skyline passes that arena.
//!
//! A run may be told to place some buffers before the rest (*promoted*: all of them lowest floor first, then the
//! others); the portfolio's squeaky wheel (`exact/portfolio/squeaky.rs`) promotes those that ended highest in the
//! best plan so far.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

mod projection;
mod settle;
mod skyline;

use crate::instance::Instance;
use crate::order::{Order, Traits};
use projection::Projection;
pub(crate) use settle::settled;
use skyline::Skyline;

/// Placements between looks at the clock.
const CLOCK_EVERY: u32 = 4_096;

/// Offsets of `part`'s buffers (parallel to it), lowest floor first, ties by `order`; `None` as soon as the
/// run's projection rises above `beat` (the plan could not beat that arena) or the deadline passes.
pub(crate) fn lowest_floor_first(
    inst: &Instance,
    part: &[u32],
    order: Order,
    beat: u64,
    deadline: Instant,
) -> Option<Vec<u64>> {
    lowest_floor_first_promoting(inst, part, order, &vec![false; part.len()], beat, deadline)
}

/// [`lowest_floor_first`] with the buffers `promoted` (parallel to `part`) placed before the others.
pub(crate) fn lowest_floor_first_promoting(
    inst: &Instance,
    part: &[u32],
    order: Order,
    promoted: &[bool],
    beat: u64,
    deadline: Instant,
) -> Option<Vec<u64>> {
    let live = live(inst, part);
    let (rank, by_rank) = ranks(inst, part, &live, order);
    let mut projection = Projection::new(&live);
    let mut skyline = Skyline::new(inst.segments);
    let mut heap: BinaryHeap<Reverse<u128>> = (0..part.len()).map(|p| Reverse(key(!promoted[p], 0, rank[p]))).collect();
    let mut offsets = vec![0u64; part.len()];
    let mut clock = 0u32;
    // The lifetime and top of the buffer placed last.
    let mut last = (0, 0, 0);
    while let Some(&Reverse(least)) = heap.peek() {
        clock += 1;
        if clock % CLOCK_EVERY == 0 && Instant::now() >= deadline {
            return None;
        }
        // The least key after this one: the root's lesser child.
        let next = heap.as_slice()[1..].iter().take(2).map(|&Reverse(k)| k).min();
        let (later, read, r) = (least >> 96 != 0, (least >> 32) as u64, least as u32);
        let p = by_rank[r as usize] as usize;
        let i = part[p] as usize;
        let (lo, hi) = (inst.lo[i], inst.hi[i]);
        // The buffer placed last raised the skyline to its top over its lifetime. Where this lifetime overlaps
        // it and the key is below that top, the top is a truer key, known without reading the skyline: when
        // many buffers stack at one moment, each placement there makes the keys of all the others stale.
        if lo < last.1 && last.0 < hi && read < last.2 {
            let raised = key(later, last.2, r);
            if next.is_some_and(|next| next < raised) {
                *heap.peek_mut().expect("a key was peeked") = Reverse(raised);
                continue;
            }
        }
        let floor = skyline.highest(lo, hi);
        // Keys hold floors read earlier, so never above the floors now: a buffer whose key now is below the
        // least key left is the lowest, stale key or not.
        let now = key(later, floor, r);
        if now != least && next.is_some_and(|next| next < now) {
            *heap.peek_mut().expect("a key was peeked") = Reverse(now);
            continue;
        }
        heap.pop();
        let top = floor + inst.size[i];
        projection.place(lo, hi, top, inst.size[i]);
        if projection.height() > beat {
            return None;
        }
        offsets[p] = floor;
        skyline.raise(lo, hi, top);
        last = (lo, hi, top);
    }
    Some(offsets)
}

/// A buffer's place in the queue: its phase (promoted first), the floor read, then its rank, in one number
/// (ranks are distinct, so no two keys are equal).
fn key(later: bool, floor: u64, rank: u32) -> u128 {
    (u128::from(later) << 96) | (u128::from(floor) << 32) | u128::from(rank)
}

/// The bytes of `part` live on each segment.
fn live(inst: &Instance, part: &[u32]) -> Vec<u64> {
    let mut delta = vec![0i128; inst.segments + 1];
    for &i in part {
        delta[inst.lo[i as usize] as usize] += inst.size[i as usize] as i128;
        delta[inst.hi[i as usize] as usize] -= inst.size[i as usize] as i128;
    }
    let mut bytes = 0i128;
    delta[..inst.segments]
        .iter()
        .map(|d| {
            bytes += d;
            bytes as u64
        })
        .collect()
}

/// Each buffer's rank (position in `part`'s order) under `order`, and the buffer (position in `part`) of each
/// rank; a buffer's T key is the most bytes of the part live (`live`, per segment) at a moment of its lifetime.
fn ranks(inst: &Instance, part: &[u32], live: &[u64], order: Order) -> (Vec<u32>, Vec<u32>) {
    let mut loads = Skyline::new(inst.segments);
    for (segment, &bytes) in live.iter().enumerate() {
        loads.raise(segment as u32, segment as u32 + 1, bytes);
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
    (rank, by)
}

/// Each buffer in order of start at its floor, on top of the buffers placed before it that overlap it: no heap
/// and no gap reused, so O(n log n) whatever the lifetimes. The plan the planner falls back on where greedy by
/// size does not finish in its share of the budget: best fit scans every gap below a buffer, and where tens of
/// thousands of buffers overlap with gaps between them, that is 30 s for 60,000.
pub(crate) fn floors_by_start(inst: &Instance) -> Vec<u64> {
    floors_by_start_counted(inst).0
}

/// [`floors_by_start`], with the skyline's nodes visited: O(n log n).
pub(crate) fn floors_by_start_counted(inst: &Instance) -> (Vec<u64>, u64) {
    let mut skyline = Skyline::new(inst.segments);
    let mut offsets = vec![0; inst.len()];
    for i in inst.by_start(0..inst.len() as u32) {
        let (lo, hi) = (inst.lo[i as usize], inst.hi[i as usize]);
        let floor = skyline.highest(lo, hi);
        skyline.raise(lo, hi, floor + inst.size[i as usize]);
        offsets[i as usize] = floor;
    }
    (offsets, skyline.visits.get())
}

#[cfg(test)]
mod tests;
