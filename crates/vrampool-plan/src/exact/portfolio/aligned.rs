//! Best fit by start with the gap chosen by the neighbours' lifetimes. Among the gaps that hold the buffer and
//! are at most `factor` times the smallest of them, the buffer goes at the edge of a gap (its bottom or its
//! top) whose neighbour there ends nearest to the buffer's own end (in segments); ties by the smaller gap,
//! then the lower offset. Buffers that end together free one hole rather than several ragged ones. Where each
//! KV cache is replaced by a larger one at every step (serving with continuous batching), smallest-gap best
//! fit leaves holes that the grown caches no longer fit: on serving seed 4 it packs at 1.061 of the bound,
//! this rule at 1.047 (time backwards, factor 4).
//!
//! A neighbour is a placed buffer live at the buffer's start: of those at most one ends at a given offset and at
//! most one begins there (two such would share a byte and a moment), so each edge has at most one, found by its
//! offset. The order goes by start in phases (a first phase of some buffers, then the rest, each by start);
//! within a phase, a buffer that has ended is live at no later start and is forgotten, and at a new phase the
//! placed buffers are indexed by offset again.

use std::collections::HashMap;
use std::time::Instant;

use crate::exact::placed::place_in_turn;
use crate::instance::Instance;
use crate::placed_index::{free_elsewhere, PlacedIndex, Span};

/// `order` (by start on `inst`) placed by the rule above, if done before `deadline` with no buffer's top
/// above `beat`; and how many buffers were placed.
pub(crate) fn aligned_fit_before(
    inst: &Instance,
    order: &[u32],
    factor: u64,
    beat: u64,
    deadline: Instant,
) -> (Option<Vec<(u32, u64)>>, usize) {
    let mut taken = Taken {
        index: PlacedIndex::new(inst.segments),
        ending_at: HashMap::new(),
        beginning_at: HashMap::new(),
        spans: Vec::new(),
        gaps: Vec::new(),
        placed: Vec::with_capacity(order.len()),
    };
    let done =
        place_in_turn(inst, Vec::with_capacity(order.len()), order, (beat, deadline), |i| taken.place(inst, i, factor));
    free_elsewhere(taken);
    done
}

/// The bytes the placed buffers take, by lifetime and by the offsets where the buffers end and begin; and
/// scratch for the gaps of the next.
struct Taken {
    index: PlacedIndex,
    ending_at: HashMap<u64, Vec<u32>>,
    beginning_at: HashMap<u64, Vec<u32>>,
    spans: Vec<Span>,
    /// The gaps that hold the next buffer, as (bottom, top).
    gaps: Vec<(u64, u64)>,
    /// The buffers placed, in turn, with their offsets.
    placed: Vec<(u32, u64)>,
}

impl Taken {
    /// Buffer `i`'s offset by the rule, where it is then recorded.
    fn place(&mut self, inst: &Instance, i: u32, factor: u64) -> u64 {
        if self.placed.last().is_some_and(|&(last, _)| inst.lo[last as usize] > inst.lo[i as usize]) {
            self.ending_at.clear();
            self.beginning_at.clear();
            for (j, offset) in std::mem::take(&mut self.placed) {
                self.record(inst, j, offset);
            }
        }
        let offset = self.fit(inst, i, factor);
        self.index.insert((offset, offset + inst.size[i as usize]), inst.lo[i as usize], inst.hi[i as usize]);
        self.record(inst, i, offset);
        offset
    }

    /// Buffer `j` at `offset` among the placed, by the offsets where it ends and begins.
    fn record(&mut self, inst: &Instance, j: u32, offset: u64) {
        self.ending_at.entry(offset + inst.size[j as usize]).or_default().push(j);
        self.beginning_at.entry(offset).or_default().push(j);
        self.placed.push((j, offset));
    }

    fn fit(&mut self, inst: &Instance, i: u32, factor: u64) -> u64 {
        let (lo, hi, size) = (inst.lo[i as usize], inst.hi[i as usize], inst.size[i as usize]);
        self.spans.clear();
        self.index.overlapping(lo, hi, &mut self.spans);
        self.spans.sort_unstable();
        // `top` is the highest byte taken so far among the spans scanned.
        self.gaps.clear();
        let mut top = 0;
        for &(start, end) in &self.spans {
            if start > top && start - top >= size {
                self.gaps.push((top, start));
            }
            top = top.max(end);
        }
        let Some(smallest) = self.gaps.iter().map(|&(bottom, top)| top - bottom).min() else {
            return top;
        };
        let widest = smallest.saturating_mul(factor);
        let distance =
            |neighbour: Option<u32>| neighbour.map_or(u64::MAX, |j| u64::from(inst.hi[j as usize].abs_diff(hi)));
        let mut best = (u64::MAX, u64::MAX, u64::MAX);
        for &(bottom, top) in self.gaps.iter().filter(|&&(bottom, top)| top - bottom <= widest) {
            // The arena's floor counts as a neighbour that ends with the buffer: nothing is stranded below it.
            let below = if bottom == 0 { 0 } else { distance(live(inst, &mut self.ending_at, bottom, lo)) };
            let above = distance(live(inst, &mut self.beginning_at, top, lo));
            best = best.min((below, top - bottom, bottom)).min((above, top - bottom, top - size));
        }
        best.2
    }
}

/// The buffer in `by_offset` at `offset` live at segment `now` (where it is one), forgetting those that ended
/// before: within a phase they overlap no later buffer.
fn live(inst: &Instance, by_offset: &mut HashMap<u64, Vec<u32>>, offset: u64, now: u32) -> Option<u32> {
    let buffers = by_offset.get_mut(&offset)?;
    buffers.retain(|&j| inst.hi[j as usize] > now);
    buffers.iter().copied().find(|&j| inst.lo[j as usize] <= now)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{random_instance, validate, Buffer};

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn offsets_of(buffers: &[Buffer], factor: u64) -> Vec<u64> {
        let inst = Instance::new(buffers, 1).unwrap();
        let order = inst.by_start(0..inst.len() as u32);
        let mut offsets = vec![u64::MAX; buffers.len()];
        for (i, o) in aligned_fit_before(&inst, &order, factor, u64::MAX, far()).0.unwrap() {
            offsets[i as usize] = o;
        }
        offsets
    }

    #[test]
    fn the_buffer_goes_beside_the_neighbour_that_ends_with_it() {
        let b = |id, lower, upper, size| Buffer { id, lower, upper, size };
        // Stacked at time 0: a at 0, the spacer s at 10, c at 13, the spacer t at 23, d at 28. When x starts,
        // the spacers have left two gaps: [10, 13) between a (ends at 100) and c (ends at 50), and [23, 28)
        // between c and d (ends at 80, with x).
        let (a, s, c, t, d) = (b(0, 0, 100, 10), b(1, 0, 5, 3), b(2, 0, 50, 10), b(3, 0, 5, 5), b(4, 0, 80, 10));
        let buffers = [a, s, c, t, d, b(5, 10, 80, 3)];
        assert_eq!(offsets_of(&buffers, 4), [0, 10, 13, 23, 28, 25]);
        // Within the smallest gap only, x goes into it, beside a or c.
        assert_eq!(offsets_of(&buffers, 1)[5], 10);
    }

    /// The rule as stated, placed buffer by placed buffer: the gaps among those overlapping `i` in time, and
    /// each gap's neighbours among those live at `i`'s start.
    fn by_the_rule(inst: &Instance, order: &[u32], factor: u64) -> Vec<(u32, u64)> {
        let mut placed: Vec<(u32, u64)> = Vec::new();
        for &i in order {
            let (lo, hi, size) = (inst.lo[i as usize], inst.hi[i as usize], inst.size[i as usize]);
            let mut spans: Vec<(u64, u64, u32)> = placed
                .iter()
                .filter(|&&(j, _)| inst.lo[j as usize] < hi && lo < inst.hi[j as usize])
                .map(|&(j, o)| (o, o + inst.size[j as usize], j))
                .collect();
            spans.sort_unstable();
            let (mut top, mut gaps) = (0, Vec::new());
            for &(start, end, _) in &spans {
                if start > top && start - top >= size {
                    gaps.push((top, start));
                }
                top = top.max(end);
            }
            let offset = match gaps.iter().map(|&(b, t)| t - b).min() {
                None => top,
                Some(smallest) => {
                    let neighbour = |edge: &dyn Fn(u64, u64) -> bool| {
                        spans
                            .iter()
                            .find(|&&(start, end, j)| inst.lo[j as usize] <= lo && edge(start, end))
                            .map_or(u64::MAX, |&(_, _, j)| u64::from(inst.hi[j as usize].abs_diff(hi)))
                    };
                    let mut best = (u64::MAX, u64::MAX, u64::MAX);
                    for &(bottom, top) in gaps.iter().filter(|&&(b, t)| t - b <= smallest * factor) {
                        let below = if bottom == 0 { 0 } else { neighbour(&|_, end| end == bottom) };
                        let above = neighbour(&|start, _| start == top);
                        best = best.min((below, top - bottom, bottom)).min((above, top - bottom, top - size));
                    }
                    best.2
                }
            };
            placed.push((i, offset));
        }
        placed
    }

    #[test]
    fn in_phases_each_buffer_goes_where_the_rule_puts_it() {
        let buffers = random_instance(600, 8);
        let inst = Instance::new(&buffers, 1).unwrap();
        let mirrored = inst.mirrored();
        for timeline in [&inst, &mirrored] {
            // By start, then in two phases (the largest tenth first) and in three.
            let by_start = timeline.by_start(0..inst.len() as u32);
            let mut sizes: Vec<u64> = inst.size.clone();
            sizes.sort_unstable();
            let (tenth, half) = (sizes[sizes.len() * 9 / 10], sizes[sizes.len() / 2]);
            let phase = |i: &u32| {
                let size = inst.size[*i as usize];
                (size < tenth, size < half)
            };
            let mut two = by_start.clone();
            two.sort_by_key(|i| phase(i).0);
            let mut three = by_start.clone();
            three.sort_by_key(phase);
            for order in [&by_start, &two, &three] {
                for factor in [1, 4, 16] {
                    let plan = aligned_fit_before(timeline, order, factor, u64::MAX, far()).0.unwrap();
                    assert_eq!(plan.len(), order.len());
                    let differs = plan.iter().zip(by_the_rule(timeline, order, factor)).position(|(a, b)| *a != b);
                    assert_eq!(differs, None, "factor {factor}: the first buffer placed elsewhere, in turn");
                }
            }
        }
    }

    #[test]
    fn plans_are_valid_and_give_way_to_the_deadline_and_to_the_arena_to_beat() {
        let buffers = random_instance(3_000, 5);
        let inst = Instance::new(&buffers, 1).unwrap();
        let mirrored = inst.mirrored();
        for timeline in [&inst, &mirrored] {
            let order = timeline.by_start(0..inst.len() as u32);
            for factor in [1, 4, 16] {
                let (plan, placed) = aligned_fit_before(timeline, &order, factor, u64::MAX, far());
                let plan = plan.unwrap();
                assert_eq!(placed, order.len());
                let mut offsets = vec![u64::MAX; buffers.len()];
                plan.iter().for_each(|&(i, o)| offsets[i as usize] = o);
                let arena = validate(&buffers, &offsets, 1).unwrap();
                assert_eq!(aligned_fit_before(timeline, &order, factor, arena, far()).0, Some(plan));
                assert_eq!(aligned_fit_before(timeline, &order, factor, arena - 1, far()).0, None);
            }
            assert_eq!(aligned_fit_before(timeline, &order, 4, u64::MAX, Instant::now()), (None, 0));
        }
    }
}
