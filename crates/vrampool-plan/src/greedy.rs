//! The two heuristics: TFLite's greedy by size and XLA's best fit by decreasing size. Both take the buffers
//! in a fixed order and put each into the smallest gap left between the already placed buffers that overlap
//! it in time, or on top of them when no gap is large enough. They differ in the order, and XLA's heap
//! simulator keeps the better of two orders.

use std::time::Instant;

use crate::instance::Instance;
use crate::placed_index::PlacedIndex;
use crate::{Buffer, PlanError};

/// TFLite's `GreedyBySize` offset calculation: largest buffer first (ties in input order), each into the
/// smallest gap among the placed buffers that overlap it in time (lowest such gap on ties), else on top.
/// Returns offsets parallel to `buffers`, multiples of `alignment`.
pub fn greedy_by_size(buffers: &[Buffer], alignment: u64) -> Result<Vec<u64>, PlanError> {
    Ok(greedy_by_size_of(&Instance::new(buffers, alignment)?))
}

/// [`greedy_by_size`] on the checked instance.
pub(crate) fn greedy_by_size_of(inst: &Instance) -> Vec<u64> {
    greedy_by_size_until(inst, None).expect("no deadline")
}

/// Overlapping pairs per buffer up to which greedy by size is cheap (`greedy_is_cheap`).
pub(crate) const CHEAP_OVERLAPS_PER_BUFFER: u64 = 64;

/// Whether greedy by size is cheap on `inst`: a placement scans the placed buffers that overlap it, so with few
/// overlapping pairs (at most `CHEAP_OVERLAPS_PER_BUFFER` a buffer) it costs O(n log n), as the floors fallback
/// does, where tens of thousands of buffers live at once it takes up to 30 s for 60,000. Counted in O(n log n).
pub(crate) fn greedy_is_cheap(inst: &Instance) -> bool {
    overlapping_pairs(inst) <= CHEAP_OVERLAPS_PER_BUFFER * inst.len() as u64
}

/// The pairs of buffers that overlap in time, counted in O(n log n): what a greedy placement scans.
pub(crate) fn overlapping_pairs(inst: &Instance) -> u64 {
    let mut starts = inst.lo.clone();
    let mut ends = inst.hi.clone();
    starts.sort_unstable();
    ends.sort_unstable();
    // The buffers live at each start that started before it: those started, less those ended (which began earlier).
    starts.iter().enumerate().map(|(k, &lo)| (k - ends.partition_point(|&hi| hi <= lo)) as u64).sum()
}

/// [`greedy_by_size_of`], or `None` once `deadline` has passed.
pub(crate) fn greedy_by_size_until(inst: &Instance, deadline: Option<Instant>) -> Option<Vec<u64>> {
    let mut order: Vec<u32> = (0..inst.len() as u32).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(inst.size[i as usize]));
    place_in_order_until(inst, &order, deadline)
}

/// XLA's heap simulator (`GlobalDecreasingSizeBestFitHeap` as chosen by `ChooseBestHeapAlgorithm`): best fit
/// in two orders, spatial (larger size first, then longer lifetime) and temporal (longer lifetime first, then
/// larger size); the plan with the smaller arena is returned.
pub fn best_fit_decreasing(buffers: &[Buffer], alignment: u64) -> Result<Vec<u64>, PlanError> {
    let inst = Instance::new(buffers, alignment)?;
    Ok(best_fit_decreasing_until(&inst, None).expect("no deadline"))
}

/// [`best_fit_decreasing`] that gives up at `deadline`: the better of the orders finished by then, or `None`
/// if neither was.
pub(crate) fn best_fit_decreasing_until(inst: &Instance, deadline: Option<Instant>) -> Option<Vec<u64>> {
    let whole: Vec<u32> = (0..inst.len() as u32).collect();
    let arena = |offsets: &[u64]| arena_of(inst, offsets);
    let spatial = best_fit_by_size_of(inst, &whole, deadline)?;
    let temporal = decreasing(inst, &whole, |i| (inst.span(i) as u64, inst.size[i]));
    let Some(temporal) = place_in_order_until(inst, &temporal, deadline) else {
        return Some(spatial);
    };
    Some(if arena(&temporal) < arena(&spatial) { temporal } else { spatial })
}

/// The arena `offsets` take: the highest end of a buffer.
pub(crate) fn arena_of(inst: &Instance, offsets: &[u64]) -> u64 {
    offsets.iter().zip(&inst.size).map(|(o, s)| o + s).max().unwrap_or(0)
}

/// Best fit in order of start (then input order): what a best-fit pool that never moves a block does online,
/// each buffer into the smallest gap between those live when it starts. Where buffers grow a step at a time
/// by copy (a KV cache decoded a token at a time, each cache live beside its successor), the predecessors
/// freed merge into gaps the next sizes fit; taken by size, each size's buffers land apart from the gaps the
/// next smaller leave.
pub(crate) fn best_fit_by_start(inst: &Instance) -> Vec<u64> {
    let mut order: Vec<u32> = (0..inst.len() as u32).collect();
    order.sort_by_key(|&i| inst.lo[i as usize]);
    place_in_order_until(inst, &order, None).expect("no deadline")
}

/// Best fit decreasing's spatial order alone (larger size first, then longer lifetime) on the buffers `part`,
/// the offsets of the others left at 0; `None` once `deadline` has passed.
pub(crate) fn best_fit_by_size_of(inst: &Instance, part: &[u32], deadline: Option<Instant>) -> Option<Vec<u64>> {
    place_in_order_until(inst, &decreasing(inst, part, |i| (inst.size[i], inst.span(i) as u64)), deadline)
}

/// `part` by `key`, larger first; ties by earlier start, then the part's order (the sort is stable).
fn decreasing(inst: &Instance, part: &[u32], key: impl Fn(usize) -> (u64, u64)) -> Vec<u32> {
    let mut order = part.to_vec();
    order.sort_by_key(|&i| (std::cmp::Reverse(key(i as usize)), inst.lo[i as usize]));
    order
}

/// Places buffers in `order`, each at the start of the smallest gap that holds it between the placed buffers
/// overlapping it in time (the lowest gap on ties), or above all of them; `None` once `deadline` has passed
/// (looked at every 64 buffers: where tens of thousands overlap, one placement scans as many gaps).
fn place_in_order_until(inst: &Instance, order: &[u32], deadline: Option<Instant>) -> Option<Vec<u64>> {
    let mut offsets = vec![0u64; inst.len()];
    let mut index = PlacedIndex::new(inst.segments);
    let mut spans = Vec::new();
    for (n, &i) in order.iter().enumerate() {
        if n % 64 == 63 && deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        offsets[i as usize] = best_fit(inst, &mut index, i, &mut spans);
    }
    Some(offsets)
}

/// Buffer `i`'s offset by best fit among the buffers in `index`, where it is then recorded (`spans` is
/// scratch).
pub(crate) fn best_fit(inst: &Instance, index: &mut PlacedIndex, i: u32, spans: &mut Vec<(u64, u64)>) -> u64 {
    let (lo, hi, size) = (inst.lo[i as usize], inst.hi[i as usize], inst.size[i as usize]);
    spans.clear();
    index.overlapping(lo, hi, spans);
    // By start alone: the scan below needs no order among spans that start together.
    spans.sort_unstable_by_key(|&(start, _)| start);
    // `top` is the highest byte used so far among the spans scanned; a span starting above it leaves a gap.
    let (mut top, mut best): (u64, Option<(u64, u64)>) = (0, None);
    for &(start, end) in spans.iter() {
        if start > top {
            let gap = start - top;
            if gap >= size && best.is_none_or(|(best_gap, _)| gap < best_gap) {
                best = Some((gap, top));
            }
        }
        top = top.max(end);
    }
    let offset = best.map_or(top, |(_, offset)| offset);
    index.insert((offset, offset + size), lo, hi);
    offset
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate;

    #[test]
    fn fills_a_gap_below_a_placed_buffer() {
        // P and Q sit at 0 (their lifetimes do not meet); S spans both, so it goes on top at 100; U meets
        // only S, and the 100 bytes below S are free for it.
        let buffers =
            [Buffer::new(0, 0, 4, 100), Buffer::new(1, 6, 10, 90), Buffer::new(2, 3, 7, 80), Buffer::new(3, 5, 6, 10)];
        for offsets in [greedy_by_size(&buffers, 1).unwrap(), best_fit_decreasing(&buffers, 1).unwrap()] {
            assert_eq!(offsets, vec![0, 0, 100, 0]);
            assert_eq!(validate(&buffers, &offsets, 1).unwrap(), 180);
        }
    }

    #[test]
    fn places_into_gaps_between_overlapping_buffers() {
        let buffers = [
            Buffer::new(0, 0, 2, 50), // X at 0
            Buffer::new(1, 4, 6, 40), // Y at 0 (never meets X)
            Buffer::new(2, 1, 5, 30), // Z meets both: on top, at 50
            Buffer::new(3, 3, 4, 10), // W meets only Z: the 50 bytes below it
            Buffer::new(4, 1, 2, 8),  // U meets X and Z, no gap between them: on top, at 80
            Buffer::new(5, 4, 5, 5),  // V meets Y [0, 40) and Z [50, 80): the 10-byte gap at 40
            Buffer::new(6, 3, 5, 4),  // T meets W, Y, V and Z: the 5-byte gap at 45
        ];
        let offsets = greedy_by_size(&buffers, 1).unwrap();
        assert_eq!(offsets, vec![0, 0, 50, 0, 80, 40, 45]);
        assert_eq!(validate(&buffers, &offsets, 1).unwrap(), 88);
    }

    #[test]
    fn greedy_is_cheap_where_few_buffers_overlap() {
        let cheap = |buffers: &[Buffer]| greedy_is_cheap(&Instance::new(buffers, 1).unwrap());
        let window: Vec<Buffer> = (0..1_000).map(|i| Buffer::new(i, i, i + 65, 512)).collect();
        assert!(cheap(&window), "64 overlapping pairs a buffer");
        let wider: Vec<Buffer> = (0..1_000).map(|i| Buffer::new(i, i, i + 200, 512)).collect();
        assert!(!cheap(&wider));
        let all_at_once: Vec<Buffer> = (0..1_000).map(|i| Buffer::new(i, 0, 1, 512)).collect();
        assert!(!cheap(&all_at_once));
    }

    /// TFLite's greedy by size as written: every placed buffer scanned for each new one.
    fn by_size_plainly(buffers: &[Buffer]) -> Vec<u64> {
        let mut order: Vec<usize> = (0..buffers.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(buffers[i].size));
        let mut offsets: Vec<Option<u64>> = vec![None; buffers.len()];
        for &i in &order {
            let b = &buffers[i];
            let mut spans: Vec<(u64, u64)> = (0..buffers.len())
                .filter_map(|j| {
                    let o = offsets[j]?;
                    (buffers[j].lower < b.upper && b.lower < buffers[j].upper).then_some((o, o + buffers[j].size))
                })
                .collect();
            spans.sort_unstable();
            let (mut top, mut best): (u64, Option<(u64, u64)>) = (0, None);
            for (start, end) in spans {
                if start > top && start - top >= b.size && best.is_none_or(|(gap, _)| start - top < gap) {
                    best = Some((start - top, top));
                }
                top = top.max(end);
            }
            offsets[i] = Some(best.map_or(top, |(_, at)| at));
        }
        offsets.into_iter().map(|o| o.unwrap()).collect()
    }

    #[test]
    fn the_index_finds_the_gaps_a_scan_of_every_placed_buffer_finds() {
        for seed in 0..30 {
            let buffers = crate::random_instance(400, seed);
            assert_eq!(greedy_by_size(&buffers, 1).unwrap(), by_size_plainly(&buffers), "seed {seed}");
        }
    }

    #[test]
    fn offsets_are_aligned() {
        let buffers = [Buffer::new(0, 0, 4, 100), Buffer::new(1, 0, 4, 3), Buffer::new(2, 1, 2, 7)];
        for offsets in [greedy_by_size(&buffers, 64).unwrap(), best_fit_decreasing(&buffers, 64).unwrap()] {
            assert!(offsets.iter().all(|o| o % 64 == 0), "{offsets:?}");
            assert_eq!(validate(&buffers, &offsets, 64).unwrap(), 256);
        }
    }

    #[test]
    fn best_fit_decreasing_gives_up_at_its_deadline_and_is_unchanged_without_one() {
        let buffers = crate::random_instance(5_000, 7);
        let inst = Instance::new(&buffers, 1).unwrap();
        let passed = Instant::now();
        assert_eq!(best_fit_decreasing_until(&inst, Some(passed)), None);
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        assert_eq!(best_fit_decreasing_until(&inst, Some(far)), Some(best_fit_decreasing(&buffers, 1).unwrap()));
    }

    #[test]
    fn greedy_by_size_gives_up_at_its_deadline_and_is_unchanged_without_one() {
        let buffers = crate::random_instance(5_000, 8);
        let inst = Instance::new(&buffers, 1).unwrap();
        assert_eq!(greedy_by_size_until(&inst, Some(Instant::now())), None);
        let far = Instant::now() + std::time::Duration::from_secs(3600);
        assert_eq!(greedy_by_size_until(&inst, Some(far)), Some(greedy_by_size(&buffers, 1).unwrap()));
    }

    #[test]
    fn empty_input_gives_an_empty_plan() {
        assert_eq!(greedy_by_size(&[], 1).unwrap(), Vec::<u64>::new());
        assert_eq!(best_fit_decreasing(&[], 1).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(greedy_by_size(&[Buffer::new(0, 3, 1, 8)], 1), Err(PlanError::EmptyLifetime { .. })));
        assert!(matches!(best_fit_decreasing(&[Buffer::new(0, 0, 1, 0)], 1), Err(PlanError::ZeroSize { .. })));
        let two = [Buffer::new(0, 0, 1, u64::MAX / 2 + 1), Buffer::new(1, 0, 1, u64::MAX / 2 + 1)];
        assert!(matches!(greedy_by_size(&two, 1), Err(PlanError::Overflow { .. })));
        assert!(matches!(greedy_by_size(&[Buffer::new(0, 0, 1, u64::MAX)], 2), Err(PlanError::Overflow { .. })));
    }
}
