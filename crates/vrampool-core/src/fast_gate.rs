//! What turns a pool's fastest paths off: one word with a bit per reason, so that each fastest
//! path tests a single load. The slow paths set and clear the bits as their state changes.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

#[derive(Default)]
pub struct FastGate(AtomicU32);

impl FastGate {
    /// The pool is closed: every call fails.
    pub const CLOSED: u32 = 1;
    /// Some frees wait for events: an allocation completes those that are done first.
    pub const DEFERRED: u32 = 2;
    /// Some live block was used on other streams too (`record_stream`): its free waits for them.
    pub const RECORDED: u32 = 4;
    /// The cap is below some thread-cached block's size: an allocation checks the cap.
    pub const SMALL_CAP: u32 = 8;
    /// An option wants to see every call (scrubbing, the event log, leak tracking); for the
    /// pool's life.
    pub const WATCHED: u32 = 16;
    /// The pool's memory is paused: every allocation fails (frees go on, in the books alone).
    pub const PAUSED: u32 = 32;
    /// The reasons that turn the fastest allocation off, and the fastest free.
    pub const ALLOC: u32 = Self::CLOSED | Self::DEFERRED | Self::SMALL_CAP | Self::WATCHED | Self::PAUSED;
    pub const FREE: u32 = Self::CLOSED | Self::RECORDED | Self::WATCHED;

    /// Sets or clears `bit`; returns whether it was set before.
    pub fn set(&self, bit: u32, on: bool) -> bool {
        let before = match on {
            true => self.0.fetch_or(bit, Relaxed),
            false => self.0.fetch_and(!bit, Relaxed),
        };
        before & bit != 0
    }

    /// Whether any of `bits` is set.
    #[inline(always)]
    pub fn any(&self, bits: u32) -> bool {
        self.0.load(Relaxed) & bits != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_closes_the_paths_it_names() {
        let gate = FastGate::default();
        assert!(!gate.any(FastGate::ALLOC | FastGate::FREE));
        assert!(!gate.set(FastGate::RECORDED, true));
        assert!(gate.any(FastGate::FREE) && !gate.any(FastGate::ALLOC), "a recorded stream slows frees only");
        assert!(!gate.set(FastGate::DEFERRED, true));
        assert!(gate.any(FastGate::ALLOC));
        assert!(gate.set(FastGate::RECORDED, false), "it was set");
        assert!(!gate.any(FastGate::FREE) && gate.any(FastGate::ALLOC));
        assert!(gate.set(FastGate::DEFERRED, false));
        assert!(!gate.any(FastGate::ALLOC | FastGate::FREE));
        assert!(!gate.set(FastGate::WATCHED, true));
        assert!(gate.any(FastGate::ALLOC) && gate.any(FastGate::FREE));
        gate.set(FastGate::WATCHED, false);
        assert!(!gate.set(FastGate::CLOSED, true) && gate.set(FastGate::CLOSED, true), "closing twice is seen");
        assert!(gate.any(FastGate::ALLOC) && gate.any(FastGate::FREE));
    }
}
