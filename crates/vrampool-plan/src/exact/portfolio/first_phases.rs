//! The first-phases stage: best fit by start with a first phase placed before the rest (the longest-lived
//! buffers, the largest, or those of a share of the bound), each phase in order of start.

use crate::instance::Instance;

/// Which buffers best fit by start places before the rest, each phase in order of start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum First {
    /// None: every buffer in order of start.
    Nothing,
    /// The buffers whose lifetimes are longer than those of all but this percentage of the buffers.
    Longest(usize),
    /// The buffers larger than all but this percentage of the buffers.
    Largest(usize),
    /// The buffers of at least this many thousandths of the part's lower bound: a step's logits or a prompt's
    /// MLP rows, each a few percent of the bytes at the busiest moment, whose slots the many smaller caches
    /// would otherwise break up.
    Bytes(u64),
}

/// The part's buffers in the order best fit by start takes them on `timeline`: those of `first`, then the rest,
/// each in order of start.
pub(crate) fn fit_order(timeline: &Instance, part: &[u32], first: First) -> Vec<u32> {
    let cut = |key: &dyn Fn(usize) -> u64, percent: usize| {
        let mut keys: Vec<u64> = part.iter().map(|&i| key(i as usize)).collect();
        keys.sort_unstable();
        keys.get(keys.len() * (100 - percent.min(100)) / 100).copied().unwrap_or(u64::MAX)
    };
    let span = |i: usize| timeline.span(i) as u64;
    let size = |i: usize| timeline.size[i];
    let later: Box<dyn Fn(usize) -> bool> = match first {
        First::Nothing => Box::new(|_| false),
        First::Longest(percent) => {
            let cut = cut(&span, percent);
            Box::new(move |i| span(i) <= cut)
        }
        First::Largest(percent) => {
            let cut = cut(&size, percent);
            Box::new(move |i| size(i) <= cut)
        }
        First::Bytes(per_mille) => {
            let bound = timeline.bound_of(part.iter().copied());
            Box::new(move |i| size(i).saturating_mul(1000) < bound.saturating_mul(per_mille))
        }
    };
    let mut order = part.to_vec();
    order.sort_by_cached_key(|&i| (later(i as usize), timeline.lo[i as usize], i));
    order
}
