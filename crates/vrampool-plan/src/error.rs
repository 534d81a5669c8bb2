//! The one error type of the planner. Bad input never panics: it ends here, with the buffer id or the
//! CSV line that caused it.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PlanError {
    // --- the buffers themselves ---
    #[error("buffer {id}: empty lifetime [{lower}, {upper}) (lower must be below upper)")]
    EmptyLifetime { id: u64, lower: u64, upper: u64 },
    #[error("buffer {id}: size is zero")]
    ZeroSize { id: u64 },
    #[error("buffer id {id} appears twice")]
    DuplicateId { id: u64 },
    #[error("buffer {id}: {what} overflows 64 bits")]
    Overflow { id: u64, what: &'static str },
    #[error("alignment must be at least 1, got 0")]
    ZeroAlignment,
    #[error("capacity must be at least 1 byte, got 0")]
    ZeroCapacity,
    #[error("capacity {capacity} is below buffer {id}'s {size} bytes: no plan can hold it")]
    CapacityBelowBuffer { id: u64, size: u64, capacity: u64 },

    // --- a plan checked by the validator ---
    #[error("a first step of {first} buffers leaves none of the plan's {buffers} for the steps after it")]
    FirstStep { first: usize, buffers: usize },
    #[error("{offsets} offsets given for {buffers} buffers")]
    OffsetCount { buffers: usize, offsets: usize },
    #[error("buffer {id}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned { id: u64, offset: u64, alignment: u64 },
    #[error(
        "buffers {first} and {second} are both live at time {time} and share bytes: \
         [{first_offset}, {first_end}) and [{second_offset}, {second_end})"
    )]
    Overlap {
        first: u64,
        second: u64,
        time: u64,
        first_offset: u64,
        first_end: u64,
        second_offset: u64,
        second_end: u64,
    },

    // --- the CSV reader (line numbers count from 1, the header is line 1) ---
    #[error("line 1: missing header, expected `id,lower,upper,size`")]
    MissingHeader,
    #[error("line {line}: bad header `{found}`, expected `id,lower,upper,size` (optionally `,offset`)")]
    BadHeader { line: usize, found: String },
    #[error("line {line}: expected {expected} fields, found {found}")]
    FieldCount { line: usize, expected: usize, found: usize },
    #[error("line {line}: field `{field}` is negative: `{value}`")]
    Negative { line: usize, field: &'static str, value: String },
    #[error("line {line}: field `{field}` is not a non-negative integer: `{value}`")]
    NotANumber { line: usize, field: &'static str, value: String },
    #[error("line {line}: field `{field}` does not fit in 64 bits: `{value}`")]
    TooLarge { line: usize, field: &'static str, value: String },
    #[error("line {line}: {source}")]
    Buffer {
        line: usize,
        #[source]
        source: Box<PlanError>,
    },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
