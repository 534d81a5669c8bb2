//! Backing off where nothing repeats. Recording costs every call a lock and a map entry, so a
//! program whose iterations are never served (each one new, or too short to plan, or one that never
//! ends) stops being recorded for a while, and each time it is still not served after that, for
//! twice as long: its calls then go straight to the pool, counted by thread (no shared line is
//! written on that path but the thread's own counter).

use std::cell::Cell;
use std::collections::HashMap;

use foldhash::fast::FixedState;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Unserved iterations in a row after which recording stops for a while.
pub(crate) const BACKOFF_AFTER: u32 = 8;
/// The shortest wait, in allocations.
const IDLE_MIN: u64 = 4096;
/// The wait is at least this many allocations per event the unserved iterations recorded: what
/// recording them cost, at most a sixteenth of the calls that follow.
const IDLE_PER_EVENT: u64 = 16;
/// And this many per event of the recordings planned meanwhile (and not served): planning costs
/// tens of times what recording does per event (`step, 2 threads` in c_abi_bench: two threads'
/// interleaved steps, each iteration new, planned 8 at a time between short waits, spent 13% of the
/// time planning).
const IDLE_PER_PLANNED_EVENT: u64 = 512;
/// The wait doubles with each backoff in a row, up to this many times.
const MAX_LEVEL: u32 = 12;
/// A recording that reaches this many events is given up (a program that never comes back to
/// nothing live would record for ever); each time that happens the next may go twice as far.
pub(crate) const FIRST_RECORD_LIMIT: usize = 1 << 16;
pub(crate) const MAX_RECORD_LIMIT: usize = 1 << 20;

/// While a wait is long, every this many allocations one short recording (a probe, of at most
/// `PROBE_EVENTS` events) looks whether the program repeats now; where it does not, the wait goes
/// on, unchanged. Design: the doubling waits of a program that never repeated (at the most, 4,096
/// times a recording's cost) kept a loop that began after it on the pool for good (c_abi_bench's
/// `step, 2 threads` after `random`: tens of millions of allocations); a probe costs at most a
/// 256th of the calls between probes, recorded.
pub(crate) const PROBE_EVERY: u64 = 256 * PROBE_EVENTS as u64;
pub(crate) const PROBE_EVENTS: usize = 4096;

/// Counts an allocation this many times before the shared count is read.
const CHECK_EVERY: u64 = 256;
const SHARDS: usize = 8;

#[repr(align(128))]
#[derive(Default)]
struct Shard(AtomicU64);

/// Allocations made while idle, per shard of threads. A count is a load and a store, not a locked
/// add: two threads sharing a shard (past `SHARDS` threads) may lose counts, which only makes the
/// wait longer.
#[derive(Default)]
pub(crate) struct IdleCount {
    shards: [Shard; SHARDS],
    /// The count at which the wait is over.
    until: AtomicU64,
}

thread_local! {
    /// This thread's shard, once it has counted (`SHARDS` before).
    static SHARD: Cell<usize> = const { Cell::new(SHARDS) };
}

/// This thread's shard: threads take them in turn.
#[inline(always)]
fn shard() -> usize {
    let shard = SHARD.try_with(Cell::get).unwrap_or(0);
    if shard < SHARDS {
        return shard;
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let shard = NEXT.fetch_add(1, Relaxed) as usize % SHARDS;
    let _ = SHARD.try_with(|s| s.set(shard));
    shard
}

impl IdleCount {
    /// Counts an allocation; true when the wait is over (checked every `CHECK_EVERY` of a shard's).
    #[inline(always)]
    pub fn count(&self) -> bool {
        let n = self.add_one();
        n % CHECK_EVERY == 0 && self.total() >= self.until.load(Relaxed)
    }

    /// Counts an allocation without checking the wait; this thread's shard's count after it.
    #[inline(always)]
    pub fn add_one(&self) -> u64 {
        let counter = &self.shards[shard()].0;
        let n = counter.load(Relaxed) + 1;
        counter.store(n, Relaxed);
        n
    }

    /// For an allocation that may not happen: this thread's counter and its count once the
    /// allocation is made (stored by the caller then), or None where that count is one at which
    /// the wait is checked (`count` then).
    #[inline(always)]
    pub fn next_unchecked(&self) -> Option<(&AtomicU64, u64)> {
        let counter = &self.shards[shard()].0;
        let n = counter.load(Relaxed) + 1;
        (n % CHECK_EVERY != 0).then_some((counter, n))
    }

    pub fn total(&self) -> u64 {
        self.shards.iter().map(|s| s.0.load(Relaxed)).sum()
    }

    /// The count at which the wait is over.
    pub fn until(&self) -> u64 {
        self.until.load(Relaxed)
    }

    /// Starts a wait of `allocations`.
    pub fn wait(&self, allocations: u64) {
        self.until.store(self.total().saturating_add(allocations), Relaxed);
    }
}

/// Where a wait stands: when it ends, and whether a probe is recording (`PROBE_EVERY`).
#[derive(Debug, Default)]
pub(crate) struct Probes {
    /// The idle count at which the whole wait ends.
    pub wait_until: u64,
    /// While a probe records: the events it may still record.
    pub left: Option<usize>,
}

/// When to stop recording, and for how long.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// Iterations in a row not served from a schedule, the events recorded in them, and the events
    /// of the recordings planned meanwhile.
    unserved: u32,
    recorded_events: u64,
    planned_events: u64,
    /// Backoffs since an iteration was last served: each doubles the wait.
    level: u32,
    /// The events a recording may reach before it is given up.
    pub record_limit: usize,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { unserved: 0, recorded_events: 0, planned_events: 0, level: 0, record_limit: FIRST_RECORD_LIMIT }
    }
}

impl Backoff {
    pub fn served(&mut self) {
        (self.unserved, self.recorded_events, self.planned_events, self.level) = (0, 0, 0, 0);
    }

    /// A recording of `events` planned.
    pub fn planned(&mut self, events: usize) {
        self.planned_events += events as u64;
    }

    /// An iteration that was recorded (`events` of it), not served; the wait to start, in
    /// allocations, when it is time to back off.
    pub fn unserved(&mut self, events: usize) -> Option<u64> {
        self.unserved += 1;
        self.recorded_events += events as u64;
        (self.unserved >= BACKOFF_AFTER).then(|| self.back_off())
    }

    /// A recording given up at its limit: back off now, and let the next go twice as far.
    pub fn gave_up(&mut self, events: usize) -> u64 {
        self.recorded_events += events as u64;
        self.record_limit = (2 * self.record_limit).min(MAX_RECORD_LIMIT);
        self.back_off()
    }

    fn back_off(&mut self) -> u64 {
        let cost = IDLE_PER_EVENT * self.recorded_events + IDLE_PER_PLANNED_EVENT * self.planned_events;
        let wait = cost.max(IDLE_MIN) << self.level;
        self.level = (self.level + 1).min(MAX_LEVEL);
        (self.unserved, self.recorded_events, self.planned_events) = (0, 0, 0);
        wait
    }
}

/// The most plans of one key skipped in a row: 2^8 - 1.
const MAX_SKIP_LEVEL: u32 = 8;

/// Keys whose schedules keep diverging before they serve a whole iteration, and how many of their
/// recordings to leave unplanned. Design: planning costs far more per event than recording (the
/// quick plan and the search: microseconds a buffer), and the backoff above counts iterations, not
/// plans; two threads on one stream interleave their steps, so each iteration under the shared key
/// differs from the last, and planning each one took 58% of the time (c_abi_bench, `step, 2
/// threads`). After the n-th wasted plan in a row, the key's next 2^(n-1) - 1 recordings stay
/// unplanned (their iterations run on the pool, recorded); a schedule that serves a whole iteration
/// halves the count.
#[derive(Debug, Default)]
pub(crate) struct WastedPlans {
    /// Per key: (wasted plans in a row, recordings still to leave unplanned).
    keys: HashMap<u64, (u32, u64), FixedState>,
}

impl WastedPlans {
    /// A schedule of `key` left midway before serving a whole iteration.
    pub fn wasted(&mut self, key: u64) {
        let (plans, skip) = self.keys.entry(key).or_default();
        *plans += 1;
        *skip = (1 << (*plans - 1).min(MAX_SKIP_LEVEL)) - 1;
    }

    /// A schedule of `key` served a whole iteration: its next recording is planned, and the count
    /// of wasted plans halves (a program that alternates between serving and interleaving keeps
    /// most of its backoff).
    pub fn served(&mut self, key: u64) {
        if let Some((plans, skip)) = self.keys.get_mut(&key) {
            (*plans, *skip) = (*plans / 2, 0);
            if *plans == 0 {
                self.keys.remove(&key);
            }
        }
    }

    /// Whether to leave `key`'s recording unplanned this time (counted).
    pub fn skip(&mut self, key: u64) -> bool {
        match self.keys.get_mut(&key) {
            Some((_, skip)) if *skip > 0 => {
                *skip -= 1;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_whose_plans_keep_diverging_is_planned_ever_more_rarely_until_one_serves() {
        let mut w = WastedPlans::default();
        assert!(!w.skip(7), "a key planned for the first time");
        let planned_of = |w: &mut WastedPlans, tries: u32| (0..tries).filter(|_| !w.skip(7)).count();
        w.wasted(7);
        assert_eq!(planned_of(&mut w, 1), 1, "after one wasted plan the next recording is planned");
        w.wasted(7);
        assert_eq!(planned_of(&mut w, 2), 1, "after two, one in two");
        w.wasted(7);
        assert_eq!(planned_of(&mut w, 4), 1);
        (0..20).for_each(|_| w.wasted(7));
        assert_eq!(planned_of(&mut w, 1 << MAX_SKIP_LEVEL), 1, "at most 2^8 - 1 skipped");
        assert!(!w.skip(8), "other keys are not held back");
        w.served(7);
        assert!(!w.skip(7), "a schedule that served has the next recording planned");
        w.wasted(7);
        assert_eq!(planned_of(&mut w, 1 << MAX_SKIP_LEVEL), 1, "and halves the count: 23 wasted, then 11 + 1");
        (0..5).for_each(|_| w.served(7));
        w.wasted(7);
        assert!(!w.skip(7), "served often enough, the key starts over");
    }

    #[test]
    fn the_wait_grows_with_what_recording_cost_and_doubles_until_served() {
        let mut b = Backoff::default();
        for _ in 1..BACKOFF_AFTER {
            assert_eq!(b.unserved(2), None);
        }
        assert_eq!(b.unserved(2), Some(IDLE_MIN), "16 short iterations cost less than the shortest wait");
        (1..BACKOFF_AFTER).for_each(|_| assert!(b.unserved(2).is_none()));
        assert_eq!(b.unserved(2), Some(2 * IDLE_MIN));
        assert_eq!(b.gave_up(FIRST_RECORD_LIMIT), (IDLE_PER_EVENT * FIRST_RECORD_LIMIT as u64) << 2);
        assert_eq!(b.record_limit, 2 * FIRST_RECORD_LIMIT);
        b.served();
        (1..BACKOFF_AFTER).for_each(|_| assert!(b.unserved(2).is_none()));
        assert_eq!(b.unserved(2), Some(IDLE_MIN), "served, the wait starts over");
        b.planned(100);
        (1..BACKOFF_AFTER).for_each(|_| assert!(b.unserved(2).is_none()));
        let recorded = IDLE_PER_EVENT * 2 * u64::from(BACKOFF_AFTER);
        assert_eq!(b.unserved(2), Some((recorded + IDLE_PER_PLANNED_EVENT * 100) << 1), "plans made meanwhile lengthen it");
    }

    #[test]
    fn the_count_is_exact_and_says_when_the_wait_is_over() {
        let idle = IdleCount::default();
        idle.wait(1000);
        let over: Vec<u64> = (1..=2048).filter(|_| idle.count()).map(|_| idle.total()).collect();
        assert_eq!(over[0], 1024, "checked every 256 allocations of a thread");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    (0..1000).for_each(|_| {
                        idle.count();
                    })
                });
            }
        });
        assert_eq!(idle.total(), 6048);
    }
}
