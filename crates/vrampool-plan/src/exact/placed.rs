//! A plan of a part as (instance index, offset) pairs, and its buffers placed one at a time in a given order:
//! what the large parts' stages (`portfolio.rs`, `classes.rs`, `lowering.rs`) share.

use std::time::Instant;

use crate::greedy::best_fit;
use crate::instance::Instance;
use crate::placed_index::{free_elsewhere, PlacedIndex};

/// A plan of a part: (instance index, offset) per buffer, and its arena.
pub(crate) type Placed = (Vec<(u32, u64)>, u64);

/// Buffers placed between looks at the clock: where thousands of long-lived buffers leave gaps between them, a
/// placement by best fit scans them all (tens of microseconds), and 1,024 placements overran the deadline by
/// up to 70 ms.
const CLOCK_EVERY: usize = 64;

/// The arena of a part's plan: the highest top of its buffers.
pub(crate) fn arena_of(inst: &Instance, plan: &[(u32, u64)]) -> u64 {
    plan.iter().map(|&(i, o)| o + inst.size[i as usize]).max().unwrap_or(0)
}

/// `order` placed by best fit, if done before `deadline` with no buffer's top above `beat`; and how many
/// buffers were placed.
pub(crate) fn fit_before(
    inst: &Instance,
    order: &[u32],
    beat: u64,
    deadline: Instant,
) -> (Option<Vec<(u32, u64)>>, usize) {
    fit_onto(inst, (PlacedIndex::new(inst.segments), Vec::with_capacity(order.len())), order, beat, deadline)
}

/// [`fit_before`] among buffers already placed: `placed` holds them, `offsets` their plan, which the placements
/// of `order` extend; the count is of `order`'s buffers.
pub(crate) fn fit_onto(
    inst: &Instance,
    (mut placed, offsets): (PlacedIndex, Vec<(u32, u64)>),
    order: &[u32],
    beat: u64,
    deadline: Instant,
) -> (Option<Vec<(u32, u64)>>, usize) {
    let mut spans = Vec::new();
    let done = place_in_turn(inst, offsets, order, (beat, deadline), |i| best_fit(inst, &mut placed, i, &mut spans));
    free_elsewhere(placed);
    done
}

/// `order`'s buffers, each at the offset `place` gives it (and records), appended to `offsets`, if done before
/// `deadline` with no buffer's top above `beat`; and how many of `order`'s buffers were placed.
pub(crate) fn place_in_turn(
    inst: &Instance,
    mut offsets: Vec<(u32, u64)>,
    order: &[u32],
    (beat, deadline): (u64, Instant),
    mut place: impl FnMut(u32) -> u64,
) -> (Option<Vec<(u32, u64)>>, usize) {
    for (k, &i) in order.iter().enumerate() {
        if k % CLOCK_EVERY == 0 && Instant::now() >= deadline {
            return (None, k);
        }
        let offset = place(i);
        if offset + inst.size[i as usize] > beat {
            return (None, k + 1);
        }
        offsets.push((i, offset));
    }
    (Some(offsets), order.len())
}
