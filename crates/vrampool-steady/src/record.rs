//! The recording of an iteration that no schedule serves: its events in order, and which live
//! buffer is which of its allocations.

use std::collections::HashMap;

use foldhash::fast::FixedState;

use vrampool_core::StreamId;

use crate::schedule::Recorded;
use crate::thread_lanes::{thread_number, Threads};

#[derive(Debug)]
pub(crate) struct Recorder {
    pub events: Vec<Recorded>,
    /// The iteration's live buffers, by address: their allocation's index, stream and thread (None:
    /// served before the recording went on from there).
    born: HashMap<u64, (u32, StreamId, Option<u32>), FixedState>,
    pub allocations: u32,
    /// The first allocation's size and stream: what picks a schedule by itself (`AUTO_KEY`).
    pub first: Option<(u64, StreamId)>,
    /// Past `limit` events: no longer recorded, and not planned.
    pub overflowed: bool,
    limit: usize,
    /// The iteration was served until it left its schedule (its fallback is counted there).
    pub diverged: bool,
    /// Which threads made the events (`thread_lanes.rs`).
    pub threads: Threads,
}

impl Recorder {
    pub fn new(limit: usize) -> Self {
        Recorder {
            events: Vec::new(),
            born: HashMap::default(),
            allocations: 0,
            first: None,
            overflowed: false,
            limit,
            diverged: false,
            threads: Threads::default(),
        }
    }

    /// The recording of an iteration served up to here: `prefix` as a recording would have seen it,
    /// with the `live` arena buffers (address, allocation index, stream) still to be freed.
    pub fn continuing(prefix: Vec<Recorded>, live: impl IntoIterator<Item = (u64, (u32, StreamId))>, limit: usize) -> Self {
        let allocations = prefix.iter().filter(|e| matches!(e, Recorded::Alloc { .. })).count() as u32;
        let first = prefix.iter().find_map(|e| match *e {
            Recorded::Alloc { size, stream } => Some((size, stream)),
            _ => None,
        });
        let born = live.into_iter().map(|(addr, (index, stream))| (addr, (index, stream, None))).collect();
        Recorder { born, allocations, first, events: prefix, limit, diverged: true, overflowed: false, threads: Threads::default() }
    }

    fn push(&mut self, event: Recorded) {
        self.threads.note();
        if self.events.len() >= self.limit {
            self.overflowed = true;
        }
        if !self.overflowed {
            self.events.push(event);
        }
    }

    pub fn allocated(&mut self, addr: u64, size: u64, stream: StreamId) {
        self.first.get_or_insert((size, stream));
        self.born.insert(addr, (self.allocations, stream, Some(thread_number())));
        self.allocations += 1;
        self.push(Recorded::Alloc { size, stream });
    }

    /// A free of `addr` naming stream `on` (its own when None), of `size` bytes where the caller
    /// named them.
    pub fn freed(&mut self, addr: u64, on: Option<StreamId>, size: Option<u64>) {
        let event = match self.born.remove(&addr) {
            Some((index, own, thread)) => {
                thread.inspect(|&by| self.threads.freed(by));
                Recorded::Free { index, on: on.unwrap_or(own) }
            }
            None => Recorded::FreeOlder { size: size.unwrap_or(0) },
        };
        self.push(event);
    }

    /// `record_stream` of `addr` on `stream`: an event where it is one of the iteration's buffers and
    /// the stream another than its own.
    pub fn used_on(&mut self, addr: u64, stream: StreamId) {
        if let Some(&(index, own, _)) = self.born.get(&addr) {
            if own != stream {
                self.push(Recorded::UsedOn { index });
            }
        }
    }

    /// Whether every buffer the iteration allocated is freed (an automatic boundary).
    pub fn all_freed(&self) -> bool {
        self.allocations > 0 && self.born.is_empty()
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether threads took turns call by call in this recording.
    pub fn interleaved(&self) -> bool {
        self.threads.interleaved()
    }
}
