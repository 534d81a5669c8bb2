//! An independent checker for plans. It shares no code with the planners beyond the input checks: a sweep
//! over time keeps the live buffers in an ordered map by offset, and each arriving buffer is compared with its
//! two neighbours in that map, so a plan of n buffers is checked in O(n log n).

use std::collections::BTreeMap;

use crate::buffer::{check_buffers, round_up};
use crate::{Buffer, PlanError};

/// Checks that `offsets` (parallel to `buffers`) is a valid plan: every offset is a multiple of `alignment`,
/// and no two buffers whose lifetimes overlap share a byte (buffer `i` occupies `[offsets[i], offsets[i] +
/// size)`). Returns the arena size the plan needs: the highest end of any buffer, rounded up to `alignment`.
pub fn validate(buffers: &[Buffer], offsets: &[u64], alignment: u64) -> Result<u64, PlanError> {
    check_buffers(buffers, alignment)?;
    if buffers.len() != offsets.len() {
        return Err(PlanError::OffsetCount { buffers: buffers.len(), offsets: offsets.len() });
    }
    let mut arena = 0u64;
    for (b, &offset) in buffers.iter().zip(offsets) {
        if offset % alignment != 0 {
            return Err(PlanError::Misaligned { id: b.id, offset, alignment });
        }
        let end = offset.checked_add(b.size).ok_or(PlanError::Overflow { id: b.id, what: "offset + size" })?;
        arena = arena.max(end);
    }
    let arena = round_up(arena, alignment).ok_or(PlanError::Overflow { id: 0, what: "arena rounded up" })?;

    // Events sorted by time; at equal times ends come first, as lifetimes are half-open.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * buffers.len());
    for (i, b) in buffers.iter().enumerate() {
        events.push((b.lower, true, i));
        events.push((b.upper, false, i));
    }
    events.sort_unstable_by_key(|&(time, is_start, i)| (time, is_start, i));

    // Live buffers by offset. Invariant: their byte ranges are pairwise disjoint, so an arriving buffer only
    // has to be compared with the nearest live buffer below it and the nearest at or above it.
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    for (time, is_start, i) in events {
        let offset = offsets[i];
        if !is_start {
            live.remove(&offset);
            continue;
        }
        let end = offset + buffers[i].size;
        let below = live.range(..offset).next_back();
        let above = live.range(offset..).next();
        for (&other_offset, &j) in below.into_iter().chain(above) {
            let other_end = other_offset + buffers[j].size;
            if other_offset < end && offset < other_end {
                return Err(PlanError::Overlap {
                    first: buffers[j].id,
                    second: buffers[i].id,
                    time,
                    first_offset: other_offset,
                    first_end: other_end,
                    second_offset: offset,
                    second_end: end,
                });
            }
        }
        live.insert(offset, i);
    }
    Ok(arena)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: u64, lower: u64, upper: u64, size: u64) -> Buffer {
        Buffer::new(id, lower, upper, size)
    }

    #[test]
    fn accepts_disjoint_bytes_and_returns_the_arena() {
        // Buffer 2 meets buffer 1 but not buffer 0, so it may reuse buffer 0's bytes.
        let buffers = [b(0, 0, 10, 4), b(1, 5, 15, 4), b(2, 12, 20, 8)];
        assert_eq!(validate(&buffers, &[0, 4, 8], 1).unwrap(), 16);
        assert_eq!(validate(&buffers, &[4, 0, 4], 1).unwrap(), 12);
    }

    #[test]
    fn accepts_shared_bytes_when_lifetimes_only_touch() {
        // [0, 5) and [5, 9) never meet, so they may use the same bytes.
        let buffers = [b(0, 0, 5, 8), b(1, 5, 9, 8)];
        assert_eq!(validate(&buffers, &[0, 0], 1).unwrap(), 8);
    }

    #[test]
    fn accepts_byte_ranges_that_touch() {
        let buffers = [b(0, 0, 5, 8), b(1, 0, 5, 8)];
        assert_eq!(validate(&buffers, &[0, 8], 1).unwrap(), 16);
    }

    #[test]
    fn rejects_overlapping_bytes_of_overlapping_lifetimes() {
        let buffers = [b(7, 0, 5, 8), b(9, 4, 9, 8)];
        let err = validate(&buffers, &[0, 7], 1).unwrap_err();
        match err {
            PlanError::Overlap { first, second, time, .. } => {
                assert_eq!((first, second, time), (7, 9, 4));
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn rejects_a_buffer_inside_another() {
        let buffers = [b(0, 0, 10, 100), b(1, 2, 3, 1)];
        assert!(matches!(validate(&buffers, &[0, 50], 1), Err(PlanError::Overlap { .. })));
        // And the other way round: the large one arrives second.
        let buffers = [b(0, 2, 3, 1), b(1, 1, 10, 100)];
        assert!(matches!(validate(&buffers, &[50, 0], 1), Err(PlanError::Overlap { .. })));
    }

    #[test]
    fn rejects_an_overlap_hidden_behind_a_neighbour() {
        // Live together at time 2: [0,10), [10,20) and [5,15): the last overlaps both.
        let buffers = [b(0, 0, 4, 10), b(1, 1, 4, 10), b(2, 2, 3, 10)];
        assert!(validate(&buffers, &[0, 10, 20], 1).is_ok());
        assert!(matches!(validate(&buffers, &[0, 10, 5], 1), Err(PlanError::Overlap { .. })));
    }

    #[test]
    fn finds_the_overlap_in_a_long_valid_plan() {
        // 1000 buffers stacked in ten columns, then one moved onto its neighbour.
        let buffers: Vec<Buffer> = (0..1000).map(|i| b(i, i / 10, i / 10 + 3, 16)).collect();
        let mut offsets: Vec<u64> = (0..1000).map(|i| (i % 30) * 16).collect();
        assert_eq!(validate(&buffers, &offsets, 16).unwrap(), 480);
        // Buffer 500 onto buffer 499's bytes: the same ten-buffer column, so the same lifetime.
        offsets[500] -= 16;
        assert!(matches!(validate(&buffers, &offsets, 1), Err(PlanError::Overlap { .. })));
    }

    #[test]
    fn rejects_misaligned_offsets() {
        let buffers = [b(0, 0, 5, 8), b(1, 0, 5, 8)];
        assert_eq!(validate(&buffers, &[0, 8], 8).unwrap(), 16);
        assert!(matches!(
            validate(&buffers, &[0, 12], 8),
            Err(PlanError::Misaligned { id: 1, offset: 12, alignment: 8 })
        ));
    }

    #[test]
    fn rounds_the_arena_up_to_the_alignment() {
        let buffers = [b(0, 0, 5, 100)];
        assert_eq!(validate(&buffers, &[0], 64).unwrap(), 128);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(validate(&[b(0, 0, 5, 8)], &[], 1), Err(PlanError::OffsetCount { .. })));
        assert!(matches!(validate(&[b(0, 0, 5, 8)], &[0], 0), Err(PlanError::ZeroAlignment)));
        assert!(matches!(validate(&[b(0, 5, 5, 8)], &[0], 1), Err(PlanError::EmptyLifetime { .. })));
        assert!(matches!(validate(&[b(0, 0, 5, 0)], &[0], 1), Err(PlanError::ZeroSize { .. })));
        assert!(matches!(validate(&[b(3, 0, 5, 8), b(3, 6, 7, 8)], &[0, 0], 1), Err(PlanError::DuplicateId { id: 3 })));
        assert!(matches!(validate(&[b(0, 0, 5, 8)], &[u64::MAX - 3], 1), Err(PlanError::Overflow { .. })));
    }
}
