//! The orders in which the exact search (`exact/`) and lowest floor first (`floors/`) prefer buffers.

/// The search's preference among buffers that could go at the same offset. The first three are MiniMalloc's
/// preorderings: T is the tightest section a buffer lives in (the most bytes live there), W its lifetime length
/// (its width when time runs left to right), A its area (size times lifetime length), each larger first and
/// compared in the order of the letters. A search with one order can stall for long on an instance that
/// another order solves at once, so the search takes turns with them (see `exact/probe.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    Twa,
    Taw,
    Wat,
    /// Earlier start first, then longer lifetime.
    Time,
    /// Larger area first, then tighter section.
    Area,
}

/// What the orders compare of a buffer.
pub(crate) struct Traits {
    pub size: u64,
    /// Lifetime length in the input's time units.
    pub length: u64,
    pub lo: u32,
    pub hi: u32,
    /// The T key: the most bytes live at a moment of its lifetime.
    pub tight: u64,
}

impl Order {
    /// Sorts buffers (indices) by this order, ties by index.
    pub fn sort(self, items: &mut [u32], traits: impl Fn(usize) -> Traits) {
        use std::cmp::Reverse as R;
        // Three keys, each larger first.
        let keys = |t: Traits| -> [u128; 3] {
            let area = t.size as u128 * t.length as u128;
            let (tight, length) = (t.tight as u128, t.length as u128);
            match self {
                Order::Twa => [tight, length, area],
                Order::Taw => [tight, area, length],
                Order::Wat => [length, area, tight],
                Order::Time => [u128::MAX - t.lo as u128, t.hi as u128, t.size as u128],
                Order::Area => [area, tight, 0],
            }
        };
        items.sort_by_cached_key(|&i| (keys(traits(i as usize)).map(R), i));
    }
}
