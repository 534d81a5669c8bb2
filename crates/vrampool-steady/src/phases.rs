//! The phases: serving a schedule, leaving it, recording, ending an iteration, backing off, and
//! the mode and the arena's memory.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

use vrampool_core::{MemoryResource, PoolError, StreamId};

use crate::idle::{Probes, WastedPlans, PROBE_EVENTS, PROBE_EVERY};
use crate::pool::{next_uid, signature, PlannedPool, AUTO_KEY, AUTO_PLAN_ALLOCATIONS, MAX_PLANS};
use crate::record::Recorder;
use crate::schedule::{plan_schedule, Schedule};
use crate::serving::{Phase, Serving, Word, EPOCH_MASK};
use crate::state::{Cold, Loose};

/// A plan more than a `POOR_PLAN_DIVISOR`th above its iteration's live bound may cost more than the
/// pool (see `costs_more_than_the_pool`); the planner's plans of training steps are within a few
/// hundredths.
const POOR_PLAN_DIVISOR: u64 = 8;

impl<B: MemoryResource> PlannedPool<B> {
    // ---- phases ----

    /// Leaves the schedule served at `word` for the cold path: the arena buffers live there become
    /// loose, and the recording goes on from there. An iteration that `diverged` from its schedule
    /// midway (or at once, under a named key) is a fallback. Does nothing when the word moved
    /// meanwhile: the caller looks again.
    pub(crate) fn leave_serving(&self, cold: &mut Cold, word: u64, diverged: bool) {
        if self.word.compare_exchange(word, Word::COLD, Release, Relaxed).is_err() {
            return;
        }
        let serving = cold.serving.take().expect("serving has its state");
        let early = std::mem::take(&mut cold.early);
        let schedule = &serving.schedule;
        let position = Word::position(word).min(schedule.steps.len());
        let wraps = self.wraps.load(Relaxed) - cold.wraps_at_epoch;
        self.disarm_peak(cold, wraps, position);
        cold.figures.add_served(schedule, wraps, position);
        let limit = cold.backoff.record_limit;
        if wraps > 0 || position == schedule.steps.len() {
            cold.backoff.served();
            cold.wasted.served(cold.key);
        } else if diverged {
            cold.wasted.wasted(cold.key);
        }
        if position == schedule.steps.len() || (position == 0 && !(diverged && cold.named)) {
            cold.recorder = Recorder::new(limit);
            if self.auto_steps || !cold.named {
                cold.key = AUTO_KEY;
            }
            return;
        }
        cold.figures.fallbacks += 1;
        // The iteration's live buffers: the arena's become loose; the recording goes on knowing them all
        // (a pool buffer whose address is not noted yet, being handed out by another thread now, is
        // taken for an older one).
        let mut born = Vec::new();
        for p in schedule.live_after(position, &early) {
            let stream = schedule.streams[p.stream];
            let addr = match p.offset {
                Some(offset) => {
                    let addr = serving.bases[p.stream] + offset;
                    cold.loose.insert(addr, Loose { size: p.size, stream, used_elsewhere: false });
                    addr
                }
                None => serving.pool_addrs[p.index as usize].load(Relaxed),
            };
            if addr != 0 {
                born.push((addr, (p.index, stream)));
            }
        }
        cold.recorder = Recorder::continuing(schedule.recorded_prefix(position, &early), born, limit);
    }

    /// Leaves the schedule wherever it is now (after an error the pool returned to a step, or the
    /// mode going off: not `diverged`).
    pub(crate) fn leave_now(&self, cold: &mut Cold, diverged: bool) {
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                return;
            }
            self.leave_serving(cold, word, diverged);
        }
    }

    #[cold]
    pub(crate) fn leave_after_error(&self) {
        if let Ok(mut cold) = self.lock() {
            self.leave_now(&mut cold, true);
        }
    }

    /// At an iteration's first allocation: serves the schedule of its key (for `AUTO_KEY`, of this
    /// allocation's signature) if there is one and the iteration's frees so far are its first steps.
    /// Without one, the iteration runs on the pool, and the idle arena goes back to it.
    pub(crate) fn start_by_key(&self, cold: &mut Cold, size: u64, stream: StreamId) -> bool {
        let key = if cold.key == AUTO_KEY { signature(size, stream) } else { cold.key };
        let lead = cold.recorder.len();
        let schedule = self.schedule_of(cold, key);
        let fresh = !cold.recorder.overflowed && !cold.recorder.diverged;
        if let Some(schedule) = schedule {
            if fresh && schedule.starts_with(lead, size, stream) && self.serve(cold, schedule, lead) {
                cold.key = key;
                return true;
            }
            // Planned for nothing: the iteration already left it.
            cold.wasted.wasted(key);
        }
        if cold.key == AUTO_KEY {
            cold.key = key;
        }
        if !cold.plans.contains_key(&key) {
            self.release_idle_regions(cold);
        }
        false
    }

    /// Serves `schedule` from its step `position` on: regions for its streams (kept, or taken from
    /// the pool), then a new epoch. False when arena buffers of an earlier iteration are still live,
    /// or the pool has no memory for a region.
    pub(crate) fn serve(&self, cold: &mut Cold, schedule: Arc<Schedule>, position: usize) -> bool {
        if !cold.loose.is_empty() {
            return false;
        }
        let mut bases = Vec::with_capacity(schedule.streams.len());
        let mut trimmed = false;
        for (i, &stream) in schedule.streams.iter().enumerate() {
            let needed = schedule.region_bytes[i];
            if needed == 0 {
                bases.push(0);
                continue;
            }
            // Sized for every schedule's use of the stream, so that schedules taking turns keep one region.
            let wanted = cold.plans.values().filter_map(|p| Some(p.region_bytes[p.stream_index(stream)?])).max().unwrap_or(0);
            let fits =
                cold.regions.of_stream(stream).is_some_and(|at| cold.regions.list[at].bytes >= needed && !cold.regions.list[at].retired);
            if !fits && !self.auto_steps && !trimmed {
                // The caller names the boundaries: what the recorded iterations left cached in the pool goes back
                // first, so the pool does not hold both. With automatic ones the pool's own growth gives back
                // what the region needs and no more (`PoolConfig::reclaim`).
                let _ = self.backing.trim();
                trimmed = true;
            }
            match cold.regions.ensure(&self.backing, stream, needed, wanted) {
                Ok(at) => bases.push(cold.regions.list[at].base),
                Err(_) => {
                    self.publish_bounds(cold);
                    return false;
                }
            }
        }
        self.publish_bounds(cold);
        cold.epoch = (cold.epoch + 1) & EPOCH_MASK;
        if cold.epoch == 0 {
            // Epochs wrapped: threads may keep a state of this number from long ago.
            self.uid.store(next_uid(), Relaxed);
            cold.epoch = 1;
        }
        cold.wraps_at_epoch = self.wraps.load(Relaxed);
        cold.probes.left = None;
        self.arm_peak(cold, &schedule, position);
        let epoch = cold.epoch;
        let pool_addrs = (0..schedule.allocations).map(|_| AtomicU64::new(0)).collect();
        cold.serving = Some(Arc::new(Serving { epoch, schedule, bases: bases.into(), regions: cold.regions.ranges(), pool_addrs }));
        self.word.store(Word::serving(epoch, position as u32), Release);
        true
    }

    pub(crate) fn publish_bounds(&self, cold: &Cold) {
        let (lo, hi) = cold.regions.bounds();
        self.bounds[0].store(lo, Relaxed);
        self.bounds[1].store(hi, Relaxed);
    }

    /// Gives the regions back if no arena buffer is live (to the pool; with named boundaries the
    /// pool's free memory then goes back to the device too).
    pub(crate) fn release_idle_regions(&self, cold: &mut Cold) {
        if !cold.loose.is_empty() || cold.serving.is_some() || cold.ahead.is_some() || cold.regions.list.is_empty() {
            return;
        }
        let released = cold.regions.release_all(&self.backing);
        self.publish_bounds(cold);
        if released.is_ok_and(|bytes| bytes > 0) && !self.auto_steps {
            let _ = self.backing.trim();
        }
    }

    /// A recording past its limit: given up, and the pool goes idle.
    pub(crate) fn give_up(&self, cold: &mut Cold) {
        if self.split_threads(cold, cold.recorder.interleaved()) {
            cold.recorder = Recorder::new(cold.backoff.record_limit);
            return;
        }
        if cold.probes.left.is_some() {
            return self.wait_on(cold);
        }
        let wait = cold.backoff.gave_up(cold.recorder.len());
        self.go_idle(cold, wait);
    }

    /// Where a recording shows threads taking turns call by call, the first time: the threads get
    /// lanes (`thread_lanes.rs`), and what their interleaving cost (backoff, a wait a probe
    /// interrupted, wasted plans) is forgotten, since this pool now sees one thread's calls. True
    /// where the recording is dropped.
    fn split_threads(&self, cold: &mut Cold, interleaved: bool) -> bool {
        if !self.auto_steps || !interleaved || self.threads_interleave.0.swap(true, Relaxed) {
            return false;
        }
        cold.backoff.served();
        cold.probes = Probes::default();
        cold.wasted = WastedPlans::default();
        true
    }

    /// Calls go to the pool for `wait` allocations, with a probe every `PROBE_EVERY` of them.
    pub(crate) fn go_idle(&self, cold: &mut Cold, wait: u64) {
        cold.probes = Probes { wait_until: self.idle.total().saturating_add(wait), left: None };
        self.idle.wait(wait.min(PROBE_EVERY));
        self.word.store(Word::IDLE, Release);
        cold.recorder = Recorder::new(cold.backoff.record_limit);
        self.release_idle_regions(cold);
    }

    /// A probe that found nothing to serve: the wait it interrupted goes on, as long as it was.
    fn wait_on(&self, cold: &mut Cold) {
        let rest = cold.probes.wait_until.saturating_sub(self.idle.total());
        self.go_idle(cold, rest);
    }

    /// The wait is over, or a probe is due: record again, from the next allocation on.
    #[cold]
    pub(crate) fn wake(&self) {
        let Ok(mut cold) = self.lock() else { return };
        if Word::phase(self.word.load(Relaxed)) == Phase::Idle {
            self.record_again(&mut cold);
            cold.key = AUTO_KEY;
        }
    }

    /// Records from the next call on: a probe while the wait is not over.
    fn record_again(&self, cold: &mut Cold) {
        let probe = self.idle.total() < cold.probes.wait_until;
        cold.probes.left = probe.then_some(PROBE_EVENTS);
        cold.recorder = Recorder::new(if probe { PROBE_EVENTS } else { cold.backoff.record_limit });
        self.word.store(Word::COLD, Release);
    }

    /// Ends the iteration and starts the next, whose signature is `key`. The iteration that ends is
    /// planned and its schedule stored under its key when it had none or left it; an iteration
    /// without allocations or frees leaves the schedules as they are.
    pub fn step(&self, key: u64) -> Result<(), PoolError> {
        let mut cold = self.lock()?;
        if cold.ahead.is_some() {
            self.end_ahead_step(&mut cold);
            return Ok(());
        }
        self.end_iteration(&mut cold, key);
        Ok(())
    }

    pub(crate) fn end_iteration(&self, cold: &mut Cold, key: u64) {
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let serving = cold.serving.clone().expect("serving has its state");
            let (position, len) = (Word::position(word), serving.schedule.steps.len());
            let same = key == AUTO_KEY || key == cold.key;
            if position >= len && same {
                // Done, and the next iteration follows the same schedule: from its start.
                if self.word.compare_exchange(word, Word::serving(serving.epoch, 0), Release, Relaxed).is_ok() {
                    self.wraps.fetch_add(1, Relaxed);
                    cold.named = key != AUTO_KEY;
                    return;
                }
            } else if position == 0 && same {
                cold.named = key != AUTO_KEY;
                return;
            } else {
                self.leave_serving(cold, word, true);
            }
        }
        if Word::phase(self.word.load(Relaxed)) == Phase::Cold {
            self.plan_recording(cold);
        }
        (cold.key, cold.named) = (key, key != AUTO_KEY);
        match Word::phase(self.word.load(Relaxed)) {
            Phase::Off => {}
            Phase::Idle => {
                // A known schedule is served at once (serving costs nothing); a new one is recorded once the wait
                // is over.
                let known = cold.plans.contains_key(&key) || cold.pending.contains_key(&key);
                if (key != AUTO_KEY && known) || self.idle.total() >= self.idle.until() {
                    self.record_again(cold);
                    self.begin(cold, key);
                }
            }
            _ => self.begin(cold, key),
        }
    }

    /// A new iteration under `key`: its schedule served from the start if there is one; without one
    /// (a named key), it runs on the pool, and the idle arena goes back to it. `AUTO_KEY` waits for
    /// the first allocation.
    pub(crate) fn begin(&self, cold: &mut Cold, key: u64) {
        if key == AUTO_KEY {
            return;
        }
        if let Some(schedule) = self.schedule_of(cold, key) {
            if self.serve(cold, schedule, 0) {
                return;
            }
        }
        self.release_idle_regions(cold);
    }

    /// Keeps the recording that ends under its key, to be planned when the key comes again
    /// (`schedule_of`), and backs off when iterations keep going unserved.
    pub(crate) fn plan_recording(&self, cold: &mut Cold) {
        let recorder = std::mem::replace(&mut cold.recorder, Recorder::new(cold.backoff.record_limit));
        if recorder.events.is_empty() || self.split_threads(cold, recorder.interleaved()) {
            return;
        }
        let too_few = self.auto_steps && (recorder.allocations as usize) < AUTO_PLAN_ALLOCATIONS;
        let recorded = recorder.events.len();
        let key = match cold.key {
            AUTO_KEY => recorder.first.map(|(size, stream)| signature(size, stream)),
            key => Some(key),
        };
        if let Some(key) = key.filter(|_| !recorder.overflowed && !too_few) {
            if !recorder.diverged {
                cold.figures.recorded_iterations += 1;
            }
            cold.plans.remove(&key);
            if cold.pending.len() >= MAX_PLANS && !cold.pending.contains_key(&key) {
                let old = cold.pending.keys().next().copied();
                old.map(|k| cold.pending.remove(&k));
            }
            cold.pending.insert(key, recorder.events);
        }
        if let Some(left) = cold.probes.left {
            // A probe's iterations do not count towards the backoff: it ends where its events do.
            match left.saturating_sub(recorded) {
                0 => self.wait_on(cold),
                left => {
                    cold.probes.left = Some(left);
                    cold.recorder = Recorder::new(left);
                }
            }
        } else if let Some(wait) = cold.backoff.unserved(recorded) {
            self.go_idle(cold, wait);
        }
    }

    /// `key`'s schedule: the one planned, else its recording planned now (and kept). Planning waits
    /// for the key's second iteration: an iteration that never comes again is never planned.
    pub(crate) fn schedule_of(&self, cold: &mut Cold, key: u64) -> Option<Arc<Schedule>> {
        if let Some(schedule) = cold.plans.get(&key) {
            return Some(Arc::clone(schedule));
        }
        if !cold.pending.contains_key(&key) || cold.wasted.skip(key) {
            return None;
        }
        let events = cold.pending.remove(&key)?;
        cold.backoff.planned(events.len());
        let schedule = plan_schedule(&events, self.planning)?;
        if self.costs_more_than_the_pool(&schedule) {
            cold.wasted.wasted(key);
            return None;
        }
        let schedule = Arc::new(schedule);
        if cold.plans.len() >= MAX_PLANS {
            let old = cold.plans.keys().next().copied();
            old.map(|k| cold.plans.remove(&k));
        }
        cold.plans.insert(key, Arc::clone(&schedule));
        Some(schedule)
    }

    /// Whether serving `schedule` would reserve more than the pool alone: its arena is well above
    /// the iteration's live bound and larger than the most the pool has reserved. Design: the pool
    /// places each buffer when it comes and may give segments back midway, so where the planner's
    /// plan is poor the pool can reserve less (a KV cache grown by copy, coloured largest first at
    /// 1.74x its bound, where the pool reserved 1.30x: served, the steady state would have held 30
    /// MiB where the first pass held 22). Such an iteration stays on the pool.
    fn costs_more_than_the_pool(&self, schedule: &Schedule) -> bool {
        let arena: u64 = schedule.region_bytes.iter().sum();
        let bound = schedule.lower_bound_bytes;
        arena > bound + bound / POOR_PLAN_DIVISOR && arena > self.backing.stats().reserved_bytes.peak
    }

    // ---- the mode, the arena's memory, figures ----

    /// Turns the pool on (iterations recorded and served) or off (every call to the pool; arena
    /// buffers live now are still freed here).
    pub fn set_on(&self, on: bool) {
        let Ok(mut guard) = self.lock() else { return };
        let cold = &mut *guard;
        let phase = Word::phase(self.word.load(Acquire));
        if on && phase == Phase::Off && cold.ahead.is_some() {
            self.word.store(Word::AHEAD, Release);
        } else if on && phase == Phase::Off {
            cold.recorder = Recorder::new(cold.backoff.record_limit);
            self.word.store(Word::COLD, Release);
            let key = cold.key;
            self.end_iteration(cold, key);
        } else if !on && phase != Phase::Off {
            self.leave_now(cold, false);
            self.word.store(Word::OFF, Release);
            cold.recorder = Recorder::new(cold.backoff.record_limit);
            self.release_idle_regions(cold);
        }
    }

    /// Stops serving for good (the pool below is closing): later calls go to the pool, which refuses
    /// them; arena buffers still live can be freed.
    pub fn close(&self) {
        self.set_on(false);
    }

    /// Gives the arena back to the pool if no arena buffer is live; the bytes given back. The next
    /// served iteration takes new regions.
    pub fn release_idle_arena(&self) -> Result<u64, PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let serving = cold.serving.as_ref().expect("serving has its state");
            let len = serving.schedule.steps.len();
            // Mid-iteration with no arena buffer live (its first steps may free the last one's
            // buffers): the rest of it goes to the pool, and the arena goes back.
            if (1..len).contains(&Word::position(word)) && !self.live_in_epoch(serving, word, &cold.early).is_empty() {
                return Ok(0);
            }
            self.leave_serving(cold, word, false);
        }
        // A plan made ahead keeps its arena: it was taken once, for every step.
        if !cold.loose.is_empty() || cold.ahead.is_some() {
            return Ok(0);
        }
        let bytes = cold.regions.release_all(&self.backing);
        self.publish_bounds(cold);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vrampool_core::{Device, Pool, PoolConfig, SimDevice, SimMode};

    use super::*;
    use crate::schedule::{Planning, Recorded};

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_plan_well_above_its_bound_and_above_what_the_pool_reserved_costs_more_than_the_pool() {
        let device: Arc<dyn Device> = Arc::new(SimDevice::new(1 << 32, SimMode::AddressOnly));
        let planned = PlannedPool::new(Pool::new(device, PoolConfig::default()).unwrap());
        // Two 4 MiB buffers live at once, then one more after them: planned at its 8 MiB bound.
        let s0 = StreamId(0);
        let alloc = Recorded::Alloc { size: 4 * MIB, stream: s0 };
        let free = |index| Recorded::Free { index, on: s0 };
        let events = [alloc, alloc, free(0), free(1), alloc, free(2)];
        let mut schedule = plan_schedule(&events, Planning { budget: Duration::ZERO, alignment: 512 }).unwrap();
        assert_eq!((schedule.region_bytes.iter().sum::<u64>(), schedule.lower_bound_bytes), (8 * MIB, 8 * MIB));
        assert!(!planned.costs_more_than_the_pool(&schedule), "a plan at its bound");
        // The same bound with an arena of 12 MiB, half again: more than the pool has ever reserved.
        schedule.region_bytes = Box::new([12 * MIB]);
        assert!(planned.costs_more_than_the_pool(&schedule));
        // Once the pool has reserved more than that, serving it costs nothing more.
        let big = planned.backing().allocate(16 * MIB, s0).unwrap();
        planned.backing().free(big, None, None).unwrap();
        assert!(!planned.costs_more_than_the_pool(&schedule));
        // An eighth above the bound is within what the planner's plans of steps reach.
        schedule.region_bytes = Box::new([9 * MIB]);
        let fresh = PlannedPool::new(Pool::new(Arc::new(SimDevice::new(1 << 32, SimMode::AddressOnly)), PoolConfig::default()).unwrap());
        assert!(!fresh.costs_more_than_the_pool(&schedule));
    }
}
