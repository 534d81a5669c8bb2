//! The pool: routes each request to a strategy, caches freed memory, grows and shrinks through
//! the device, orders reuse across streams, and keeps the counters.
//!
//! Fast path (no lock): a request whose block would be exactly a size class (up to 1 GiB, in any
//! tier) and finds one cached, in the calling thread's cache (small blocks) or the stream's
//! magazines, and the matching free. Everything else takes the lock of one strategy instance (one
//! per stream and tier), never a pool-wide lock.
//!
//! The fastest path, a small block of the default stream from the thread's cache and back, is one
//! call each way to a function that makes no call, so spills nothing to the stack, and returns in
//! registers (`allocate_from_thread_cache`, `free_to_thread_cache`; `allocate` and `free` are
//! inlined around them). One word (`fast_gate`) says whether anything rules it out; one table load
//! finds the request's class (`cache_class`); the block's parked slot in the live table comes back
//! to life with two stores (`live_table`); and the free's one compare-and-swap is what makes a
//! racing double free fail. Whatever it cannot do, it leaves undone for the general path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use crate::arena::Arena;
use crate::cache_class::{cache_class, class_tag, thread_class_table, thread_classes, ThreadClass};
use crate::config::{Limit, PoolConfig, Scrub};
use crate::device::{Device, EventId, StreamId};
use crate::error::{ArenaHeld, DeviceError, InvalidFreeReason, OomReport, PoolError, Result};
use crate::event_log::{EventKind, EventLog, LogEvent, PieceEvent};
use crate::expandable::{pieces, Expandable, Reservation, PIECES_PER_HIGH_WATER};
use crate::fast_gate::FastGate;
use crate::live_table::{LiveBlock, LiveTable, Removal};
use crate::sharded_map::ShardedMap;
use crate::sizes::{class_size, round_up, MAX_REQUEST, MIN_BLOCK};
use crate::stats::{CounterValues, Counters, Fast, Stats};
use crate::strategy::{Block, BlockInfo, Segment, Strategy};
use crate::thread_cache::{self, CacheOfThread, CacheOwner, PoolCache, PoolHandle, HOME_STREAM};
use arenas::Arenas;
use holding::Holding;
pub use pause::PauseReport;

mod arenas;
mod general;
mod growth;
mod holding;
mod introspection;
mod lanes;
mod pause;
mod stream_order;
mod vm;

/// A growth past the high-water mark gives back only what it needs while the pool would reserve
/// less than a `DRIFT_DIVISOR`th more than it did when live memory last peaked; past that it
/// gives back every idle segment and mapping. Design: giving back only the need leaves idle
/// memory cached in every tier, which saves the device calls of a repeating step, but a layout
/// that keeps shifting (the demo GPT's sequence lengths) fragments the cached memory, and the
/// high-water mark crept a few MiB a step (gpt x8: 1.02x to 1.20x of the bound over 400 replays);
/// the full give-back resets the layout, and bounds the drift by a sixteenth.
const DRIFT_DIVISOR: u64 = 16;

/// Streams holding memory up to which a growth first flushes the caches and gives back
/// (`allocate_slow`).
const RECLAIM_MAX_STREAMS: usize = 64;

/// Slots in the live-block table: 2^16 (2 MiB of host memory); blocks whose slot is taken go to
/// the overflow map. Design: with 2^14, a program holding 40,000 live blocks found most of them in
/// the overflow map, 121 ns a free and allocation on one thread (`examples/many_live.rs`) against
/// 76 ns now, and two threads shared that map's shards (0.63x one thread's throughput, now 0.8x;
/// 4,000 live blocks: 0.83-0.88x, now 1.25-1.40x). A training step of a large model holds tens of
/// thousands of blocks.
const LIVE_TABLE_SLOTS: usize = 1 << 16;

/// A free that waits for other streams' work: the block is reusable once every event completed.
struct DeferredFree {
    addr: u64,
    block: LiveBlock,
    events: Vec<EventId>,
    /// The streams the events were recorded on (a pause waits for them).
    streams: Vec<StreamId>,
}

/// A live block at the time of a call to `Pool::live_blocks` (for leak reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlockInfo {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: StreamId,
    /// Nanoseconds since the block was handed out; None unless `PoolConfig::track_leaks` is on.
    pub age_ns: Option<u64>,
}

/// What a block in a snapshot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out and not freed.
    Active {
        requested: u64,
    },
    /// Freed, waiting for another stream's work to pass it.
    PendingFree,
    /// Freed and cached on the fast path.
    Cached,
    Free,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSnapshot {
    pub stream: StreamId,
    pub strategy: &'static str,
    pub base: u64,
    pub size: u64,
    /// Part of an expandable segment: a mapped run of its reserved range (`size` is what is
    /// mapped there now).
    pub expandable: bool,
    /// Paused (`PoolCore::pause`): the range keeps its blocks and addresses, with no memory behind it.
    pub paused: bool,
    pub blocks: Vec<(u64, u64, BlockState)>,
}

/// A device-memory pool. Cheap to share across threads by reference (`Send + Sync`); every
/// method is on `PoolCore`, reached through `Deref`.
pub struct Pool(Arc<PoolCore>);

pub struct PoolCore {
    /// Unique for the process's life: thread caches find their pool by it.
    id: u64,
    /// The process generation the pool was made in (`fork.rs`): in a forked child it refuses
    /// every call.
    generation: u64,
    this: Weak<dyn CacheOwner>,
    /// Every thread's cache for this pool, so that a trim takes their blocks back at once.
    thread_caches: Mutex<Vec<CacheOfThread>>,
    /// Held while the caches are emptied, so that a second flush waits for the first's blocks to
    /// be back rather than skip the caches the first has claimed.
    flushing: Mutex<()>,
    device: Arc<dyn Device>,
    config: PoolConfig,
    device_total: u64,
    /// The most the pool may reserve (the limit, or the device's total memory).
    cap: AtomicU64,
    /// Segment bytes held or being requested: checked against `cap` before each device call.
    committed: AtomicU64,
    /// The most `committed` has ever been (not reset by `reset_peak_stats`): what the pieces of
    /// an expandable growth are sized by.
    committed_high: AtomicU64,
    /// The most `committed` has been since the last `trim`: with `reclaim`, a growth that stays
    /// below it gives nothing back first.
    give_back_mark: AtomicU64,
    /// `committed` after the last growth made at a new peak of allocated bytes: what the pool
    /// needed the last time live memory set a record (see `DRIFT_DIVISOR`).
    committed_at_live_peak: AtomicU64,
    /// Expandable segments, when on and the device supports them.
    vm: Option<Expandable>,
    /// The default stream's arena, reached without a map lookup.
    default_arena: Arena,
    /// Thread caches hold the classes below this index: the first tier's blocks of at most
    /// `small_max` bytes that it caches (`cache_class::thread_classes`). Larger cached blocks go to
    /// the magazines only (a trim or a growth empties both at once).
    thread_classes: usize,
    /// For the fastest path, per 512-byte granule of request size: the thread-cache class of the
    /// requests in it, if any (see `thread_class_table`).
    thread_class_of: Box<[ThreadClass]>,
    /// The arenas of the other streams, and of the lanes past the first (`lanes.rs`).
    arenas: Arenas,
    lanes: lanes::Lanes,
    /// The arenas that may hold memory (see `holding`).
    holding: Holding,
    /// Live blocks: the lock-free direct-mapped table, and the map for blocks whose slot was taken.
    live: LiveTable<LIVE_TABLE_SLOTS>,
    overflow: ShardedMap<LiveBlock>,
    /// Streams other than a block's own that used it (`record_stream`), by block address.
    recorded: Mutex<HashMap<u64, Vec<StreamId>>>,
    deferred: Mutex<Vec<DeferredFree>>,
    counters: Counters,
    /// Closed, deferred frees, recorded streams, a small cap: what the fastest paths must not miss.
    gate: FastGate,
    log: Option<EventLog>,
    /// What a pause took away, to give back on resume (`pause.rs`); None while not paused.
    paused: Mutex<Option<pause::Paused>>,
    /// Bytes unmapped by a pause and not yet mapped again.
    paused_bytes: AtomicU64,
    /// Allocation times of live blocks (ns since `started`), when `track_leaks` is on.
    births: Option<ShardedMap<u64>>,
    started: Instant,
}

impl Pool {
    pub fn new(device: Arc<dyn Device>, config: PoolConfig) -> Result<Self> {
        config.validate()?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let device_total = device.mem_info()?.total;
        let cap = cap_for(config.limit, device_total);
        let default_arena = Arena::for_config(&config, StreamId(0));
        let thread_classes = thread_classes(&config);
        let thread_class_of = thread_class_table(&config, &default_arena, thread_classes);
        let vm = Expandable::new(&config, device.as_ref(), device_total);
        let log = config.record_events.then(EventLog::new);
        let births = config.track_leaks.then(ShardedMap::default);
        let gate = FastGate::default();
        gate.set(FastGate::SMALL_CAP, below_thread_blocks(&thread_class_of, cap));
        // `thread_class_table` is empty when an option must see every call.
        gate.set(FastGate::WATCHED, thread_class_of.is_empty());
        let core = Arc::new_cyclic(|this: &Weak<PoolCore>| PoolCore {
            id: NEXT_ID.fetch_add(1, Relaxed),
            generation: crate::fork::generation(),
            this: this.clone() as Weak<dyn CacheOwner>,
            thread_caches: Mutex::default(),
            flushing: Mutex::default(),
            device,
            config,
            device_total,
            cap: AtomicU64::new(cap),
            committed: AtomicU64::new(0),
            committed_high: AtomicU64::new(0),
            give_back_mark: AtomicU64::new(0),
            committed_at_live_peak: AtomicU64::new(0),
            vm,
            default_arena,
            thread_classes,
            thread_class_of,
            arenas: Arenas::default(),
            lanes: lanes::Lanes::default(),
            holding: Holding::default(),
            live: LiveTable::default(),
            overflow: ShardedMap::default(),
            recorded: Mutex::default(),
            deferred: Mutex::default(),
            counters: Counters::default(),
            gate,
            log,
            paused: Mutex::default(),
            paused_bytes: AtomicU64::new(0),
            births,
            started: Instant::now(),
        });
        Ok(Pool(core))
    }
}

/// What the fastest path of an allocation found (in two registers).
enum FastAlloc {
    Hit(u64),
    /// A hit after which the pool's peaks are due for an update (a call, made outside).
    PeaksDue(u64),
    /// Nothing done: the general path serves the request.
    Miss,
}

/// How far the cached path of a free went (`MemoryResource::free_cached`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedFree {
    /// Freed.
    Done,
    /// Taken out of the live table, and held: `MemoryResource::free_parked` ends the free.
    Parked,
    /// Nothing done: `free` does it all.
    Untouched,
}

/// How far the fastest path of a free went.
enum FastFree {
    /// Into this thread's cache: done.
    Cached,
    /// Out of the live table (its slot parked, keeping its metadata), not cached: the general
    /// path gives it back. (The metadata is read again rather than returned, so that the fast
    /// path returns in a register.)
    Removed,
    /// Nothing done (the free may be wrong, or the pool closed): the general path starts over.
    Untouched,
}

/// Whether `cap` is below the largest block the fastest path hands out, which then must check it.
fn below_thread_blocks(thread_class_of: &[ThreadClass], cap: u64) -> bool {
    thread_class_of.iter().any(|class| class.size() > cap)
}

impl std::ops::Deref for Pool {
    type Target = PoolCore;
    fn deref(&self) -> &PoolCore {
        &self.0
    }
}

impl CacheOwner for PoolCore {
    fn adopt(&self, blocks: Vec<(u64, u64)>) {
        for (stream, addr) in blocks {
            // Thread caches hold only the first tier's blocks (`thread_classes`).
            let arena = self.arena(StreamId(stream));
            let mut strategy = self.lock_tier(arena, 0);
            let freed = self.file_back(&mut **strategy, addr);
            debug_assert!(freed.is_some(), "a cached block belongs to its arena's first tier");
        }
    }

    fn retire(&self, cache: &Arc<PoolCache>) {
        self.leave_lane(cache.lane());
        self.counters.fast.retire(cache.counters_arc());
        self.thread_caches.lock().retain(|c| !c.is(cache));
    }
}

impl PoolCore {
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Fails with `WrongDevice` unless `ordinal` is this pool's device.
    pub fn check_device(&self, ordinal: i32) -> Result<()> {
        match self.device.ordinal() {
            pool if pool == ordinal => Ok(()),
            pool => Err(PoolError::WrongDevice { pool, given: ordinal }),
        }
    }

    /// The most the pool may reserve now.
    pub fn capacity(&self) -> u64 {
        self.cap.load(Relaxed)
    }

    /// Changes the limit (e.g. `torch.cuda.set_per_process_memory_fraction`); memory already
    /// reserved above a lower limit is given back as it frees up, on the next trim.
    pub fn set_limit(&self, limit: Option<Limit>) -> Result<()> {
        let mut config = self.config.clone();
        config.limit = limit;
        config.validate()?;
        let cap = cap_for(limit, self.device_total);
        self.cap.store(cap, Relaxed);
        self.gate.set(FastGate::SMALL_CAP, below_thread_blocks(&self.thread_class_of, cap));
        Ok(())
    }

    /// Allocates at least `size` bytes for use on `stream`; returns the block's address. With
    /// `scrub: on_alloc`, the whole block is zero-filled (on `stream`) before it is returned.
    // Inlined, so that the fast path is one call to a function that makes none and returns in
    // registers (a `Result` with the error's figures returns through memory).
    #[inline]
    pub fn allocate(&self, size: u64, stream: StreamId) -> Result<u64> {
        match self.allocate_cached(size, stream) {
            Some(addr) => Ok(addr),
            None => self.allocate_general(size, stream),
        }
    }

    /// The fastest path alone: a block from this thread's cache, or None with nothing done. It
    /// cannot fail, and it makes no call that can panic (see `MemoryResource::allocate_cached`).
    #[inline]
    pub fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
        match self.allocate_from_thread_cache(size, stream) {
            FastAlloc::Hit(addr) => Some(addr),
            FastAlloc::PeaksDue(addr) => {
                self.counters.fast.checkpoint();
                Some(addr)
            }
            FastAlloc::Miss => None,
        }
    }

    /// The fastest path: a small block for the default stream from this thread's cache, when the
    /// thread used this pool last, no trim, close or deferred free is pending and the block's
    /// parked slot revives. A miss, with nothing done, otherwise; the general path then does it
    /// all. It makes no call, so it spills nothing to the stack, and it returns in registers.
    #[inline(never)]
    fn allocate_from_thread_cache(&self, size: u64, stream: StreamId) -> FastAlloc {
        self.take_from_thread_cache(size, stream).unwrap_or(FastAlloc::Miss)
    }

    #[inline(always)]
    fn take_from_thread_cache(&self, size: u64, stream: StreamId) -> Option<FastAlloc> {
        if stream.0 != HOME_STREAM || self.gate.any(FastGate::ALLOC) {
            return None;
        }
        // SAFETY: nothing below calls anything that uses a thread cache: it reads and writes the
        // cache, the live table and this thread's counters only.
        let cache = unsafe { thread_cache::current_unmarked(self.id) }?;
        // A zero size wraps to a granule past the table's end.
        let class = *self.thread_class_of.get((size.wrapping_sub(1) / MIN_BLOCK) as usize)?;
        let index = class.index()?;
        let block = LiveBlock { size: class.size(), requested: size, stream: HOME_STREAM, tier: 0, class: class.tag() };
        let mut lists = cache.lists()?;
        let list = lists.home(index)?;
        let &addr = list.last()?;
        if !self.live.revive(addr, block) {
            return None;
        }
        list.pop();
        drop(lists);
        Self::count_alloc(cache, &block);
        Some(match cache.note_allocated(block.size) {
            true => FastAlloc::PeaksDue(addr),
            false => FastAlloc::Hit(addr),
        })
    }

    /// Frees the block at `addr`. `size`, when given, must be the size it was allocated with (or
    /// its rounded size); `stream`, when given and not the block's own, is a stream that used the
    /// block last: its reuse then waits for that stream's work.
    // Inlined, as `allocate` is.
    #[inline]
    pub fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        match self.free_cached(addr, size, stream) {
            CachedFree::Done => Ok(()),
            CachedFree::Parked => self.free_parked(addr, stream),
            CachedFree::Untouched => self.free_general(addr, size, stream),
        }
    }

    /// The fastest path of a free alone: into this thread's cache (`Done`), or out of the live
    /// table only (`Parked`: `free_parked` ends it), or nothing done. It makes no call.
    #[inline]
    pub fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        // The fastest path takes no size as 0, which no block has (a free naming 0 bytes goes to
        // the general path, which refuses it), and no stream but the default one.
        if size == Some(0) || stream.is_some_and(|s| s.0 != HOME_STREAM) {
            return CachedFree::Untouched;
        }
        match self.free_to_thread_cache(addr, size.unwrap_or(0)) {
            FastFree::Cached => CachedFree::Done,
            FastFree::Removed => CachedFree::Parked,
            FastFree::Untouched => CachedFree::Untouched,
        }
    }

    /// The fastest path of a free, the counterpart of `allocate_from_thread_cache`: takes the
    /// block out of the live table (`size` is the size the free names, 0 for none) and, if it is
    /// a small block of the default stream and this thread's cache has room for it, caches it
    /// there. It makes no call either.
    #[inline(never)]
    fn free_to_thread_cache(&self, addr: u64, size: u64) -> FastFree {
        if self.gate.any(FastGate::FREE) {
            return FastFree::Untouched;
        }
        let Ok(block) = self.live.remove_if(addr, |b| Self::size_agrees(b, (size != 0).then_some(size))) else {
            return FastFree::Untouched;
        };
        let Some(index) = block.cache_index().filter(|&i| i < self.thread_classes && block.stream == HOME_STREAM) else {
            return FastFree::Removed;
        };
        // SAFETY: as in `allocate_from_thread_cache`.
        let Some(cache) = (unsafe { thread_cache::current_unmarked(self.id) }) else {
            return FastFree::Removed;
        };
        if !cache.push_home(index, addr) {
            return FastFree::Removed;
        }
        Self::count_free(cache, &block);
        FastFree::Cached
    }

    /// The rest of a free whose block the fastest path took out of the table, and holds.
    #[inline(never)]
    pub fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<()> {
        let Some(block) = self.live.parked(addr) else { unreachable!("only the block's holder unparks its slot") };
        if let Err(forked) = self.check_process() {
            self.insert_live(addr, block);
            return Err(forked);
        }
        self.free_removed(addr, block, stream)
    }

    /// Refuses every later call, gives back every free segment and returns the blocks still live
    /// (leaks). Their segments stay reserved until the pool is dropped, and so does free memory
    /// the device refused to take back (`close_checked` says so).
    pub fn close(&self) -> Vec<LiveBlockInfo> {
        self.close_checked().0
    }

    /// `close`, with an error naming the bytes that stay reserved when the device refused to take
    /// free memory back (a failed unmap or free). The pool is closed either way; a later call
    /// returns no blocks and tries to give the kept memory back again.
    pub fn close_checked(&self) -> (Vec<LiveBlockInfo>, Result<()>) {
        let was_closed = self.gate.set(FastGate::CLOSED, true);
        if self.check_process().is_err() {
            return (Vec::new(), Ok(()));
        }
        let released = self.release_free().map(drop).map_err(|e| {
            let kept: u64 = self.spares(None).iter().map(|s| s.range.size).sum();
            PoolError::Device(DeviceError::Driver(format!(
                "the pool is closed, but the device refused to take back {kept} bytes of its free memory ({e}); \
                 they stay reserved until close() succeeds or the pool is dropped"
            )))
        });
        (if was_closed { Vec::new() } else { self.live_blocks() }, released)
    }

    pub fn is_closed(&self) -> bool {
        self.gate.any(FastGate::CLOSED)
    }
}

impl Drop for PoolCore {
    fn drop(&mut self) {
        // Every segment goes back to the device, live blocks or not: nobody can free them now.
        // In a forked child they are the parent's, and the locks may be held for good: leave them.
        self.gate.set(FastGate::CLOSED, true);
        if self.check_process().is_err() {
            return;
        }
        // A pause's backup may be the device's (page-locked memory): it goes while the device is here.
        drop(self.paused.lock().take());
        let (mut segments, mut reservations) = (Vec::new(), Vec::new());
        self.for_each_arena(|arena| {
            for tier in arena.tiers.iter() {
                segments.extend(tier.lock().snapshot().into_iter().map(|(s, _)| s));
            }
            reservations.extend(arena.with_vm(|vm_arena| std::mem::take(&mut vm_arena.reservations)));
        });
        for e in std::mem::take(&mut *self.deferred.lock()) {
            e.events.into_iter().for_each(|ev| self.device.release_event(ev));
        }
        self.for_each_arena(|arena| {
            let _ = self.device.synchronize_stream(lanes::real(arena.stream));
        });
        // An expandable segment's runs show in the snapshot too: they go with their reservation.
        segments.retain(|s| !reservations.iter().any(|r| r.contains(s.base)));
        for s in segments {
            let _ = self.device.free_segment(s.base, s.size);
        }
        for r in reservations {
            for m in r.all_mappings() {
                let _ = self.device.unmap(m.base, m.size);
            }
            let _ = self.device.unreserve(r.base, r.size);
        }
    }
}

fn cap_for(limit: Option<Limit>, device_total: u64) -> u64 {
    match limit {
        None => device_total,
        Some(Limit::Bytes(b)) => b.min(device_total),
        Some(Limit::Fraction(f)) => (device_total as f64 * f) as u64,
    }
}
