//! Splitting an instance into independent parts, and the search's view of one part.
//!
//! Where no lifetime crosses a moment in time, the buffers before and after it never meet, so each side can be
//! planned on its own and the arena is the larger of the two. Within a part, time is cut into *sections* at
//! every start and end; the buffers live in a section all meet each other, which gives the search its bounds.

use crate::instance::Instance;
use crate::order::{Order, Traits};

pub(crate) struct Component {
    /// Indices into the instance, sorted by start.
    pub members: Vec<u32>,
    pub size: Vec<u64>,
    /// Lifetime length in the input's time units.
    pub length: Vec<u64>,
    /// Local buffer `i` is live on sections `lo[i]..hi[i]`.
    pub lo: Vec<u32>,
    pub hi: Vec<u32>,
    /// For each buffer, the buffers whose lifetimes overlap its own.
    pub neighbors: Vec<Vec<u32>>,
    /// For each section, the buffers live in it.
    pub live: Vec<Vec<u32>>,
    /// For each buffer, the other buffers with exactly its lifetime.
    pub same_life: Vec<Vec<u32>>,
    /// For each buffer, byte ranges it must stay clear of (buffers outside the part, fixed where they are,
    /// that overlap it in time): sorted and disjoint. Empty when the part has none.
    pub obstacles: Vec<Vec<(u64, u64)>>,
}

/// Groups of instance indices whose lifetimes are connected, in time order.
pub(crate) fn split(inst: &Instance) -> Vec<Vec<u32>> {
    let mut order: Vec<u32> = (0..inst.len() as u32).collect();
    order.sort_unstable_by_key(|&i| inst.lo[i as usize]);
    let mut parts: Vec<Vec<u32>> = Vec::new();
    let mut reach = 0u32;
    for i in order {
        let (lo, hi) = (inst.lo[i as usize], inst.hi[i as usize]);
        if parts.is_empty() || lo >= reach {
            parts.push(Vec::new());
        }
        parts.last_mut().expect("pushed above").push(i);
        reach = reach.max(hi);
    }
    parts
}

/// How much memory `Component::new` would need for a part, in entries: overlapping pairs plus section
/// memberships. Computed in O(n log n) without building anything, so that huge parts can be skipped.
pub(crate) fn cost(inst: &Instance, part: &[u32]) -> u64 {
    let mut lows: Vec<u32> = part.iter().map(|&i| inst.lo[i as usize]).collect();
    let mut highs: Vec<u32> = part.iter().map(|&i| inst.hi[i as usize]).collect();
    lows.sort_unstable();
    highs.sort_unstable();
    let mut entries = 0u64;
    for &i in part {
        let (lo, hi) = (inst.lo[i as usize], inst.hi[i as usize]);
        // Buffers starting before this one ends, less those that end before it starts: its overlaps (and itself).
        let started = lows.partition_point(|&l| l < hi) as u64;
        let ended = highs.partition_point(|&h| h <= lo) as u64;
        entries += started - ended - 1 + u64::from(hi - lo);
    }
    entries
}

impl Component {
    pub fn new(inst: &Instance, part: &[u32]) -> Component {
        let members = inst.by_start(part.iter().copied());
        // Sections between the members' own starts and ends: a window of a large part spans many segments of
        // the instance that none of its members begins or ends at.
        let mut times: Vec<u32> = members.iter().flat_map(|&i| [inst.lo[i as usize], inst.hi[i as usize]]).collect();
        times.sort_unstable();
        times.dedup();
        let at = |t: u32| times.binary_search(&t).expect("a member's time") as u32;
        let sections = times.len().saturating_sub(1);
        let size: Vec<u64> = members.iter().map(|&i| inst.size[i as usize]).collect();
        let length: Vec<u64> = members.iter().map(|&i| inst.length[i as usize]).collect();
        let lo: Vec<u32> = members.iter().map(|&i| at(inst.lo[i as usize])).collect();
        let hi: Vec<u32> = members.iter().map(|&i| at(inst.hi[i as usize])).collect();

        let n = members.len();
        let mut neighbors = vec![Vec::new(); n];
        for i in 0..n {
            // Sorted by start: the later buffers overlapping `i` are exactly those starting before it ends.
            for j in i + 1..n {
                if lo[j] >= hi[i] {
                    break;
                }
                neighbors[i].push(j as u32);
                neighbors[j].push(i as u32);
            }
        }
        let mut live = vec![Vec::new(); sections];
        for i in 0..n {
            for section in &mut live[lo[i] as usize..hi[i] as usize] {
                section.push(i as u32);
            }
        }
        let mut same_life = vec![Vec::new(); n];
        for i in 0..n {
            for &j in &neighbors[i] {
                if (lo[j as usize], hi[j as usize]) == (lo[i], hi[i]) {
                    same_life[i].push(j);
                }
            }
        }
        Component { members, size, length, lo, hi, neighbors, live, same_life, obstacles: Vec::new() }
    }

    /// Fixes byte ranges that each buffer (in local order) must stay clear of.
    pub fn set_obstacles(&mut self, mut obstacles: Vec<Vec<(u64, u64)>>) {
        obstacles.iter_mut().for_each(merge_spans);
        self.obstacles = obstacles;
    }

    /// The lowest offset at or above `at` where buffer `i` clears its obstacles.
    pub fn lift(&self, i: usize, at: u64) -> u64 {
        let Some(ranges) = self.obstacles.get(i) else { return at };
        let mut at = at;
        // The ranges are sorted and disjoint: skip those ending at or below `at`.
        let first = ranges.partition_point(|&(_, end)| end <= at);
        for &(start, end) in &ranges[first..] {
            if start >= at + self.size[i] {
                break;
            }
            at = end;
        }
        at
    }

    pub fn len(&self) -> usize {
        self.size.len()
    }

    /// The most bytes live in any one section: the part's lower bound.
    pub fn load(&self) -> u64 {
        self.live.iter().map(|s| s.iter().map(|&i| self.size[i as usize]).sum::<u64>()).max().unwrap_or(0)
    }

    /// The rank of each buffer under `order` (0 first).
    pub fn ranking(&self, order: Order) -> Vec<u32> {
        let load: Vec<u64> = self.live.iter().map(|s| s.iter().map(|&i| self.size[i as usize]).sum()).collect();
        let mut by: Vec<u32> = (0..self.len() as u32).collect();
        self.sort_by(order, &mut by, |i| self.tightest(i, &load));
        let mut rank = vec![0u32; self.len()];
        for (r, &i) in by.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        rank
    }

    /// The most bytes of `load` (per section) in any section buffer `i` lives in: its T key.
    pub fn tightest(&self, i: usize, load: &[u64]) -> u64 {
        load[self.lo[i] as usize..self.hi[i] as usize].iter().copied().max().unwrap_or(0)
    }

    /// Sorts buffers by `order`, with `tight` as each buffer's T key. Ties go by index, so buffers of the same
    /// lifetime and size keep one relative order under every order and every T (the twins rule needs that).
    pub fn sort_by(&self, order: Order, items: &mut [u32], tight: impl Fn(usize) -> u64) {
        order.sort(items, |i| Traits {
            size: self.size[i],
            length: self.length[i],
            lo: self.lo[i],
            hi: self.hi[i],
            tight: tight(i),
        });
    }
}

/// Sorts byte ranges and merges those that overlap or touch, in place.
pub(crate) fn merge_spans(spans: &mut Vec<(u64, u64)>) {
    spans.sort_unstable();
    let mut kept = 0;
    for k in 0..spans.len() {
        let (start, end) = spans[k];
        if kept > 0 && start <= spans[kept - 1].1 {
            spans[kept - 1].1 = spans[kept - 1].1.max(end);
        } else {
            spans[kept] = (start, end);
            kept += 1;
        }
    }
    spans.truncate(kept);
}

/// A part's values (in its members' order) written to the buffers' places in `offsets`.
pub(crate) fn write_part(offsets: &mut [u64], members: &[u32], values: impl Iterator<Item = u64>) {
    for (&i, v) in members.iter().zip(values) {
        offsets[i as usize] = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Buffer;

    #[test]
    fn spans_that_overlap_or_touch_merge() {
        let mut spans = vec![(5, 7), (0, 2), (2, 3), (6, 9), (11, 12)];
        merge_spans(&mut spans);
        assert_eq!(spans, [(0, 3), (5, 9), (11, 12)]);
    }

    #[test]
    fn a_buffer_lifts_clear_of_its_obstacles() {
        let inst = Instance::new(&[Buffer::new(0, 0, 4, 4)], 1).unwrap();
        let mut part = Component::new(&inst, &[0]);
        assert_eq!(part.lift(0, 3), 3);
        // Overlapping and touching ranges merge: [0, 2) and [6, 9) stay, [8, 12) joins the second.
        part.set_obstacles(vec![vec![(8, 12), (0, 2), (6, 9)]]);
        assert_eq!(part.obstacles[0], [(0, 2), (6, 12)]);
        assert_eq!(part.lift(0, 0), 2, "the 4 bytes from 2 to 6 fit between the two");
        assert_eq!(part.lift(0, 3), 12, "from 3 they would reach into [6, 12)");
        assert_eq!(part.lift(0, 12), 12);
    }
}
