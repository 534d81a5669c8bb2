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

use foldhash::fast::FixedState;
use parking_lot::Mutex;

use crate::arena::Arena;
use crate::cache_class::{cache_class, class_tag, thread_class_table, ThreadClass};
use crate::config::{Limit, PoolConfig, Scrub};
use crate::device::{Device, EventId, StreamId};
use crate::live_table::{LiveBlock, LiveTable, Removal};
use crate::error::{DeviceError, InvalidFreeReason, OomReport, PoolError, Result};
use crate::expandable::{pieces, Expandable, Reservation, PIECES_PER_HIGH_WATER};
use crate::fast_gate::FastGate;
use crate::event_log::{EventKind, EventLog, LogEvent};
use crate::sizes::{class_size, classes_up_to, round_up, MAX_REQUEST, MIN_BLOCK};
use crate::stats::{Counters, Fast, Stats};
use crate::thread_cache::{self, CacheOfThread, CacheOwner, PoolCache, PoolHandle, HOME_STREAM};
use crate::strategy::{BestFit, BestFitConfig, Block, BlockInfo, Buddy, BuddyConfig, Segment, Slab, SlabConfig, Strategy, StrategyKind};

type FastMap<K, V> = papaya::HashMap<K, V, FixedState>;

/// A growth past the high-water mark gives back only what it needs while the pool would reserve
/// less than a `DRIFT_DIVISOR`th more than it did when live memory last peaked; past that it
/// gives back every idle segment and mapping. Design: giving back only the need leaves idle
/// memory cached in every tier, which saves the device calls of a repeating step, but a layout
/// that keeps shifting (the demo GPT's sequence lengths) fragments the cached memory, and the
/// high-water mark crept a few MiB a step (gpt x8: 1.02x to 1.20x of the bound over 400 replays);
/// the full give-back resets the layout, and bounds the drift by a sixteenth.
const DRIFT_DIVISOR: u64 = 16;

/// Slots in the live-block table: 2^14 (512 KiB of host memory); blocks whose slot is taken go
/// to the overflow map.
const LIVE_TABLE_SLOTS: usize = 1 << 14;

/// A free that waits for other streams' work: the block is reusable once every event completed.
struct DeferredFree {
    addr: u64,
    block: LiveBlock,
    events: Vec<EventId>,
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
    Active { requested: u64 },
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
    /// The most `committed` has ever been (not reset by `reset_peak_stats`): with `reclaim`, a
    /// growth that stays below it gives nothing back first.
    committed_high: AtomicU64,
    /// `committed` after the last growth made at a new peak of allocated bytes: what the pool
    /// needed the last time live memory set a record (see `DRIFT_DIVISOR`).
    committed_at_live_peak: AtomicU64,
    /// Expandable segments, when on and the device supports them.
    vm: Option<Expandable>,
    /// The default stream's arena, reached without a map lookup.
    default_arena: Arena,
    /// Thread caches hold the classes below this index: the first tier's blocks of at most
    /// `small_max` bytes. Larger cached blocks go to the magazines only (a trim or a growth
    /// empties both at once).
    thread_classes: usize,
    /// For the fastest path, per 512-byte granule of request size: the thread-cache class of the
    /// requests in it, if any (see `thread_class_table`).
    thread_class_of: Box<[ThreadClass]>,
    // Every papaya map here is pinned with an owned guard (`pin_owned`): a thread's exit may
    // give its cache back, or drop the pool, from a thread-local destructor, when the state
    // behind papaya's thread-local guards is already gone (pinning then panics, which aborts).
    arenas: FastMap<StreamId, Arena>,
    /// Live blocks: the lock-free direct-mapped table, and the map for blocks whose slot was taken.
    live: LiveTable<LIVE_TABLE_SLOTS>,
    overflow: FastMap<u64, LiveBlock>,
    /// Streams other than a block's own that used it (`record_stream`), by block address.
    recorded: Mutex<HashMap<u64, Vec<StreamId>>>,
    deferred: Mutex<Vec<DeferredFree>>,
    counters: Counters,
    /// Closed, deferred frees, recorded streams, a small cap: what the fastest paths must not miss.
    gate: FastGate,
    log: Option<EventLog>,
    /// Allocation times of live blocks (ns since `started`), when `track_leaks` is on.
    births: Option<FastMap<u64, u64>>,
    started: Instant,
}

impl Pool {
    pub fn new(device: Arc<dyn Device>, config: PoolConfig) -> Result<Self> {
        config.validate()?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let device_total = device.mem_info()?.total;
        let cap = cap_for(config.limit, device_total);
        let default_arena = new_arena(&config, StreamId(0));
        let thread_classes = classes_up_to(config.small_max);
        let thread_class_of = thread_class_table(&config, &default_arena, thread_classes);
        let vm = Expandable::new(&config, device.as_ref(), device_total);
        let log = config.record_events.then(EventLog::new);
        let births = config.track_leaks.then(FastMap::default);
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
            committed_at_live_peak: AtomicU64::new(0),
            vm,
            default_arena,
            thread_classes,
            thread_class_of,
            arenas: FastMap::default(),
            live: LiveTable::default(),
            overflow: FastMap::default(),
            recorded: Mutex::default(),
            deferred: Mutex::default(),
            counters: Counters::default(),
            gate,
            log,
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
            let freed = self.file_back(&mut **self.arena(StreamId(stream)).tiers[0].lock(), addr);
            debug_assert!(freed.is_some(), "a cached block belongs to its arena's first tier");
        }
    }

    fn retire(&self, cache: &Arc<PoolCache>) {
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
        match self.allocate_from_thread_cache(size, stream) {
            FastAlloc::Hit(addr) => Ok(addr),
            FastAlloc::PeaksDue(addr) => {
                self.counters.fast.checkpoint();
                Ok(addr)
            }
            FastAlloc::Miss => self.allocate_general(size, stream),
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

    #[inline(never)]
    fn allocate_general(&self, size: u64, stream: StreamId) -> Result<u64> {
        let addr = self.allocate_block(size, stream)?;
        if self.config.scrub == Scrub::OnAlloc {
            self.scrub_new_block(addr)?;
        }
        Ok(addr)
    }

    #[inline(always)]
    fn allocate_block(&self, size: u64, stream: StreamId) -> Result<u64> {
        self.ensure_open()?;
        let rounded = self.round_request(size)?;
        self.complete_deferred_frees();
        // Fast path: a cached block of the size the strategy would hand out, from this thread's
        // cache, else from the shared magazines; no lock either way.
        let tier = self.tier_of(rounded);
        let block_size = self.config.block_size_for(rounded, tier);
        if let Some(index) = self.cache_class(block_size, tier) {
            let block = LiveBlock { size: block_size, requested: size, stream: stream.0, tier, class: class_tag(index) };
            if index < self.thread_classes {
                let from_thread = self.with_thread_cache(|c| {
                    let addr = thread_cache::pop(c, stream.0, index)?;
                    Self::count_alloc(c, &block);
                    Some((addr, c.note_allocated(block.size)))
                });
                if let Some(Some((addr, checkpoint_due))) = from_thread {
                    if checkpoint_due {
                        self.counters.fast.checkpoint();
                    }
                    return Ok(self.record_live(addr, block));
                }
            }
            if let Some(addr) = self.arena(stream).magazines.pop(index) {
                return Ok(self.hand_out(addr, block, true));
            }
        }
        self.allocate_slow(&self.arena(stream), size, rounded, stream)
    }

    /// Frees the block at `addr`. `size`, when given, must be the size it was allocated with (or
    /// its rounded size); `stream`, when given and not the block's own, is a stream that used the
    /// block last: its reuse then waits for that stream's work.
    // Inlined, as `allocate` is.
    #[inline]
    pub fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        // The fastest path takes no size as 0, which no block has (a free naming 0 bytes goes to
        // the general path, which refuses it), and no stream but the default one.
        if size == Some(0) || stream.is_some_and(|s| s.0 != HOME_STREAM) {
            return self.free_general(addr, size, stream);
        }
        match self.free_to_thread_cache(addr, size.unwrap_or(0)) {
            FastFree::Cached => Ok(()),
            FastFree::Removed => self.free_parked(addr, stream),
            FastFree::Untouched => self.free_general(addr, size, stream),
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
    fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<()> {
        let Some(block) = self.live.parked(addr) else { unreachable!("only the block's holder unparks its slot") };
        if let Err(forked) = self.check_process() {
            self.insert_live(addr, block);
            return Err(forked);
        }
        self.free_removed(addr, block, stream)
    }

    #[inline(never)]
    fn free_general(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        self.ensure_open()?;
        match self.live.remove_if(addr, |b| Self::size_agrees(b, size)) {
            Ok(block) => self.free_removed(addr, block, stream),
            Err(removal) => self.free_untabled(addr, size, stream, removal),
        }
    }

    /// Whether the size a free names (if any) is the block's: as requested, or as handed out.
    #[inline(always)]
    fn size_agrees(block: &LiveBlock, size: Option<u64>) -> bool {
        size.is_none_or(|s| s == block.requested || s == block.size)
    }

    /// A free whose block the live table refused (the size is wrong) or does not hold: it is in
    /// the overflow map, or not live at all.
    #[cold]
    #[inline(never)]
    fn free_untabled(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>, removal: Removal) -> Result<()> {
        let wrong_size = |b: &LiveBlock| PoolError::InvalidFree {
            ptr: addr,
            reason: InvalidFreeReason::WrongSize { expected: b.requested, given: size.unwrap_or(0) },
        };
        if let Removal::Refused(block) = removal {
            return Err(wrong_size(&block));
        }
        let block = match self.overflow.pin_owned().remove_if(&addr, |_, b| Self::size_agrees(b, size)) {
            Ok(Some((_, block))) => *block,
            Ok(None) => return Err(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated }),
            Err((_, block)) => return Err(wrong_size(block)),
        };
        self.free_removed(addr, block, stream)
    }

    /// The rest of a free, once its block is out of the live table.
    #[inline(never)]
    fn free_removed(&self, addr: u64, block: LiveBlock, stream: Option<StreamId>) -> Result<()> {
        let owner = StreamId(block.stream);
        if !self.gate.any(FastGate::RECORDED) && stream.is_none_or(|s| s == owner) {
            self.forget_birth(addr);
            self.log(EventKind::Free, addr, block.size, owner);
            self.give_back(addr, block, true);
            return Ok(());
        }
        self.free_used_elsewhere(addr, block, stream)
    }

    /// The free of a block that other streams used too (`record_stream`, or a free naming
    /// another stream): its reuse waits for an event on each of them.
    #[cold]
    fn free_used_elsewhere(&self, addr: u64, block: LiveBlock, stream: Option<StreamId>) -> Result<()> {
        let owner = StreamId(block.stream);
        let recorded = self.take_recorded_streams(addr);
        let mut users = recorded.clone();
        if let Some(s) = stream.filter(|&s| s != owner && !users.contains(&s)) {
            users.push(s);
        }
        let events = match self.record_events(&users) {
            Ok(events) => events,
            Err(e) => {
                // Without events the pool cannot know when the block is safe to reuse: the free
                // does nothing, the block stays live and the caller may free it again.
                self.restore_live(addr, block, recorded);
                return Err(e);
            }
        };
        self.forget_birth(addr);
        self.log(EventKind::Free, addr, block.size, stream.unwrap_or(owner));
        if events.is_empty() {
            self.give_back(addr, block, true);
            return Ok(());
        }
        let counts = [(Fast::AllocatedOut, block.size), (Fast::RequestedOut, block.requested), (Fast::BlocksOut, 1), (Fast::PendingIn, block.size)];
        self.count(&counts, 0);
        self.defer_free(addr, block, events);
        Ok(())
    }

    /// Forgets a freed block's birth time, before the block can be reused, so that a new birth at
    /// this address stays.
    #[inline(always)]
    fn forget_birth(&self, addr: u64) {
        if let Some(births) = &self.births {
            Self::forget_birth_in(births, addr);
        }
    }

    #[cold]
    fn forget_birth_in(births: &FastMap<u64, u64>, addr: u64) {
        births.pin_owned().remove(&addr);
    }

    /// Marks the live block at `addr` as used by `stream` too: when freed, it is not reused until
    /// `stream`'s work queued before the free has completed (`Tensor.record_stream`).
    pub fn record_stream(&self, addr: u64, stream: StreamId) -> Result<()> {
        self.ensure_open()?;
        let owner = match self.live_block(addr) {
            Some(block) => StreamId(block.stream),
            None => return Err(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated }),
        };
        if owner != stream {
            let mut recorded = self.recorded.lock();
            let users = recorded.entry(addr).or_default();
            if !users.contains(&stream) {
                users.push(stream);
            }
            self.gate.set(FastGate::RECORDED, true);
        }
        Ok(())
    }

    /// Returns every wholly free segment to the device (`torch.cuda.empty_cache`); returns the
    /// bytes given back.
    pub fn trim(&self) -> Result<u64> {
        self.ensure_open()?;
        self.release_free()
    }

    /// Alias of `trim`, under PyTorch's name.
    pub fn empty_cache(&self) -> Result<u64> {
        self.trim()
    }

    pub fn stats(&self) -> Stats {
        let (largest, free_ranges) = self.free_ranges();
        self.counters.read(largest, free_ranges)
    }

    pub fn reset_peak_stats(&self) {
        self.counters.reset_peaks();
    }

    /// Segments with their blocks and free ranges, per stream and strategy.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let deferred: Vec<u64> = self.deferred.lock().iter().map(|d| d.addr).collect();
        let mut out = Vec::new();
        let reservations = self.vm.as_ref().map(Expandable::reservations).unwrap_or_default();
        self.for_each_arena(|arena| {
            for tier in arena.tiers.iter() {
                let strategy = tier.lock();
                for (segment, blocks) in strategy.snapshot() {
                    let expandable = reservations.iter().any(|&(s, base, size)| s == arena.stream && segment.base >= base && segment.base - base < size);
                    let blocks = blocks
                        .iter()
                        .map(|&BlockInfo { addr, size, allocated }| {
                            let state = match (allocated, self.live_block(addr)) {
                                (false, _) => BlockState::Free,
                                (true, Some(b)) => BlockState::Active { requested: b.requested },
                                (true, None) if deferred.contains(&addr) => BlockState::PendingFree,
                                (true, None) => BlockState::Cached,
                            };
                            (addr, size, state)
                        })
                        .collect();
                    out.push(SegmentSnapshot { stream: arena.stream, strategy: strategy.name(), base: segment.base, size: segment.size, expandable, blocks });
                }
            }
        });
        out.sort_by_key(|s| s.base);
        out
    }

    /// Every live block (for leak reports), by address; with its age when `track_leaks` is on.
    pub fn live_blocks(&self) -> Vec<LiveBlockInfo> {
        let overflow = self.overflow.pin_owned();
        let births = self.births.as_ref().map(|b| b.pin_owned());
        let now = self.now_ns();
        let mut blocks: Vec<_> = self
            .live
            .iter()
            .chain(overflow.iter().map(|(&addr, &b)| (addr, b)))
            .map(|(addr, b)| {
                let age_ns = births.as_ref().and_then(|m| m.get(&addr).map(|&born| now.saturating_sub(born)));
                LiveBlockInfo { addr, size: b.size, requested: b.requested, stream: StreamId(b.stream), age_ns }
            })
            .collect();
        blocks.sort_by_key(|b| b.addr);
        blocks
    }

    /// The events recorded since the last call (empty unless `record_events` is on).
    pub fn take_events(&self) -> Vec<LogEvent> {
        self.log.as_ref().map(EventLog::take).unwrap_or_default()
    }

    /// Refuses every later call, gives back every free segment and returns the blocks still live
    /// (leaks). Their segments stay reserved until the pool is dropped.
    pub fn close(&self) -> Vec<LiveBlockInfo> {
        if self.gate.set(FastGate::CLOSED, true) || self.check_process().is_err() {
            return Vec::new();
        }
        let _ = self.release_free();
        self.live_blocks()
    }

    pub fn is_closed(&self) -> bool {
        self.gate.any(FastGate::CLOSED)
    }

    // ---- the slow path ----

    fn allocate_slow(&self, arena: &Arena, size: u64, rounded: u64, stream: StreamId) -> Result<u64> {
        let tier = self.tier_of(rounded);
        // Handed out after the strategy's lock is released: counting may give a thread cache's
        // blocks back, which takes that lock.
        let hand_out = |block: Block| {
            let class = self.cache_class(block.size, tier).map_or(0, class_tag);
            self.hand_out(block.addr, LiveBlock { size: block.size, requested: size, stream: stream.0, tier, class }, false)
        };
        if self.config.reclaim {
            // Bound first, so that the guard is gone before `hand_out`.
            let cached = self.allocate_filed(arena, tier, &mut **arena.tiers[tier as usize].lock(), rounded);
            if let Some(block) = cached {
                return Ok(hand_out(block));
            }
            // The emptied caches may make room in this tier: then nothing grows, and nothing is
            // given back either.
            self.flush_caches();
            let flushed = arena.tiers[tier as usize].lock().allocate(rounded);
            if let Some(block) = flushed {
                return Ok(hand_out(block));
            }
            // Growth ahead. Giving back lowers the peak only when the growth would set a new one:
            // below the high-water mark, the segments given back would be the ones the pool
            // grows again (a workload that frees and reallocates would pay two device calls per
            // segment, over and over) and the peak stays where it is anyway. For the same reason
            // it gives back only the bytes by which the growth would pass the mark: the idle
            // segments beyond those stay cached for the sizes that come back, unless the pool has
            // drifted (`DRIFT_DIVISOR`). The estimate is what the growth will ask of the device.
            // Best effort, as a failed give-back only leaves memory reserved.
            let growth = self.growth_estimate(arena, tier, rounded);
            let after = self.committed.load(Relaxed).saturating_add(growth);
            let stats = self.stats();
            let live_peak = stats.allocated_bytes.current + rounded > stats.allocated_bytes.peak;
            let over = after.saturating_sub(self.committed_high.load(Relaxed));
            if over > 0 {
                let base = self.committed_at_live_peak.load(Relaxed);
                let drifted = !live_peak && after > base + base / DRIFT_DIVISOR;
                let _ = self.give_back_free(Some((arena.stream, tier)), if drifted { u64::MAX } else { over });
            }
            if live_peak {
                self.committed_at_live_peak.fetch_max(self.committed.load(Relaxed).saturating_add(growth), Relaxed);
            }
        }
        for attempt in 0..2 {
            if let Some(block) = self.allocate_in(arena, tier, rounded)? {
                return Ok(hand_out(block));
            }
            if attempt == 0 {
                // Out of memory: give back every cached segment (all streams) and try once more.
                self.counters.num_alloc_retries.fetch_add(1, Relaxed);
                self.release_free()?;
            }
        }
        self.counters.num_ooms.fetch_add(1, Relaxed);
        Err(PoolError::OutOfMemory(self.oom_report(size)))
    }

    /// What a growth of `tier` for a block of `rounded` bytes will ask of the device: what an
    /// expandable range would map (at its end, or in a hole), else a plain segment.
    fn growth_estimate(&self, arena: &Arena, tier: u8, rounded: u64) -> u64 {
        let strategy = arena.tiers[tier as usize].lock();
        let plain = strategy.segment_size_for(rounded);
        let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier) else { return plain };
        vm.with_arena(arena.stream, |vm_arena| {
            let newest = vm_arena.reservations.last().map(|r| r.base);
            let unmapped = |r: &Reservation, range: Segment| r.gaps(range).iter().map(|g| g.size).sum::<u64>();
            let planned = vm_arena.reservations.iter().filter_map(|r| {
                let plan = strategy.plan_growth(r.base, rounded, vm.unit, &|range| unmapped(r, range))?;
                let end = Segment { base: r.base + r.extent, size: plan.at_end };
                let at_end = (newest == Some(r.base) && r.extent + plan.at_end <= r.size).then(|| unmapped(r, end));
                at_end.into_iter().chain(plan.hole.map(|h| unmapped(r, h))).min()
            });
            planned.min().unwrap_or_else(|| round_up(rounded, vm.unit).unwrap_or(plain))
        })
    }

    /// A block from the tier's strategy, growing it by a segment if needed; None when the device
    /// (or the cap) has no room.
    fn allocate_in(&self, arena: &Arena, tier: u8, rounded: u64) -> Result<Option<Block>> {
        let mut strategy = arena.tiers[tier as usize].lock();
        if let Some(block) = self.allocate_filed(arena, tier, &mut **strategy, rounded) {
            return Ok(Some(block));
        }
        if let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier) {
            match self.grow_expandable(vm, &mut **strategy, arena.stream, rounded) {
                Ok(true) => {
                    let block = strategy.allocate(rounded).ok_or(PoolError::InvalidSize {
                        size: rounded,
                        reason: "the strategy could not serve a request from the memory mapped for it",
                    })?;
                    return Ok(Some(block));
                }
                // No reservation, or it is full: a plain segment instead.
                Ok(false) => {}
                Err(PoolError::Device(DeviceError::OutOfMemory)) => return Ok(None),
                Err(other) => return Err(other),
            }
        }
        let segment_size = strategy.segment_size_for(rounded);
        match self.grow(segment_size, arena.stream) {
            Ok(base) => {
                strategy.add_segment(Segment { base, size: segment_size });
                let block = strategy.allocate(rounded).ok_or(PoolError::InvalidSize {
                    size: rounded,
                    reason: "the strategy could not serve a request from a new segment sized for it",
                })?;
                Ok(Some(block))
            }
            Err(PoolError::Device(DeviceError::OutOfMemory)) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// A block from the tier's strategy, after filing back into it the tier's large blocks
    /// cached in the arena's magazines. The cache serves only requests for exactly a cached
    /// block's class; every other request is placed with all the tier's free memory merged (small
    /// blocks stay cached: the slab places each class on its own). Called under the tier's lock.
    fn allocate_filed(&self, arena: &Arena, tier: u8, strategy: &mut dyn Strategy, rounded: u64) -> Option<Block> {
        if arena.take_large_cached(tier) {
            arena.magazines.drain(
                |index| index >= self.thread_classes && self.class_tier(index) == tier,
                |_, addr| {
                    let freed = self.file_back(strategy, addr);
                    debug_assert!(freed.is_some(), "a cached block belongs to the tier of its size");
                },
            );
        }
        strategy.allocate(rounded)
    }

    /// Counts `bytes` about to be asked of the device as committed, raising the high-water mark;
    /// out of memory, counting nothing, when that would pass the cap.
    fn commit(&self, bytes: u64) -> Result<()> {
        let before = self.committed.fetch_add(bytes, Relaxed);
        if before.saturating_add(bytes) > self.cap.load(Relaxed) {
            self.committed.fetch_sub(bytes, Relaxed);
            return Err(DeviceError::OutOfMemory.into());
        }
        self.committed_high.fetch_max(before + bytes, Relaxed);
        Ok(())
    }

    /// A new segment of `size` bytes from the device, within the cap.
    fn grow(&self, size: u64, stream: StreamId) -> Result<u64> {
        self.commit(size)?;
        self.counters.num_device_alloc.fetch_add(1, Relaxed);
        match self.device.alloc_segment(size) {
            Ok(base) => {
                self.counters.reserved_bytes.add(size);
                self.counters.segment.add(1);
                self.log(EventKind::SegmentAlloc, base, size, stream);
                Ok(base)
            }
            Err(e) => {
                self.committed.fetch_sub(size, Relaxed);
                Err(e.into())
            }
        }
    }

    /// Grows the arena's expandable segment so that a block of `rounded` bytes fits: maps part of
    /// an unmapped hole again where that maps no more than growing at the end would, else maps
    /// chunks at the end of the newest range (reserving a larger range when it is full). Ok(false)
    /// when no range can take it (reserving failed, or the block is larger than any range may
    /// be): the caller adds a plain segment. Runs under the tier's strategy lock.
    fn grow_expandable(&self, vm: &Expandable, strategy: &mut dyn Strategy, stream: StreamId, rounded: u64) -> Result<bool> {
        let unit = vm.unit;
        vm.with_arena(stream, |arena| {
            if arena.unavailable {
                return Ok(false);
            }
            let unmapped = |r: &Reservation, range: Segment| r.gaps(range).iter().map(|g| g.size).sum::<u64>();
            let plans: Vec<_> = arena.reservations.iter().map(|r| strategy.plan_growth(r.base, rounded, unit, &|range| unmapped(r, range))).collect();
            // The cheapest hole to map again, in any range.
            let mut hole: Option<(usize, Segment, u64)> = None;
            for (i, h) in plans.iter().enumerate().filter_map(|(i, p)| Some((i, p.as_ref()?.hole?))) {
                let cost = unmapped(&arena.reservations[i], h);
                if hole.is_none_or(|(_, best, c)| (cost, h.size) < (c, best.size)) {
                    hole = Some((i, h, cost));
                }
            }
            // Growth at the end of the newest range, if it has room.
            let newest = arena.reservations.len().checked_sub(1);
            let at_end = newest.and_then(|i| {
                let r = &arena.reservations[i];
                let grow = match plans[i] {
                    Some(plan) => plan.at_end,
                    None if r.extent == 0 => round_up(rounded, unit)?,
                    None => return None, // the strategy lost the segment: leave this range be
                };
                let fits = r.extent.checked_add(grow).is_some_and(|end| end <= r.size);
                fits.then_some((i, Segment { base: r.base + r.extent, size: grow }))
            });
            let (i, range, into_hole) = match (hole, at_end) {
                (Some((i, h, cost)), end) if end.is_none_or(|(j, e)| cost <= unmapped(&arena.reservations[j], e)) => (i, h, true),
                (_, Some((i, end))) => (i, end, false),
                (_, None) => {
                    // The newest range is full (or there is none): reserve a larger one.
                    let Some(size) = vm.next_reservation(arena.reservations.last().map(|r| r.size), rounded) else {
                        return Ok(false);
                    };
                    match self.device.reserve(size) {
                        Ok(base) if base % unit == 0 => arena.reservations.push(Reservation::new(base, size)),
                        other => {
                            if let Ok(base) = other {
                                let _ = self.device.unreserve(base, size);
                            }
                            // No more address space (or the device cannot reserve): plain
                            // segments from now on.
                            arena.unavailable = true;
                            return Ok(false);
                        }
                    }
                    let Some(grow) = round_up(rounded, unit) else { return Ok(false) };
                    (arena.reservations.len() - 1, Segment { base: arena.reservations[arena.reservations.len() - 1].base, size: grow }, false)
                }
            };
            let r = &mut arena.reservations[i];
            let mapped = self.map_range(r, range, unit, stream);
            let taken = mapped.is_ok() && if into_hole { strategy.map_hole(range) } else { strategy.grow_segment(r.base, range.size) };
            if taken {
                if !into_hole {
                    r.extent += range.size;
                }
                return Ok(true);
            }
            if mapped.is_ok() {
                debug_assert!(false, "the strategy refused memory mapped for it");
                let mappings = r.mappings_within(range.base, range.base + range.size);
                self.unmap_ranges(r, mappings, stream);
            }
            // A range reserved just now with nothing mapped goes back at once.
            if r.extent == 0 && r.is_unmapped() && self.device.unreserve(r.base, r.size).is_ok() {
                arena.reservations.remove(i);
            }
            mapped.map(|()| false)
        })
    }

    /// Maps what `range` (whole units) lacks, within the cap, in at most `MAPS_PER_GROWTH`
    /// pieces per unmapped part, each at least a `PIECES_PER_HIGH_WATER`th of the high-water mark
    /// (see `expandable::pieces`). On a failure, unmaps what it mapped and returns the error.
    fn map_range(&self, r: &mut Reservation, range: Segment, unit: u64, stream: StreamId) -> Result<()> {
        let least = self.committed_high.load(Relaxed) / PIECES_PER_HIGH_WATER;
        let gaps: Vec<Segment> = r.gaps(range).into_iter().flat_map(|gap| pieces(gap, unit, least)).collect();
        let total: u64 = gaps.iter().map(|g| g.size).sum();
        self.commit(total)?;
        for (k, &gap) in gaps.iter().enumerate() {
            self.counters.num_device_alloc.fetch_add(1, Relaxed);
            if let Err(e) = self.device.map(gap.base, gap.size) {
                self.committed.fetch_sub(gaps[k..].iter().map(|g| g.size).sum::<u64>(), Relaxed);
                self.unmap_ranges(r, gaps[..k].to_vec(), stream);
                return Err(e.into());
            }
            if r.is_unmapped() {
                self.counters.segment.add(1);
            }
            r.note_mapped(gap);
            self.counters.reserved_bytes.add(gap.size);
            self.log(EventKind::SegmentAlloc, gap.base, gap.size, stream);
        }
        Ok(())
    }

    /// Unmaps `mappings` (whole mappings of `r`); returns the bytes given back, the mappings that
    /// failed to unmap (they stay mapped and counted) and the first error.
    fn unmap_ranges(&self, r: &mut Reservation, mappings: Vec<Segment>, stream: StreamId) -> (u64, Vec<Segment>, Option<DeviceError>) {
        let (mut bytes, mut kept, mut first_error) = (0, Vec::new(), None);
        for m in mappings {
            self.counters.num_device_free.fetch_add(1, Relaxed);
            match self.device.unmap(m.base, m.size) {
                Ok(()) => {
                    r.note_unmapped(m);
                    bytes += m.size;
                    self.committed.fetch_sub(m.size, Relaxed);
                    self.counters.reserved_bytes.sub(m.size);
                    self.log(EventKind::SegmentFree, m.base, m.size, stream);
                    if r.is_unmapped() {
                        self.counters.segment.sub(1);
                    }
                }
                Err(e) => {
                    kept.push(m);
                    first_error.get_or_insert(e);
                }
            }
        }
        (bytes, kept, first_error)
    }

    /// Unmaps the mappings among `chosen` (spares of this stream's expandable tier): each becomes
    /// a hole in the strategy, the hole at a range's end is cut off, and a range with nothing
    /// mapped is unreserved. A mapping that fails to unmap stays mapped, as free space. Runs
    /// under the tier's strategy lock, device calls included: a growth could otherwise take
    /// memory as mapped while it is unmapped.
    fn unmap_spares(&self, vm: &Expandable, strategy: &mut dyn Strategy, stream: StreamId, chosen: &[Spare]) -> (u64, Option<DeviceError>) {
        vm.with_arena(stream, |arena| {
            let (mut bytes, mut first_error) = (0, None);
            arena.reservations.retain_mut(|r| {
                let end = r.base + r.extent;
                // Another give-back may have unmapped a spare since it was chosen.
                let mine: Vec<Segment> = chosen.iter().filter(|s| s.reservation == Some(r.base) && r.has_mapping(s.range)).map(|s| s.range).collect();
                if mine.is_empty() {
                    r.extent -= strategy.cut_unmapped_tail(r.base);
                    return true;
                }
                let (inside, past_end): (Vec<Segment>, Vec<Segment>) = mine.into_iter().partition(|m| m.base < end);
                let mut mappings = strategy.unmap_free_ranges(r.base, &inside);
                mappings.extend(past_end);
                let (unmapped, kept, error) = self.unmap_ranges(r, mappings, stream);
                for m in kept.into_iter().filter(|m| m.base < end) {
                    let restored = strategy.map_hole(m);
                    debug_assert!(restored, "a mapping just made a hole is one");
                }
                bytes += unmapped;
                if let Some(e) = error {
                    first_error.get_or_insert(e);
                }
                r.extent -= strategy.cut_unmapped_tail(r.base);
                if r.extent != 0 || !r.is_unmapped() {
                    return true;
                }
                match self.device.unreserve(r.base, r.size) {
                    Ok(()) => false,
                    Err(e) => {
                        first_error.get_or_insert(e);
                        true
                    }
                }
            });
            (bytes, first_error)
        })
    }

    /// Counts a block handed out from a thread cache.
    fn count_alloc(cache: &PoolCache, block: &LiveBlock) {
        let counters = cache.counters();
        counters.bump_owned(Fast::AllocatedIn, block.size);
        counters.bump_owned(Fast::RequestedIn, block.requested);
        counters.bump_owned(Fast::BlocksIn, 1);
    }

    fn count_free(cache: &PoolCache, block: &LiveBlock) {
        let counters = cache.counters();
        counters.bump_owned(Fast::AllocatedOut, block.size);
        counters.bump_owned(Fast::RequestedOut, block.requested);
        counters.bump_owned(Fast::BlocksOut, 1);
    }

    fn hand_out(&self, addr: u64, block: LiveBlock, cache_hit: bool) -> u64 {
        let counts = [
            (Fast::AllocatedIn, block.size),
            (Fast::RequestedIn, block.requested),
            (Fast::BlocksIn, 1),
            (Fast::Misses, u64::from(!cache_hit)),
        ];
        self.count(&counts, block.size);
        self.record_live(addr, block)
    }

    /// Enters a handed-out block in the live table (or its overflow map), the event log, and
    /// (when leaks are tracked) the birth times.
    #[inline(always)]
    fn record_live(&self, addr: u64, block: LiveBlock) -> u64 {
        if self.log.is_some() || self.births.is_some() {
            self.record_birth(addr, block);
        }
        self.insert_live(addr, block);
        addr
    }

    /// Enters a live block in the table (reviving its parked slot when it comes from a cache), or
    /// in the overflow map when its slot is taken.
    #[inline(never)]
    fn insert_live(&self, addr: u64, block: LiveBlock) {
        if !self.live.revive(addr, block) && !self.live.insert(addr, block) {
            self.overflow.pin_owned().insert(addr, block);
        }
    }

    #[cold]
    fn record_birth(&self, addr: u64, block: LiveBlock) {
        self.log(EventKind::Alloc, addr, block.size, StreamId(block.stream));
        if let Some(births) = &self.births {
            births.pin_owned().insert(addr, self.now_ns());
        }
    }

    /// Makes a freed block reusable on its own stream: into this thread's cache, a magazine, or
    /// back to its strategy. `just_freed` counts the free itself too (else `free` counted it when
    /// it deferred the block).
    /// With `scrub: on_free` the block is zero-filled first; one the device fails to fill is
    /// never handed out again (it stays taken in its strategy until the pool is dropped).
    #[inline(always)]
    fn give_back(&self, addr: u64, block: LiveBlock, just_freed: bool) {
        let counts = [
            (Fast::AllocatedOut, block.size * u64::from(just_freed)),
            (Fast::RequestedOut, block.requested * u64::from(just_freed)),
            (Fast::BlocksOut, u64::from(just_freed)),
            (Fast::PendingOut, block.size * u64::from(!just_freed)),
        ];
        if self.config.scrub == Scrub::OnFree && self.device.fill_zero(addr, block.size, StreamId(block.stream)).is_err() {
            self.count(&counts, 0);
            return;
        }
        let class = block.cache_index();
        let cached = self.with_thread_cache(|c| {
            counts.iter().for_each(|&(which, n)| c.counters().bump_owned(which, n));
            class.is_some_and(|index| index < self.thread_classes && thread_cache::push(c, block.stream, index, block.size, addr))
        });
        match cached {
            Some(true) => return,
            Some(false) => {}
            None => counts.iter().for_each(|&(which, n)| self.counters.fast.bump_shared(which, n)),
        }
        let arena = self.arena(StreamId(block.stream));
        if let Some(index) = class {
            if arena.magazines.push(index, addr) {
                if index >= self.thread_classes {
                    arena.note_large_cached(block.tier);
                }
                return;
            }
        }
        let freed = self.file_back(&mut **arena.tiers[block.tier as usize].lock(), addr);
        debug_assert_eq!(freed, Some(block.size), "a live block must go back to the strategy that made it");
    }

    /// Frees a block that no one uses (cached, or just freed) in its strategy, which may split or
    /// merge it or hand the address out again at another size: the block's parked slot in the
    /// live table is freed first. Returns what the strategy freed.
    fn file_back(&self, strategy: &mut dyn Strategy, addr: u64) -> Option<u64> {
        self.live.unpark(addr);
        strategy.free(addr)
    }

    /// One event on each of `users`; on a failure, the ones already recorded are released.
    fn record_events(&self, users: &[StreamId]) -> Result<Vec<EventId>> {
        let mut events = Vec::with_capacity(users.len());
        for &s in users {
            match self.device.record_event(s) {
                Ok(e) => events.push(e),
                Err(err) => {
                    events.into_iter().for_each(|e| self.device.release_event(e));
                    return Err(err.into());
                }
            }
        }
        Ok(events)
    }

    /// Undoes the removal of a block whose free failed: live again, with its recorded streams.
    #[cold]
    fn restore_live(&self, addr: u64, block: LiveBlock, recorded: Vec<StreamId>) {
        self.insert_live(addr, block);
        if !recorded.is_empty() {
            let mut map = self.recorded.lock();
            map.insert(addr, recorded);
            self.gate.set(FastGate::RECORDED, true);
        }
    }

    fn defer_free(&self, addr: u64, block: LiveBlock, events: Vec<EventId>) {
        self.counters.deferred_frees.fetch_add(1, Relaxed);
        let mut deferred = self.deferred.lock();
        deferred.push(DeferredFree { addr, block, events });
        self.gate.set(FastGate::DEFERRED, true);
    }

    /// Gives back the deferred frees whose events have all completed.
    #[inline]
    fn complete_deferred_frees(&self) {
        if self.gate.any(FastGate::DEFERRED) {
            self.complete_ready_deferred_frees();
        }
    }

    #[cold]
    fn complete_ready_deferred_frees(&self) {
        let ready: Vec<DeferredFree> = {
            let mut deferred = self.deferred.lock();
            let (ready, waiting) = std::mem::take(&mut *deferred)
                .into_iter()
                .partition(|d| d.events.iter().all(|&e| self.device.event_done(e).unwrap_or(false)));
            *deferred = waiting;
            self.gate.set(FastGate::DEFERRED, !deferred.is_empty());
            ready
        };
        for d in ready {
            d.events.iter().for_each(|&e| self.device.release_event(e));
            self.give_back(d.addr, d.block, false);
        }
    }

    /// Runs `f` on this thread's cache for this pool; None when the thread has none (it is
    /// exiting, or thread caches are off: see `thread_cache::with_pool_cache`).
    fn with_thread_cache<R>(&self, f: impl FnOnce(&PoolCache) -> R) -> Option<R> {
        let register = || self.counters.fast.register();
        let enlist = |cache| self.thread_caches.lock().push(cache);
        let handle = PoolHandle { id: self.id, owner: &self.this, register: &register, enlist: &enlist };
        thread_cache::with_pool_cache(&handle, f)
    }

    /// Adds to this thread's counters (the shared ones when it has none), and updates the peaks
    /// after every `PEAK_SLACK` bytes this thread allocated.
    fn count(&self, updates: &[(Fast, u64)], allocated: u64) {
        let due = self.with_thread_cache(|c| {
            updates.iter().for_each(|&(which, n)| c.counters().bump_owned(which, n));
            allocated > 0 && c.note_allocated(allocated)
        });
        if due.is_none() {
            updates.iter().for_each(|&(which, n)| self.counters.fast.bump_shared(which, n));
        }
        if due.unwrap_or(allocated > 0) {
            self.counters.fast.checkpoint();
        }
    }

    #[inline(always)]
    fn cache_class(&self, size: u64, tier: u8) -> Option<usize> {
        cache_class(&self.config, &self.default_arena, self.thread_classes, size, tier)
    }

    /// The tier whose blocks of class `index` are cached (see `cache_class`).
    fn class_tier(&self, index: usize) -> u8 {
        self.tier_of(class_size(index))
    }

    fn live_block(&self, addr: u64) -> Option<LiveBlock> {
        self.live.get(addr).or_else(|| self.overflow.pin_owned().get(&addr).copied())
    }

    fn take_recorded_streams(&self, addr: u64) -> Vec<StreamId> {
        if !self.gate.any(FastGate::RECORDED) {
            return Vec::new();
        }
        let mut recorded = self.recorded.lock();
        let users = recorded.remove(&addr).unwrap_or_default();
        self.gate.set(FastGate::RECORDED, !recorded.is_empty());
        users
    }

    /// Empties every thread's cache and the magazines into their strategies, then gives every
    /// wholly free segment back and unmaps every wholly free expandable chunk.
    fn release_free(&self) -> Result<u64> {
        self.flush_caches();
        self.give_back_free(None, u64::MAX)
    }

    /// Gives back to the device wholly free segments and wholly free mappings of the expandable
    /// ranges, in every tier and stream: all of them for a `need` of `u64::MAX`, else enough for
    /// `need` bytes (see `choose_spares`). Before the growth of `growing` (a stream's tier), that
    /// tier's newest expandable range keeps its free tail, which the growth extends. The caches
    /// keep their blocks: see `release_free`.
    fn give_back_free(&self, growing: Option<(StreamId, u8)>, need: u64) -> Result<u64> {
        let mut chosen = choose_spares(self.spares(growing), need);
        chosen.sort_unstable_by_key(|s| (s.stream, s.tier, s.reservation, s.range.base));
        let (mut bytes, mut first_error) = (0, None);
        let mut released = Vec::new();
        for group in chosen.chunk_by(|a, b| (a.stream, a.tier) == (b.stream, b.tier)) {
            let (stream, tier) = (group[0].stream, group[0].tier);
            let arena = self.arena(stream);
            let mut strategy = arena.tiers[tier as usize].lock();
            let plain: Vec<Segment> = group.iter().filter(|s| s.reservation.is_none()).map(|s| s.range).collect();
            released.extend(strategy.release_segments(&plain).into_iter().map(|s| (s, stream)));
            if let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier) {
                let (unmapped, error) = self.unmap_spares(vm, &mut **strategy, stream, group);
                bytes += unmapped;
                if let Some(e) = error {
                    first_error.get_or_insert(e);
                }
            }
        }
        for (segment, stream) in released {
            self.counters.num_device_free.fetch_add(1, Relaxed);
            match self.device.free_segment(segment.base, segment.size) {
                Ok(()) => {
                    bytes += segment.size;
                    self.committed.fetch_sub(segment.size, Relaxed);
                    self.counters.reserved_bytes.sub(segment.size);
                    self.counters.segment.sub(1);
                    self.log(EventKind::SegmentFree, segment.base, segment.size, stream);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => Ok(bytes),
            Some(e) => Err(e.into()),
        }
    }

    /// Everything a give-back could return: every tier's wholly free segments, and the mappings
    /// of the expandable ranges that lie wholly in free space (or past the range's end, where an
    /// unmap failed), less the free tail of the newest range of `growing`.
    fn spares(&self, growing: Option<(StreamId, u8)>) -> Vec<Spare> {
        let mut spares = Vec::new();
        self.for_each_arena(|arena| {
            let stream = arena.stream;
            for (index, tier) in arena.tiers.iter().enumerate() {
                let tier_index = index as u8;
                let strategy = tier.lock();
                spares.extend(strategy.free_segments().into_iter().map(|range| Spare { stream, tier: tier_index, range, reservation: None }));
                let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier_index) else { continue };
                let grows = growing == Some((stream, tier_index));
                vm.with_arena(stream, |vm_arena| {
                    let newest = vm_arena.reservations.last().map(|r| r.base);
                    for r in &vm_arena.reservations {
                        let end = r.base + r.extent;
                        let mut free = strategy.unused_ranges(r.base);
                        if grows && newest == Some(r.base) && free.last().is_some_and(|f| f.base + f.size == end) {
                            free.pop();
                        }
                        free.push(Segment { base: end, size: r.base + r.size - end });
                        let mappings = free.iter().flat_map(|f| r.mappings_within(f.base, f.base + f.size));
                        spares.extend(mappings.map(|range| Spare { stream, tier: tier_index, range, reservation: Some(r.base) }));
                    }
                });
            }
        });
        spares
    }

    /// Gives the completed deferred frees, every thread's cache (busy, idle or exiting) and the
    /// magazines back to their strategies.
    fn flush_caches(&self) {
        self.complete_deferred_frees();
        // Cached blocks keep their slabs from being wholly free: on the demo's traces, slab
        // segments holding only cached blocks were most of what hybrid reserved above the bound.
        let _one_flush = self.flushing.lock();
        let blocks = thread_cache::take_all(&self.thread_caches.lock());
        self.adopt(blocks);
        self.for_each_arena(|arena| {
            arena.magazines.drain(
                |_| true,
                |index, addr| {
                    let freed = self.file_back(&mut **arena.tiers[self.class_tier(index) as usize].lock(), addr);
                    debug_assert!(freed.is_some(), "a cached block belongs to the tier of its size");
                },
            );
        });
    }

    /// The largest free range of any strategy, and the bytes of all their free ranges.
    fn free_ranges(&self) -> (u64, u64) {
        let (mut largest, mut bytes) = (0, 0);
        self.for_each_arena(|arena| {
            for tier in arena.tiers.iter() {
                let usage = tier.lock().usage();
                largest = largest.max(usage.largest_free);
                bytes += usage.reserved.saturating_sub(usage.allocated);
            }
        });
        (largest, bytes)
    }

    fn oom_report(&self, requested: u64) -> OomReport {
        let stats = self.stats();
        OomReport {
            requested,
            allocated: stats.allocated_bytes.current,
            reserved: stats.reserved_bytes.current,
            largest_free: stats.largest_free_bytes,
            device_free: self.device.mem_info().map(|m| m.free).unwrap_or(0),
            limit: self.config.limit.is_some().then(|| self.capacity()),
        }
    }

    /// Zero-fills a block just handed out (`scrub: on_alloc`); when the device fails to, the
    /// block is freed again and the error returned.
    #[cold]
    fn scrub_new_block(&self, addr: u64) -> Result<()> {
        let Some(block) = self.live_block(addr) else { return Ok(()) };
        if let Err(e) = self.device.fill_zero(addr, block.size, StreamId(block.stream)) {
            let _ = self.free(addr, None, None);
            return Err(e.into());
        }
        Ok(())
    }

    // ---- small helpers ----

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn ensure_open(&self) -> Result<()> {
        self.check_process()?;
        match self.gate.any(FastGate::CLOSED) {
            true => Err(PoolError::Closed),
            false => Ok(()),
        }
    }

    /// `Forked` in a process forked after the pool was made (see `fork.rs`), where its locks
    /// and caches may be held by threads that do not exist: callers of the methods that do not
    /// check (`stats`, `snapshot`, ...) check first.
    pub fn check_process(&self) -> Result<()> {
        match crate::fork::forked_since(self.generation) {
            true => Err(PoolError::Forked),
            false => Ok(()),
        }
    }

    /// The size the strategies see: aligned, optionally padded to a bucket; refuses 0 and sizes
    /// no segment could hold.
    fn round_request(&self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(PoolError::InvalidSize { size, reason: "zero bytes requested" });
        }
        let cap = self.capacity();
        match self.config.padded(size) {
            Some(rounded) if rounded > cap => Err(PoolError::InvalidSize { size, reason: "larger than the pool may ever reserve" }),
            Some(rounded) if rounded > MAX_REQUEST => Err(PoolError::InvalidSize { size, reason: "larger than one block can be (128 TiB)" }),
            Some(rounded) => Ok(rounded),
            None => Err(PoolError::InvalidSize { size, reason: "larger than the pool may ever reserve" }),
        }
    }

    #[inline(always)]
    fn tier_of(&self, rounded: u64) -> u8 {
        self.config.tier_of(rounded)
    }

    fn arena(&self, stream: StreamId) -> ArenaRef<'_> {
        if stream == StreamId(0) {
            return ArenaRef::Default(&self.default_arena);
        }
        let map = self.arenas.pin_owned();
        // Arenas are never removed, so the reference stays valid for the pool's life; the guard
        // keeps papaya from reclaiming it meanwhile.
        if map.get(&stream).is_none() {
            map.get_or_insert_with(stream, || new_arena(&self.config, stream));
        }
        ArenaRef::Stream(map, stream)
    }

    fn for_each_arena(&self, mut f: impl FnMut(&Arena)) {
        f(&self.default_arena);
        for (_, arena) in self.arenas.pin_owned().iter() {
            f(arena);
        }
    }

    #[inline(always)]
    fn log(&self, kind: EventKind, addr: u64, size: u64, stream: StreamId) {
        if let Some(log) = &self.log {
            Self::log_in(log, kind, addr, size, stream);
        }
    }

    #[cold]
    fn log_in(log: &EventLog, kind: EventKind, addr: u64, size: u64, stream: StreamId) {
        log.push(kind, addr, size, stream);
    }
}

/// An arena: the default one, or one held through a papaya guard.
enum ArenaRef<'a> {
    Default(&'a Arena),
    Stream(papaya::HashMapRef<'a, StreamId, Arena, FixedState, papaya::OwnedGuard<'a>>, StreamId),
}

impl std::ops::Deref for ArenaRef<'_> {
    type Target = Arena;
    fn deref(&self) -> &Arena {
        match self {
            Self::Default(a) => a,
            Self::Stream(map, stream) => map.get(stream).expect("arenas are never removed"),
        }
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
        let mut segments = Vec::new();
        self.for_each_arena(|arena| {
            for tier in arena.tiers.iter() {
                segments.extend(tier.lock().snapshot().into_iter().map(|(s, _)| s));
            }
        });
        for e in std::mem::take(&mut *self.deferred.lock()) {
            e.events.into_iter().for_each(|ev| self.device.release_event(ev));
        }
        let reservations = self.vm.as_ref().map(Expandable::take_all).unwrap_or_default();
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

/// Memory a give-back can return to the device: a wholly free plain segment of a tier, or a
/// wholly free mapping of the tier's expandable range at `reservation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spare {
    stream: StreamId,
    tier: u8,
    range: Segment,
    reservation: Option<u64>,
}

/// The spares to give back for `need` bytes: every one for `u64::MAX`; else, until the need is
/// met, the smallest spare that meets what is still needed, or the largest one if none does.
/// Design: a give-back is for the peak, and giving back more than the growth needs cannot lower
/// it; what stays reserved is reused without device calls, and each call gives back the most it
/// can.
fn choose_spares(mut spares: Vec<Spare>, need: u64) -> Vec<Spare> {
    if need == u64::MAX {
        return spares;
    }
    // Largest first; ties in a fixed order, so that replays are deterministic.
    spares.sort_unstable_by_key(|s| (std::cmp::Reverse(s.range.size), s.stream, s.tier, s.range.base));
    let mut chosen = Vec::new();
    let mut still = need;
    while still > 0 && !spares.is_empty() {
        // The last spare (the smallest) of those that meet the need, else the first (the largest).
        let meets = spares.partition_point(|s| s.range.size >= still);
        let spare = spares.remove(meets.saturating_sub(1));
        still = still.saturating_sub(spare.range.size);
        chosen.push(spare);
    }
    chosen
}

fn cap_for(limit: Option<Limit>, device_total: u64) -> u64 {
    match limit {
        None => device_total,
        Some(Limit::Bytes(b)) => b.min(device_total),
        Some(Limit::Fraction(f)) => (device_total as f64 * f) as u64,
    }
}

pub(crate) fn new_arena(config: &PoolConfig, stream: StreamId) -> Arena {
    let slab = || Box::new(Slab::new(SlabConfig { max_size: config.small_max, ..SlabConfig::default() })) as Box<dyn Strategy>;
    let best_fit = || Box::new(BestFit::new(BestFitConfig::default())) as Box<dyn Strategy>;
    let buddy = || Box::new(Buddy::new(BuddyConfig::default())) as Box<dyn Strategy>;
    // The hybrid's large tier keeps buddy's halving and merging but cuts each block to the
    // request, so a large tensor costs at most one `large_unit` more than its size.
    let large = || {
        let min_order = config.large_unit().trailing_zeros();
        let trimmed = BuddyConfig { min_order, max_order: min_order + 26, min_segment_order: 21, trim: true };
        Box::new(Buddy::new(trimmed)) as Box<dyn Strategy>
    };
    let tiers = match config.strategy {
        StrategyKind::Hybrid => vec![slab(), best_fit(), large()],
        StrategyKind::Slab => vec![slab()],
        StrategyKind::BestFit => vec![best_fit()],
        StrategyKind::Buddy => vec![buddy()],
    };
    Arena::new(stream, tiers)
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes::MIB;

    fn spare(size_mib: u64, base: u64) -> Spare {
        Spare { stream: StreamId(0), tier: 1, range: Segment { base: base * MIB, size: size_mib * MIB }, reservation: None }
    }

    fn sizes(chosen: &[Spare]) -> Vec<u64> {
        chosen.iter().map(|s| s.range.size / MIB).collect()
    }

    #[test]
    fn spares_for_a_need_are_the_smallest_that_covers_it_else_the_largest_first() {
        let all = vec![spare(8, 0), spare(2, 100), spare(32, 200), spare(2, 300), spare(4, 400)];
        assert_eq!(sizes(&choose_spares(all.clone(), 3 * MIB)), vec![4], "4 MiB covers 3, 8 and 32 are more than needed");
        assert_eq!(sizes(&choose_spares(all.clone(), 8 * MIB)), vec![8]);
        assert_eq!(sizes(&choose_spares(all.clone(), 40 * MIB)), vec![32, 8]);
        assert_eq!(sizes(&choose_spares(all.clone(), 45 * MIB)), vec![32, 8, 4, 2], "the last 1 MiB: a 2 MiB spare");
        assert_eq!(sizes(&choose_spares(all.clone(), 100 * MIB)), vec![32, 8, 4, 2, 2], "all of them, short of the need");
        assert!(choose_spares(all.clone(), 0).is_empty());
        assert_eq!(choose_spares(all.clone(), u64::MAX), all, "everything, for a trim");
        // Of equal spares, the same one whatever the order they come in: replays are deterministic.
        let reversed: Vec<Spare> = all.iter().rev().copied().collect();
        assert_eq!(choose_spares(all, MIB), choose_spares(reversed, MIB));
    }
}
