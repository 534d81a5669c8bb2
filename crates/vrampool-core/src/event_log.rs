//! The optional record of every allocation event: the trace that replay reads.

use std::time::Instant;

use parking_lot::Mutex;

use crate::device::StreamId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEvent {
    /// Nanoseconds since the pool was made.
    pub time_ns: u64,
    pub kind: EventKind,
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
}

/// Logging takes a lock per event: it is for capturing traces, not for production speed.
pub struct EventLog {
    start: Instant,
    events: Mutex<Vec<LogEvent>>,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new()
    }
}

impl EventLog {
    pub fn new() -> Self {
        Self { start: Instant::now(), events: Mutex::default() }
    }

    pub fn push(&self, kind: EventKind, addr: u64, size: u64, stream: StreamId) {
        let time_ns = self.start.elapsed().as_nanos() as u64;
        self.events.lock().push(LogEvent { time_ns, kind, addr, size, stream });
    }

    /// Takes back the latest event of `kind` at `addr` (one that should not have been logged).
    pub fn retract(&self, kind: EventKind, addr: u64) {
        let mut events = self.events.lock();
        if let Some(at) = events.iter().rposition(|e| e.kind == kind && e.addr == addr) {
            events.remove(at);
        }
    }

    pub fn take(&self) -> Vec<LogEvent> {
        std::mem::take(&mut *self.events.lock())
    }
}

/// What happened to a piece of a carved block (`MemoryResource::piece`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceEvent {
    Allocated,
    Freed,
    /// Freed while other streams may still use it: logged, not scrubbed now (its block is, once it
    /// goes back after those streams).
    FreedInUse,
}
