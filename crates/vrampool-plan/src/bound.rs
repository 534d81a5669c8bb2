//! The lower bound every plan must meet: the most bytes live at any one moment.

use crate::Buffer;

/// The largest total of bytes live at one time (a sweep over lifetime ends and starts, O(n log n)).
///
/// No plan can use a smaller arena, since the buffers live at that moment need disjoint bytes. Buffers with an
/// empty lifetime count for nothing; totals saturate at `u64::MAX`.
pub fn lower_bound(buffers: &[Buffer]) -> u64 {
    lower_bound_of(buffers.iter().map(|b| (b.lower, b.upper, b.size)))
}

/// The same sweep over `(lower, upper, size)` triples (the planners call it with aligned sizes).
pub(crate) fn lower_bound_of(items: impl Iterator<Item = (u64, u64, u64)>) -> u64 {
    // (time, size, is_start): at equal times ends (false) sort before starts, as [lower, upper) is half-open.
    let mut events: Vec<(u64, bool, u64)> = Vec::new();
    for (lower, upper, size) in items {
        if lower < upper {
            events.push((lower, true, size));
            events.push((upper, false, size));
        }
    }
    events.sort_unstable_by_key(|&(time, is_start, _)| (time, is_start));
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, is_start, size) in events {
        if is_start {
            live = live.saturating_add(size);
            peak = peak.max(live);
        } else {
            live = live.saturating_sub(size);
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_single() {
        assert_eq!(lower_bound(&[]), 0);
        assert_eq!(lower_bound(&[Buffer::new(0, 3, 4, 10)]), 10);
    }

    #[test]
    fn touching_lifetimes_do_not_add_up() {
        let b = [Buffer::new(0, 0, 5, 10), Buffer::new(1, 5, 9, 7)];
        assert_eq!(lower_bound(&b), 10);
    }

    #[test]
    fn overlapping_lifetimes_add_up() {
        let b = [Buffer::new(0, 0, 5, 10), Buffer::new(1, 4, 9, 7), Buffer::new(2, 6, 8, 1)];
        assert_eq!(lower_bound(&b), 17);
    }
}
