//! The planner's input: a buffer is `size` bytes live on the half-open time interval `[lower, upper)`.

use std::collections::HashSet;

use crate::PlanError;

/// One buffer (tensor) to place: live on `[lower, upper)`, `size` bytes.
///
/// Two buffers conflict when their lifetimes overlap: `a.lower < b.upper && b.lower < a.upper`. A buffer that
/// ends at time `t` and one that starts at `t` do not conflict and may share bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub id: u64,
    pub lower: u64,
    pub upper: u64,
    pub size: u64,
}

impl Buffer {
    pub fn new(id: u64, lower: u64, upper: u64, size: u64) -> Self {
        Buffer { id, lower, upper, size }
    }

    /// Whether the two lifetimes share a moment.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// Rejects what no plan can serve: an empty lifetime, a zero size, a repeated id, and sizes that overflow
/// once rounded up to `alignment`.
pub(crate) fn check_buffers(buffers: &[Buffer], alignment: u64) -> Result<(), PlanError> {
    if alignment == 0 {
        return Err(PlanError::ZeroAlignment);
    }
    let mut seen = HashSet::with_capacity(buffers.len());
    // Every planner stacks buffers at most this high, so checking the total once keeps their arithmetic
    // overflow-free.
    let mut total: u64 = 0;
    for b in buffers {
        check_one(b)?;
        let size = round_up(b.size, alignment)
            .ok_or(PlanError::Overflow { id: b.id, what: "size rounded up to the alignment" })?;
        total = total.checked_add(size).ok_or(PlanError::Overflow { id: b.id, what: "total of all sizes" })?;
        if !seen.insert(b.id) {
            return Err(PlanError::DuplicateId { id: b.id });
        }
    }
    Ok(())
}

pub(crate) fn check_one(b: &Buffer) -> Result<(), PlanError> {
    if b.lower >= b.upper {
        return Err(PlanError::EmptyLifetime { id: b.id, lower: b.lower, upper: b.upper });
    }
    if b.size == 0 {
        return Err(PlanError::ZeroSize { id: b.id });
    }
    Ok(())
}

/// `value` rounded up to a multiple of `alignment` (>= 1), or `None` on overflow.
pub(crate) fn round_up(value: u64, alignment: u64) -> Option<u64> {
    match value % alignment {
        0 => Some(value),
        r => value.checked_add(alignment - r),
    }
}
