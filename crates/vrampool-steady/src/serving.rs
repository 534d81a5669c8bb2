//! The serving path's state: one word that every call reads first (the phase, and while a schedule
//! is served, its epoch and the next step's position), and each epoch's immutable `Serving`, which
//! threads keep a reference to so that reading it takes no lock.
//!
//! A call follows its schedule with one compare-and-swap of the word, from its position to the
//! next: the steps are taken one at a time, in order, whichever thread takes them, and a call whose
//! step is not the next one (another thread took it, or the program changed) takes the cold path.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use vrampool_core::StreamId;

use crate::schedule::{Schedule, Step};

/// What the pool is doing, in the word's top two bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The mode is off: every call goes to the pool (frees of arena buffers excepted).
    Off,
    /// Nothing repeats: calls go to the pool until the wait is over (see `idle.rs`).
    Idle,
    /// Recording an iteration, or about to: every call takes the lock.
    Cold,
    /// Following a schedule: see `Word`.
    Serving,
}

/// The word: phase << 62 | held << 61 | epoch << 32 | position, the last three while serving.
/// Held: frees were taken ahead of their steps (`Cold::early`), and every call takes the cold path
/// until the steps catch up with them.
pub(crate) struct Word;

const PHASE_SHIFT: u32 = 62;
const HELD: u64 = 1 << 61;
const EPOCH_BITS: u32 = 29;
pub(crate) const EPOCH_MASK: u32 = (1 << EPOCH_BITS) - 1;

impl Word {
    pub const OFF: u64 = 0;
    pub const IDLE: u64 = 1 << PHASE_SHIFT;
    pub const COLD: u64 = 2 << PHASE_SHIFT;
    /// A plan made ahead is served (`ahead.rs`): every call takes the cold path.
    pub const AHEAD: u64 = Self::COLD | 1;

    #[inline(always)]
    pub fn phase(word: u64) -> Phase {
        match word >> PHASE_SHIFT {
            0 => Phase::Off,
            1 => Phase::Idle,
            2 => Phase::Cold,
            _ => Phase::Serving,
        }
    }

    /// Serving, and not held: what the serving path takes.
    #[inline(always)]
    pub fn is_serving(word: u64) -> bool {
        word >> 61 == 0b110
    }

    #[inline(always)]
    pub fn is_held(word: u64) -> bool {
        word & HELD != 0
    }

    /// `word`, held or not.
    pub fn held(word: u64, held: bool) -> u64 {
        if held {
            word | HELD
        } else {
            word & !HELD
        }
    }

    #[inline(always)]
    pub fn serving(epoch: u32, position: u32) -> u64 {
        3 << PHASE_SHIFT | u64::from(epoch & EPOCH_MASK) << 32 | u64::from(position)
    }

    #[inline(always)]
    pub fn epoch(word: u64) -> u32 {
        (word >> 32) as u32 & EPOCH_MASK
    }

    #[inline(always)]
    pub fn position(word: u64) -> usize {
        word as u32 as usize
    }
}

/// An epoch's schedule and where its streams' regions lie. Never changes: a new schedule, or new
/// regions, make a new epoch.
#[derive(Debug)]
pub(crate) struct Serving {
    pub epoch: u32,
    pub schedule: Arc<Schedule>,
    /// Per stream of the schedule, its region's base.
    pub bases: Box<[u64]>,
    /// Every region's bytes, `[lo, hi)`, in address order: the pool's buffers lie outside them all.
    pub regions: Box<[(u64, u64)]>,
    /// Per allocation that the pool serves: its address while it lives (0 before and after), so
    /// that its free is matched exactly and a recording that goes on from here knows it.
    pub pool_addrs: Box<[AtomicU64]>,
}

/// What the next step asks of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// An allocation: at this address of the arena, or from the pool (the iteration's `index`-th).
    Arena(u64),
    Pool {
        index: usize,
    },
    /// A free: of an arena buffer of `size` bytes on `stream` (nothing to do but move on), or of a
    /// pool buffer (the iteration's `index`-th, or an older one).
    ArenaFreed {
        size: u64,
        stream: StreamId,
    },
    PoolFree {
        index: Option<usize>,
    },
}

impl Serving {
    /// Whether `addr` lies in a region (`regions` is in address order).
    #[inline(always)]
    pub fn in_regions(&self, addr: u64) -> bool {
        if self.regions.len() <= 8 {
            return self.regions.iter().any(|&(lo, hi)| lo <= addr && addr < hi);
        }
        let at = self.regions.partition_point(|&(lo, _)| lo <= addr);
        at > 0 && addr < self.regions[at - 1].1
    }

    /// Where the schedule would have an arena buffer at `addr`: its stream's index and the offset
    /// in that stream's region.
    pub fn locate(&self, addr: u64) -> Option<(usize, u64)> {
        let schedule = &self.schedule;
        (0..schedule.streams.len()).find_map(|i| {
            let base = self.bases[i];
            (schedule.region_bytes[i] > 0 && base <= addr && addr < base + schedule.region_bytes[i]).then(|| (i, addr - base))
        })
    }

    /// The step at `position` (the first again once the schedule is done: a new iteration of it)
    /// and the word after it is taken, and whether it starts a new iteration.
    #[inline(always)]
    fn next(&self, word: u64) -> Option<(Step, u64, bool)> {
        let steps = &self.schedule.steps;
        let position = Word::position(word);
        let (at, wraps) = if position >= steps.len() { (0, true) } else { (position, false) };
        let step = *steps.get(at)?;
        Some((step, Word::serving(self.epoch, at as u32 + 1), wraps))
    }

    /// An allocation of `size` bytes on `stream` at the schedule's next step: what to do, the word
    /// after it, and whether it starts a new iteration; None when it is not the next step.
    #[inline(always)]
    pub fn allocation(&self, word: u64, size: u64, stream: StreamId) -> Option<(Take, u64, bool)> {
        let (step, next, wraps) = self.next(word)?;
        let index = self.schedule.stream_index(stream)?;
        if !step.allocates(size, index) {
            return None;
        }
        let take = match step.in_arena() {
            true => Take::Arena(self.bases[index] + step.offset()),
            false => Take::Pool { index: step.offset() as usize },
        };
        Some((take, next, wraps))
    }

    /// A free of `addr` (of `size` bytes and last used on `stream`, where given) at the next step.
    #[inline(always)]
    pub fn free(&self, word: u64, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Option<(Take, u64, bool)> {
        let (step, next, wraps) = self.next(word)?;
        if !step.is_free() {
            return None;
        }
        if !step.in_arena() {
            let matches = match step.frees_index() {
                Some(index) => addr != 0 && self.pool_addrs[index].load(Relaxed) == addr,
                None => !self.in_regions(addr),
            };
            return matches.then_some((Take::PoolFree { index: step.frees_index() }, next, wraps));
        }
        let own = self.schedule.streams[step.stream()];
        let exact =
            addr == self.bases[step.stream()] + step.offset() && size.is_none_or(|s| s == step.size()) && stream.is_none_or(|s| s == own);
        exact.then_some((Take::ArenaFreed { size: step.size(), stream: own }, next, wraps))
    }
}

impl Serving {
    /// Notes where the pool put the iteration's `index`-th allocation (None: it is freed).
    #[inline(always)]
    pub fn note_pool_buffer(&self, index: usize, addr: Option<u64>) {
        self.pool_addrs[index].store(addr.unwrap_or(0), Relaxed);
    }
}

/// Entries per thread: a thread that serves several pools in turn (a device each) keeps each one's.
const CACHED: usize = 4;

/// A pool's serving state of one epoch, as a thread keeps it: (pool, epoch, state).
type Cached = Option<(u64, u32, Arc<Serving>)>;

/// The states a thread keeps, most recent first; dropping them (the thread exits) clears `LAST`.
struct Kept([Cached; CACHED]);

impl Drop for Kept {
    fn drop(&mut self) {
        let _ = LAST.try_with(|last| last.set((0, 0, std::ptr::null())));
    }
}

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept([None, None, None, None])) };
    /// The most recent entry of `KEPT`, for the serving path: (pool, epoch, its state). Pools are
    /// numbered from 1, so the initial entry matches none.
    static LAST: Cell<(u64, u32, *const Serving)> = const { Cell::new((0, 0, std::ptr::null())) };
}

/// Runs `f` on pool `pool`'s serving state of `epoch` as this thread keeps it, fetching it with
/// `fetch` (which takes the pool's lock) when the thread has not seen that epoch yet. None when the
/// epoch is over, or the thread is exiting.
#[inline(always)]
pub(crate) fn with_serving<T>(
    pool: u64,
    epoch: u32,
    fetch: impl FnOnce() -> Option<Arc<Serving>>,
    f: impl FnOnce(&Serving) -> Option<T>,
) -> Option<T> {
    let (last_pool, last_epoch, last) = LAST.try_with(Cell::get).ok()?;
    let serving = if last_pool == pool && last_epoch == epoch { last } else { kept(pool, epoch, fetch)? };
    // SAFETY: `LAST` points into the first entry of this thread's `KEPT`, whose `Arc` keeps the state
    // alive: only `kept` replaces entries (always leaving `LAST` on the first), and dropping them clears
    // `LAST`. Nothing `f` runs reaches `kept` (it reads the state and returns).
    f(unsafe { &*serving })
}

/// The serving state of `pool` at `epoch` from this thread's entries (fetched when missing), made
/// the first of them, where `LAST` then points.
#[cold]
#[inline(never)]
fn kept(pool: u64, epoch: u32, fetch: impl FnOnce() -> Option<Arc<Serving>>) -> Option<*const Serving> {
    KEPT.try_with(|kept| {
        let mut kept = kept.try_borrow_mut().ok()?;
        let entries = &mut kept.0;
        let at = match entries.iter().position(|c| c.as_ref().is_some_and(|c| c.0 == pool && c.1 == epoch)) {
            Some(at) => at,
            None => {
                let serving = fetch().filter(|s| s.epoch == epoch)?;
                entries[CACHED - 1] = Some((pool, epoch, serving));
                CACHED - 1
            }
        };
        entries[..=at].rotate_right(1);
        let serving = Arc::as_ptr(&entries[0].as_ref().expect("just placed").2);
        LAST.with(|last| last.set((pool, epoch, serving)));
        Some(serving)
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_found_among_many_regions() {
        let events: Vec<_> = (0..1).map(|_| crate::schedule::Recorded::FreeOlder { size: 0 }).collect();
        let planning = crate::schedule::Planning { budget: std::time::Duration::ZERO, alignment: 512 };
        let schedule = Arc::new(crate::schedule::plan_schedule(&events, planning).unwrap());
        for count in [3u64, 40] {
            let regions: Box<[(u64, u64)]> = (0..count).map(|i| (i << 24, (i << 24) + (1 << 20))).collect();
            let serving = Serving { epoch: 1, schedule: schedule.clone(), bases: Box::new([]), regions, pool_addrs: Box::new([]) };
            for i in 0..count {
                assert!(serving.in_regions(i << 24) && serving.in_regions((i << 24) + (1 << 20) - 1));
                assert!(!serving.in_regions((i << 24) + (1 << 20)) && !serving.in_regions((i << 24) + (2 << 20)));
            }
            assert!(!serving.in_regions(count << 24));
        }
    }

    #[test]
    fn the_word_keeps_phase_epoch_and_position_apart() {
        assert_eq!(Word::phase(Word::OFF), Phase::Off);
        assert_eq!(Word::phase(Word::IDLE), Phase::Idle);
        assert_eq!(Word::phase(Word::COLD), Phase::Cold);
        let word = Word::serving(EPOCH_MASK, u32::MAX);
        assert_eq!((Word::phase(word), Word::epoch(word), Word::position(word)), (Phase::Serving, EPOCH_MASK, u32::MAX as usize));
        assert_eq!(Word::epoch(Word::serving(EPOCH_MASK + 2, 0)), 1, "epochs wrap within their bits");
        assert!(Word::is_serving(word) && !Word::is_held(word));
        let held = Word::held(word, true);
        assert!(!Word::is_serving(held) && Word::is_held(held) && Word::phase(held) == Phase::Serving);
        assert_eq!((Word::epoch(held), Word::position(held), Word::held(held, false)), (EPOCH_MASK, u32::MAX as usize, word));
        assert!(![Word::OFF, Word::IDLE, Word::COLD, Word::AHEAD].iter().any(|&w| Word::is_serving(w) || Word::is_held(w)));
        assert_eq!(Word::phase(Word::AHEAD), Phase::Cold);
    }
}
