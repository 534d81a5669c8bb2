//! The cold path: every call that is not the schedule's next step, under the one lock (its state:
//! `state.rs`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use vrampool_core::{MemoryResource, PieceEvent, PoolError, StreamId};

use crate::figures::ArenaBuffer;
use crate::pool::{PlannedPool, AUTO_KEY};
use crate::serving::{Phase, Serving, Take, Word};
use crate::state::{not_allocated, wrong_size, Cold, Loose};

impl<B: MemoryResource> PlannedPool<B> {
    #[cold]
    #[inline(never)]
    pub(crate) fn allocate_cold(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        // Refused before it could leave a schedule: bad input costs the iteration nothing.
        if let Some(invalid) = PoolError::for_request(size) {
            return Err(invalid);
        }
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        loop {
            let word = self.word.load(Acquire);
            if word == Word::AHEAD {
                return self.allocate_ahead(cold, size, stream);
            }
            match Word::phase(word) {
                Phase::Off | Phase::Idle => {
                    if Word::phase(word) == Phase::Idle {
                        self.idle.count();
                    }
                    drop(guard);
                    return self.backing.allocate(size, stream);
                }
                Phase::Serving => {
                    let Some(word) = self.catch_up(cold, word) else { continue };
                    let serving = cold.serving.clone().expect("serving has its state");
                    let Some((take, next, wraps)) = serving.allocation(word, size, stream).filter(|_| cold.early.is_empty()) else {
                        self.leave_serving(cold, word, true);
                        continue;
                    };
                    if !self.take_step_cold(word, next, wraps) {
                        continue;
                    }
                    return match take {
                        Take::Arena(addr) => self.arena_buffer_out(cold, addr, size, stream),
                        Take::Pool { index } => match self.backing.allocate(size, stream) {
                            Ok(addr) => {
                                serving.note_pool_buffer(index, Some(addr));
                                Ok(addr)
                            }
                            Err(e) => {
                                self.leave_now(cold, true);
                                Err(e)
                            }
                        },
                        _ => unreachable!("an allocation's step"),
                    };
                }
                Phase::Cold => {
                    if cold.recorder.allocations == 0 && self.start_by_key(cold, size, stream) {
                        continue;
                    }
                    let addr = self.backing.allocate(size, stream)?;
                    cold.figures.dynamic_allocations += 1;
                    cold.recorder.allocated(addr, size, stream);
                    if cold.recorder.overflowed {
                        self.give_up(cold);
                    }
                    return Ok(addr);
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn free_cold(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        if cold.ahead.is_some() {
            return self.free_ahead(cold, addr, size, stream);
        }
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let Some(word) = self.catch_up(cold, word) else { continue };
            match self.serve_free_cold(cold, word, addr, size, stream) {
                ColdFree::Done(result) => return result,
                ColdFree::Again => continue,
                ColdFree::Leave { freed_by_pool } => {
                    self.leave_now(cold, true);
                    if freed_by_pool {
                        cold.recorder.freed(addr, stream, size);
                        self.after_free(cold);
                        return Ok(());
                    }
                    break;
                }
            }
        }
        if let Some(&loose) = cold.loose.get(&addr) {
            self.free_loose(cold, addr, loose, size, stream)?;
        } else if cold.regions.find(addr).is_some() {
            return Err(not_allocated(addr));
        } else {
            self.backing.free(addr, size, stream)?;
            if Word::phase(self.word.load(Relaxed)) == Phase::Cold {
                cold.recorder.freed(addr, stream, size);
            }
        }
        self.after_free(cold);
        Ok(())
    }

    /// Ends a recorded iteration once everything it allocated is freed (automatic boundaries).
    fn after_free(&self, cold: &mut Cold) {
        if self.auto_steps && Word::phase(self.word.load(Relaxed)) == Phase::Cold && cold.recorder.all_freed() {
            self.end_iteration(cold, AUTO_KEY);
        }
    }

    /// A free while serving, at `word` (caught up): the next step, or a free of the same group taken
    /// ahead of its step, or a bad free (an error, nothing changed), or a free that leaves the
    /// schedule.
    fn serve_free_cold(&self, cold: &mut Cold, word: u64, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> ColdFree {
        let serving = cold.serving.clone().expect("serving has its state");
        if cold.early.is_empty() {
            if let Some((take, next, wraps)) = serving.free(word, addr, size, stream) {
                if !self.take_step_cold(word, next, wraps) {
                    return ColdFree::Again;
                }
                return ColdFree::Done(match take {
                    Take::ArenaFreed { size, stream } => {
                        self.arena_buffer_in(cold, addr, size, stream, PieceEvent::Freed);
                        Ok(())
                    }
                    Take::PoolFree { index } => {
                        if let Some(index) = index {
                            serving.note_pool_buffer(index, None);
                        }
                        self.backing.free(addr, size, stream).inspect_err(|_| self.leave_now(cold, true))
                    }
                    _ => unreachable!("a free's step"),
                });
            }
        }
        let schedule = &serving.schedule;
        let position = Word::position(word).min(schedule.steps.len());
        let group = position..schedule.group_end(position);
        if let Some((stream_index, offset)) = serving.locate(addr) {
            // An arena address: one of the iteration's live buffers, or a bad free.
            let Some(at) = schedule.arena_buffer_at(stream_index, offset, position).filter(|at| !cold.early.contains(at)) else {
                return ColdFree::Done(Err(not_allocated(addr)));
            };
            let step = schedule.steps[at];
            if let Some(given) = size.filter(|&s| s != step.size()) {
                return ColdFree::Done(Err(wrong_size(addr, step.size(), given)));
            }
            if !group.contains(&at) || stream.is_some_and(|s| s != schedule.streams[stream_index]) {
                return ColdFree::Leave { freed_by_pool: false };
            }
            let Some(held) = self.hold(word) else { return ColdFree::Again };
            self.take_early(cold, held, at);
            self.arena_buffer_in(cold, addr, step.size(), schedule.streams[stream_index], PieceEvent::Freed);
            return ColdFree::Done(Ok(()));
        }
        if serving.in_regions(addr) {
            return ColdFree::Done(Err(not_allocated(addr)));
        }
        // A pool buffer: its own step in the group if the schedule knows it, else one of the group's frees
        // of older buffers; the pool refuses what is not its own.
        let known = group.clone().find(|&at| {
            !cold.early.contains(&at) && schedule.steps[at].frees_index().is_some_and(|i| serving.pool_addrs[i].load(Relaxed) == addr)
        });
        let older = || group.clone().find(|&at| !cold.early.contains(&at) && schedule.steps[at].is_older_free());
        let Some(at) = known.or_else(older) else {
            return match self.backing.free(addr, size, stream) {
                Ok(()) => ColdFree::Leave { freed_by_pool: true },
                Err(e) => ColdFree::Done(Err(e)),
            };
        };
        let Some(held) = self.hold(word) else { return ColdFree::Again };
        if let Err(e) = self.backing.free(addr, size, stream) {
            self.catch_up(cold, held);
            return ColdFree::Done(Err(e));
        }
        if let Some(index) = schedule.steps[at].frees_index() {
            serving.note_pool_buffer(index, None);
        }
        self.take_early(cold, held, at);
        ColdFree::Done(Ok(()))
    }

    /// Holds the word at `word` (from now on only the cold path moves it); None when another call
    /// moved it first.
    fn hold(&self, word: u64) -> Option<u64> {
        let held = Word::held(word, true);
        (word == held || self.word.compare_exchange(word, held, Release, Relaxed).is_ok()).then_some(held)
    }

    /// Takes step `at` of the group at the `held` word ahead of its turn, and catches up.
    fn take_early(&self, cold: &mut Cold, held: u64, at: usize) {
        cold.early.insert(at);
        self.catch_up(cold, held);
    }

    /// Moves a held word past the steps already taken ahead of their turn, and lets it go once none is
    /// left; the word after, or None when another call moved it first (the caller looks again).
    pub(crate) fn catch_up(&self, cold: &mut Cold, word: u64) -> Option<u64> {
        if !Word::is_held(word) {
            return Some(word);
        }
        let (epoch, mut position) = (Word::epoch(word), Word::position(word));
        while cold.early.first() == Some(&position) {
            cold.early.pop_first();
            position += 1;
        }
        let next = Word::held(Word::serving(epoch, position as u32), !cold.early.is_empty());
        self.word.compare_exchange(word, next, Release, Relaxed).ok().map(|_| next)
    }

    /// Takes the next step from the cold path (the word may be moved by the serving path meanwhile).
    fn take_step_cold(&self, word: u64, next: u64, wraps: bool) -> bool {
        if self.word.compare_exchange(word, next, Release, Relaxed).is_err() {
            return false;
        }
        if wraps {
            self.wraps.fetch_add(1, Relaxed);
        }
        true
    }

    #[cold]
    pub(crate) fn record_stream_cold(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        let mut guard = self.lock()?;
        let cold = &mut *guard;
        if cold.ahead.is_some() {
            return self.record_stream_ahead(cold, addr, stream);
        }
        loop {
            let word = self.word.load(Acquire);
            if Word::phase(word) != Phase::Serving {
                break;
            }
            let serving = cold.serving.clone().expect("serving has its state");
            let Some((stream_index, offset)) = serving.locate(addr) else {
                if serving.in_regions(addr) {
                    return Err(not_allocated(addr));
                }
                return self.backing.record_stream(addr, stream);
            };
            let position = Word::position(word).min(serving.schedule.steps.len());
            match serving.schedule.arena_buffer_at(stream_index, offset, position).filter(|at| !cold.early.contains(at)) {
                None => return Err(not_allocated(addr)),
                Some(_) if serving.schedule.streams[stream_index] == stream => return Ok(()),
                // Its bytes may be in use there after its free: nothing more from this region.
                Some(_) => self.leave_serving(cold, word, true),
            }
        }
        self.record_stream_loose_or_pool(cold, addr, stream)
    }

    /// `record_stream` of a loose arena buffer, or of a pool buffer (an address in the arena that is
    /// neither is no live buffer).
    pub(crate) fn record_stream_loose_or_pool(&self, cold: &mut Cold, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        if let Some(loose) = cold.loose.get_mut(&addr) {
            if stream != loose.stream {
                loose.used_elsewhere = true;
                if let Some(at) = cold.regions.find(addr) {
                    cold.regions.list[at].used_on(stream);
                }
                cold.recorder.used_on(addr, stream);
            }
            return Ok(());
        }
        if cold.regions.find(addr).is_some() {
            return Err(not_allocated(addr));
        }
        self.backing.record_stream(addr, stream)?;
        cold.recorder.used_on(addr, stream);
        Ok(())
    }

    /// The arena buffers live at `word` of the epoch `serving` serves.
    pub(crate) fn live_in_epoch(&self, serving: &Serving, word: u64, early: &BTreeSet<usize>) -> Vec<ArenaBuffer> {
        let schedule = &serving.schedule;
        schedule
            .live_after(Word::position(word).min(schedule.steps.len()), early)
            .into_iter()
            .filter_map(|p| {
                let addr = serving.bases[p.stream] + p.offset?;
                Some(ArenaBuffer { addr, size: p.size, stream: schedule.streams[p.stream], age_ns: None })
            })
            .collect()
    }

    /// An arena buffer handed out: where the pool watches its blocks, scrubbed, logged and dated as
    /// one of them. A buffer the pool could not scrub is not handed out (its iteration leaves the
    /// schedule, and the buffer is dropped).
    fn arena_buffer_out(&self, cold: &mut Cold, addr: u64, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        if !self.watched {
            return Ok(addr);
        }
        if let Err(e) = self.backing.piece(addr, size, stream, PieceEvent::Allocated) {
            self.leave_now(cold, true);
            cold.loose.remove(&addr);
            cold.recorder.freed(addr, None, Some(size));
            return Err(e);
        }
        cold.births.insert(addr, self.now_ns());
        Ok(addr)
    }

    /// An arena buffer freed: where the pool watches its blocks, scrubbed (unless other streams may
    /// still use it: its region is scrubbed when it goes back, after them) and logged; one the pool
    /// could not scrub retires its region, whose bytes then never go out again.
    fn arena_buffer_in(&self, cold: &mut Cold, addr: u64, size: u64, stream: StreamId, event: PieceEvent) {
        if !self.watched {
            return;
        }
        cold.births.remove(&addr);
        if self.backing.piece(addr, size, stream, event).is_err() {
            if let Some(at) = cold.regions.find(addr) {
                cold.regions.list[at].retired = true;
            }
            self.leave_now(cold, true);
        }
    }

    pub(crate) fn free_loose(
        &self,
        cold: &mut Cold,
        addr: u64,
        loose: Loose,
        size: Option<u64>,
        on: Option<StreamId>,
    ) -> Result<(), PoolError> {
        if let Some(given) = size.filter(|&s| s != loose.size) {
            return Err(wrong_size(addr, loose.size, given));
        }
        cold.loose.remove(&addr);
        let elsewhere = on.filter(|&s| s != loose.stream);
        if let (Some(on), Some(at)) = (elsewhere, cold.regions.find(addr)) {
            cold.regions.list[at].used_on(on);
        }
        // Only its own use decides: a sibling used on another stream retires the region, but this
        // buffer's bytes were used on its own stream alone, where the scrub is ordered after them.
        let in_use = loose.used_elsewhere || elsewhere.is_some();
        self.arena_buffer_in(cold, addr, loose.size, loose.stream, if in_use { PieceEvent::FreedInUse } else { PieceEvent::Freed });
        if Word::phase(self.word.load(Relaxed)) == Phase::Cold {
            cold.recorder.freed(addr, on, Some(loose.size));
        }
        Ok(())
    }

    pub(crate) fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What the cold path did with a free while serving.
enum ColdFree {
    Done(Result<(), PoolError>),
    /// The word moved meanwhile: look again.
    Again,
    /// The free leaves the schedule (the pool has already freed it, where `freed_by_pool`).
    Leave {
        freed_by_pool: bool,
    },
}
