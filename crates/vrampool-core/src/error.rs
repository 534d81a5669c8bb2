//! The one error type of the pool. User input never panics: every bad call ends here.

use thiserror::Error;

/// Figures that explain an out-of-memory failure, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OomReport {
    pub requested: u64,
    /// The block the pool's strategy needs for the request where it rounds it past the
    /// alignment (a buddy's power of two: 44 MiB takes 64 MiB); 0 where it does not.
    pub block: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub largest_free: u64,
    /// Bytes the device said were free when the last segment allocation failed (0 if unknown).
    pub device_free: u64,
    /// The pool's limit, if one is set.
    pub limit: Option<u64>,
    /// What a steady arena over the pool holds of `reserved` (its live buffers counted in
    /// `allocated`).
    pub arena: ArenaHeld,
}

/// The bytes a steady arena holds of a pool's reserved memory, and its live buffers among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaHeld {
    pub bytes: u64,
    pub live_bytes: u64,
    pub live_buffers: u64,
}

impl OomReport {
    /// Reserved bytes that neither a live block nor the arena holds.
    pub fn unallocated(&self) -> u64 {
        let arena_idle = self.arena.bytes.saturating_sub(self.arena.live_bytes);
        self.reserved.saturating_sub(self.allocated).saturating_sub(arena_idle)
    }
}

impl std::fmt::Display for OomReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tried to allocate {}", human(self.requested))?;
        if self.block > 0 {
            write!(f, " (which the strategy rounds to {})", human(self.block))?;
        }
        write!(
            f,
            "; pool has {} allocated, {} reserved ({} reserved but unallocated, largest free block {})",
            human(self.allocated),
            human(self.reserved),
            human(self.unallocated()),
            human(self.largest_free),
        )?;
        let ArenaHeld { bytes, live_bytes, live_buffers } = self.arena;
        if bytes > 0 {
            let buffers = if live_buffers == 1 { "buffer" } else { "buffers" };
            write!(
                f,
                "; the steady arena holds {} of the reserved bytes, {} of them in {live_buffers} live {buffers}",
                human(bytes),
                human(live_bytes)
            )?;
            if live_buffers > 0 {
                write!(f, " (a live arena buffer keeps its region from the pool until it is freed)")?;
            }
        }
        if let Some(limit) = self.limit {
            write!(f, "; limit {}", human(limit))?;
        }
        if self.device_free > 0 {
            write!(f, "; device reports {} free", human(self.device_free))?;
        }
        Ok(())
    }
}

/// Bytes in the largest binary unit that keeps the number at or above 1.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Why a device call failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    #[error("device out of memory")]
    OutOfMemory,
    #[error("the device does not support {0}")]
    Unsupported(&'static str),
    #[error("injected fault: {0}")]
    InjectedFault(&'static str),
    #[error("driver error: {0}")]
    Driver(String),
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PoolError {
    #[error("out of memory: {0}")]
    OutOfMemory(OomReport),
    #[error("invalid free of {ptr:#x}: {reason}")]
    InvalidFree { ptr: u64, reason: InvalidFreeReason },
    #[error("invalid size {size}: {reason}")]
    InvalidSize { size: u64, reason: &'static str },
    #[error("wrong device: pool is on device {pool}, call names device {given}")]
    WrongDevice { pool: i32, given: i32 },
    #[error("the pool is closed")]
    Closed,
    #[error("the process forked: this pool belongs to the parent process (make a new pool in the child)")]
    Forked,
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An allocation from memory that is paused (`PoolCore::pause`), or a pause or resume that
    /// could not finish: the message says which, and what state the memory is in.
    #[error("{0}")]
    Paused(String),
    /// Memory that cannot be paused, and why (plain segments, no virtual-memory mapping).
    #[error("cannot pause: {0}")]
    CannotPause(String),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidFreeReason {
    /// The pointer is not a live block of this pool: never allocated here, or already freed.
    NotAllocated,
    /// The pointer is a live block but the caller gave another size.
    WrongSize { expected: u64, given: u64 },
}

impl PoolError {
    /// The error a request of `size` bytes gets from any pool, before it looks for memory: zero
    /// bytes, or more than one block can be (`MAX_REQUEST`); None for every other size.
    pub fn for_request(size: u64) -> Option<PoolError> {
        match size {
            0 => Some(PoolError::InvalidSize { size, reason: "zero bytes requested" }),
            s if s > crate::sizes::MAX_REQUEST => Some(PoolError::InvalidSize { size, reason: TOO_LARGE }),
            _ => None,
        }
    }
}

pub(crate) const TOO_LARGE: &str = "larger than one block can be (128 TiB)";

impl std::fmt::Display for InvalidFreeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAllocated => f.write_str("not a live block of this pool (double free or foreign pointer)"),
            Self::WrongSize { expected, given } => {
                write!(f, "block was allocated with {expected} bytes, free names {given}")
            }
        }
    }
}

pub type Result<T, E = PoolError> = std::result::Result<T, E>;
