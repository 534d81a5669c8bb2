//! The stream-order race check.
//!
//! Every piece of queued work that touches device memory is *pending* from the moment it is
//! queued until its stream's worker has done it. Each stream (and the host) carries a vector
//! clock: for every other stream, the last piece of its work that it is known to come after
//! (through `cuStreamWaitEvent`, the legacy default stream's implicit synchronisation, or, for
//! the host, a synchronisation or a completed query). New work on stream B, or a host access
//! through a driver call (a synchronous copy, a free, an unmap), that overlaps pending work of
//! another stream A, where one of the two writes and B (or the host) is not known to come after
//! that work, is a race: counted, logged with both streams and the bytes, and, in strict mode,
//! the end of the process (as a sanitizer ends it).
//!
//! Only pending work is checked: the emulator's delayed "kernel" (`emucuda_launch_fill`) keeps
//! work pending long enough that a missing wait shows.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Stream id -> the sequence number of the last work of that stream known to be done before.
pub type Clock = HashMap<u64, u64>;

/// Merges `other` into `into` (the later of each entry).
pub fn merge(into: &mut Clock, other: &Clock) {
    for (&stream, &seq) in other {
        let entry = into.entry(stream).or_insert(0);
        *entry = (*entry).max(seq);
    }
}

/// Who accesses memory: a stream (its id) or the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    Stream(u64),
    Host,
}

/// One access of queued work: stream `stream`'s `seq`-th work touches `[lo, hi)`.
#[derive(Debug, Clone)]
pub struct Access {
    pub lo: u64,
    pub hi: u64,
    pub write: bool,
}

#[derive(Debug, Clone)]
struct Pending {
    stream: u64,
    label: String,
    seq: u64,
    what: &'static str,
    access: Access,
}

/// A pending piece of work the checked access must wait for: (stream id, its sequence number).
pub type Conflict = (u64, u64);

#[derive(Default)]
pub struct Races {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    next_id: u64,
    host: Clock,
    count: u64,
    /// The most recent reports (at most `KEPT`).
    reports: Vec<String>,
    strict: bool,
}

const KEPT: usize = 64;

impl Races {
    pub fn new(strict: bool) -> Self {
        let races = Self::default();
        races.state.lock().strict = strict;
        races
    }

    /// Checks the accesses of new work (or of the host when `actor` is the host, with the host's
    /// own clock) against pending work; reports each race; for new work, registers its
    /// accesses as pending and returns their ids. `seq` is the work's sequence number on its
    /// stream. Returns the conflicts found too (the host waits for them before freeing).
    pub fn check(
        &self,
        actor: Actor,
        label: &str,
        clock: Option<&Clock>,
        seq: u64,
        what: &'static str,
        accesses: &[Access],
    ) -> (Vec<u64>, Vec<Conflict>) {
        let mut state = self.state.lock();
        let mut conflicts = Vec::new();
        let mut reports = Vec::new();
        {
            let known = match actor {
                Actor::Host => &state.host,
                Actor::Stream(_) => clock.expect("work carries its stream's clock"),
            };
            for p in state.pending.values() {
                if actor == Actor::Stream(p.stream) {
                    continue; // one stream's work is in order
                }
                if known.get(&p.stream).copied().unwrap_or(0) >= p.seq {
                    continue; // ordered after it
                }
                for a in accesses {
                    let (lo, hi) = (a.lo.max(p.access.lo), a.hi.min(p.access.hi));
                    if lo < hi && (a.write || p.access.write) {
                        conflicts.push((p.stream, p.seq));
                        reports.push(format!(
                            "stream-order race on [{lo:#x}, {hi:#x}) ({} B): {label} {} it ({what}) while {} ({}, work #{}) still {} it, with no wait between",
                            hi - lo,
                            if a.write { "writes" } else { "reads" },
                            p.label,
                            p.what,
                            p.seq,
                            if p.access.write { "writes" } else { "reads" },
                        ));
                    }
                }
            }
        }
        let mut ids = Vec::new();
        if let Actor::Stream(stream) = actor {
            for a in accesses {
                let id = state.next_id;
                state.next_id += 1;
                state.pending.insert(id, Pending { stream, label: label.to_string(), seq, what, access: a.clone() });
                ids.push(id);
            }
        }
        for report in reports {
            Self::report(&mut state, report);
        }
        (ids, conflicts)
    }

    fn report(state: &mut State, text: String) {
        state.count += 1;
        Self::keep(state, text);
    }

    /// Logs a report and keeps it; in strict mode, ends the process.
    fn keep(state: &mut State, text: String) {
        eprintln!("emulated CUDA driver: {text}");
        if state.reports.len() == KEPT {
            state.reports.remove(0);
        }
        state.reports.push(text);
        if state.strict {
            eprintln!("emulated CUDA driver: strict mode (EMULATED_CUDA_STRICT=1): aborting");
            std::process::abort();
        }
    }

    /// Work `ids` is done.
    pub fn done(&self, ids: &[u64]) {
        let mut state = self.state.lock();
        for id in ids {
            state.pending.remove(id);
        }
    }

    /// Whether any pending work touches `[lo, hi)`.
    pub fn pending_on(&self, lo: u64, hi: u64) -> bool {
        self.state.lock().pending.values().any(|p| p.access.lo < hi && lo < p.access.hi)
    }

    /// The host now comes after everything `clock` says.
    pub fn host_learns(&self, clock: &Clock) {
        merge(&mut self.state.lock().host, clock);
    }

    pub fn count(&self) -> u64 {
        self.state.lock().count
    }

    pub fn reports(&self) -> Vec<String> {
        self.state.lock().reports.clone()
    }

    pub fn set_strict(&self, on: bool) {
        self.state.lock().strict = on;
    }

    /// A fault found by the emulator itself (an illegal address), reported like a race but
    /// not counted as one.
    pub fn report_fault(&self, text: String) {
        Self::keep(&mut self.state.lock(), text);
    }

    pub fn reset(&self) {
        let mut state = self.state.lock();
        state.count = 0;
        state.reports.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(lo: u64, hi: u64) -> Access {
        Access { lo, hi, write: true }
    }

    fn r(lo: u64, hi: u64) -> Access {
        Access { lo, hi, write: false }
    }

    #[test]
    fn unordered_overlap_is_a_race_ordered_is_not() {
        let races = Races::new(false);
        let a_clock: Clock = [(1, 1)].into();
        let (ids, _) = races.check(Actor::Stream(1), "stream A", Some(&a_clock), 1, "kernel", &[w(100, 200)]);
        // B knows nothing of A: a race on the overlap.
        let b_clock: Clock = [(2, 1)].into();
        let (_, conflicts) = races.check(Actor::Stream(2), "stream B", Some(&b_clock), 1, "memset", &[w(150, 250)]);
        assert_eq!(conflicts, vec![(1, 1)]);
        assert_eq!(races.count(), 1);
        let report = &races.reports()[0];
        assert!(report.contains("[0x96, 0xc8)") && report.contains("stream A") && report.contains("stream B"), "{report}");
        // C waited for A's work: no race.
        let c_clock: Clock = [(3, 2), (1, 1)].into();
        let (c_ids, _) = races.check(Actor::Stream(3), "stream C", Some(&c_clock), 2, "memset", &[w(100, 150)]);
        assert_eq!(races.count(), 1);
        // Disjoint bytes, or two reads: no race.
        races.check(Actor::Stream(2), "stream B", Some(&b_clock), 2, "memset", &[w(200, 300)]);
        let (read_ids, _) = races.check(Actor::Stream(4), "stream D", Some(&Clock::new()), 1, "copy", &[r(0, 50)]);
        races.check(Actor::Stream(5), "stream E", Some(&Clock::new()), 1, "copy", &[r(0, 50)]);
        assert_eq!(races.count(), 1);
        races.done(&read_ids);
        // Once A's and C's work is done nothing pends there any more.
        races.done(&ids);
        races.done(&c_ids);
        races.check(Actor::Host, "the host", None, 0, "cuMemFree", &[w(100, 150)]);
        assert_eq!(races.count(), 1);
    }

    #[test]
    fn the_host_is_ordered_by_what_it_synchronised() {
        let races = Races::new(false);
        races.check(Actor::Stream(7), "stream 7", Some(&[(7, 3)].into()), 3, "kernel", &[w(0, 10)]);
        races.check(Actor::Host, "the host", None, 0, "cuMemcpyDtoH", &[r(0, 10)]);
        assert_eq!(races.count(), 1, "the host read bytes stream 7 still writes");
        races.host_learns(&[(7, 3)].into());
        let (_, conflicts) = races.check(Actor::Host, "the host", None, 0, "cuMemFree", &[w(0, 10)]);
        assert!(conflicts.is_empty());
        assert_eq!(races.count(), 1);
    }

    #[test]
    fn clocks_merge_to_the_later_entry() {
        let mut a: Clock = [(1, 5), (2, 1)].into();
        merge(&mut a, &[(1, 3), (2, 4), (3, 1)].into());
        assert_eq!(a, [(1, 5), (2, 4), (3, 1)].into());
    }
}
