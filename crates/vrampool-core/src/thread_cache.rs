//! Per-thread caches of freed small blocks and per-thread counters: the part of the fast path
//! that touches no shared memory at all (the live-block table's compare-and-swap aside).
//!
//! A thread keeps, for each pool and stream it used, a short LIFO list per size class (the default
//! stream's inline, so that a hit follows as few pointers as glibc's tcache). A block
//! freed on a thread goes to that thread's list for the block's own stream, so stream ordering is
//! unchanged. The lists are bounded (`CLASS_BYTES` per class); what does not fit goes to the
//! shared magazines.
//!
//! The pool keeps a handle on every thread's cache (`CacheOfThread`), so that a trim, a growth
//! or an out-of-memory retry takes the blocks of every thread's cache at once, also of a thread
//! that stays idle or has finished its work but not yet run its thread-local destructors. The
//! lists sit in a `StealCell`: their owner uses them with plain stores, and a trim takes them
//! over for a moment. A thread that exits gives its lists back itself.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use foldhash::fast::FixedState;

use crate::barrier;
use crate::stats::LocalCounters;
use crate::steal_cell::{steal_each, Owned, StealCell};

/// The stream whose lists are inline in the cache: the default stream, the one most threads use
/// only.
pub const HOME_STREAM: u64 = 0;

/// Each thread caches at most about this many bytes per size class and stream.
const CLASS_BYTES: u64 = 32 * 1024;
const CLASS_MIN_DEPTH: usize = 2;

/// The pool side of a thread cache: what the thread needs to give its blocks back.
pub trait CacheOwner: Send + Sync {
    /// Takes back blocks from a thread cache: (stream, addr) pairs.
    fn adopt(&self, blocks: Vec<(u64, u64)>);
    /// Folds an exiting thread's counters into the pool's and forgets its cache.
    fn retire(&self, cache: &Arc<PoolCache>);
}

/// The most classes a thread caches: those up to 64 MiB, the largest `small_max`.
const MAX_CLASSES: usize = 64;

struct StreamCache {
    stream: u64,
    /// Block addresses per size class index, inline: a cache hit follows two pointers (to the
    /// thread's cache, then to the class's list), as glibc's tcache does.
    classes: [Vec<u64>; MAX_CLASSES],
}

impl StreamCache {
    fn new(stream: u64) -> Self {
        Self { stream, classes: std::array::from_fn(|_| Vec::new()) }
    }
}

/// One thread's cached blocks for one pool.
struct Lists {
    /// The default stream's (the stream most threads use only), and the other streams'.
    home: StreamCache,
    others: Vec<StreamCache>,
    /// Where each other stream's lists are in `others`.
    slots: HashMap<u64, usize, FixedState>,
}

impl Lists {
    /// Takes every block out. Only the home stream's lists stay: the others' are made again at
    /// their stream's next push, so that a take (one at each growth) costs the streams used
    /// since the last one, not every stream the thread ever used.
    fn take_all(&mut self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for sc in std::iter::once(&mut self.home).chain(&mut self.others) {
            for list in &mut sc.classes {
                out.extend(list.drain(..).map(|addr| (sc.stream, addr)));
            }
        }
        self.others.clear();
        self.slots.clear();
        out
    }

    #[inline(always)]
    fn stream(&mut self, stream: u64) -> &mut StreamCache {
        if self.home.stream == stream {
            return &mut self.home;
        }
        self.other_stream(stream)
    }

    #[cold]
    fn other_stream(&mut self, stream: u64) -> &mut StreamCache {
        let next = self.others.len();
        let i = *self.slots.entry(stream).or_insert(next);
        if i == next {
            self.others.push(StreamCache::new(stream));
        }
        &mut self.others[i]
    }
}

/// One thread's state for one pool. Every `&PoolCache` this module hands out comes from the
/// calling thread's own `CURRENT` or `CACHES` (a `CacheOfThread` gives none out), so the thread
/// that holds one is the cache's owner: that is what its owner's sections (`StealCell::own`)
/// require.
pub struct PoolCache {
    pool_id: u64,
    owner: Weak<dyn CacheOwner>,
    counters: Arc<LocalCounters>,
    /// Bytes allocated since this thread last updated the pool's peaks (owner only).
    since_checkpoint: Cell<u64>,
    /// The owning thread (`this_thread`).
    thread: usize,
    lists: StealCell<Lists>,
    /// The lane this thread allocates in, on every stream (`pool/lanes.rs`; owner only).
    lane: Cell<u8>,
    /// Allocations that found their tier's lock taken since `window` began (owner only).
    contended: Cell<u32>,
    /// When the count of contended allocations began, in the pool's nanoseconds (owner only).
    window: Cell<u64>,
}

// SAFETY: other threads reach a cache only through a `CacheOfThread`, which touches nothing but
// `lists`, a `StealCell`; `since_checkpoint`, `lane`, `contended` and `window`, the fields that
// are not thread-safe, are used by the owner only (see the type's doc).
unsafe impl Sync for PoolCache {}

impl PoolCache {
    /// This thread's counters for the pool.
    #[inline(always)]
    pub fn counters(&self) -> &LocalCounters {
        &self.counters
    }

    pub fn counters_arc(&self) -> &Arc<LocalCounters> {
        &self.counters
    }

    /// The lists, for the owner's section that lasts as long as the guard; None while a trim has
    /// them.
    #[inline(always)]
    pub fn lists(&self) -> Option<OwnLists<'_>> {
        // SAFETY: the owner calls (type doc); the guard borrows the cache, and the fast paths
        // that hold it call nothing that reaches the cache (`current_unmarked`).
        unsafe { self.lists.own() }.map(OwnLists)
    }

    /// Caches a block of class `index` for the default stream, if its list has room without
    /// growing (a list not made yet has none: its first push makes it, on the general path).
    #[inline(always)]
    pub fn push_home(&self, index: usize, addr: u64) -> bool {
        // SAFETY: the owner calls (type doc).
        let Some(mut lists) = (unsafe { self.lists.own() }) else { return false };
        match lists.home.classes.get_mut(index) {
            // `push` can't grow here: the fast path makes no call.
            Some(list) if list.len() < list.capacity() => {
                list.push(addr);
                true
            }
            _ => false,
        }
    }

    /// The lane this thread allocates in.
    #[inline(always)]
    pub fn lane(&self) -> u8 {
        self.lane.get()
    }

    /// Counts an allocation that found its tier's lock taken at `now`; true when this is the
    /// `count`th within `window` nanoseconds (and the count starts again).
    pub fn note_contention(&self, now: u64, count: u32, window: u64) -> bool {
        if now.saturating_sub(self.window.get()) > window {
            self.window.set(now);
            self.contended.set(0);
        }
        let n = self.contended.get() + 1;
        self.contended.set(if n >= count { 0 } else { n });
        n >= count
    }

    pub fn set_lane(&self, lane: u8) {
        self.lane.set(lane);
    }

    /// Counts `bytes` allocated; true when the pool's peaks are due for an update.
    #[inline(always)]
    pub fn note_allocated(&self, bytes: u64) -> bool {
        let since = self.since_checkpoint.get() + bytes;
        let due = since >= crate::stats::PEAK_SLACK;
        self.since_checkpoint.set(if due { 0 } else { since });
        due
    }
}

/// A thread's own lists, in a section (see `PoolCache::lists`).
pub struct OwnLists<'a>(Owned<'a, Lists>);

impl OwnLists<'_> {
    /// The default stream's list of class `index`.
    #[inline(always)]
    pub fn home(&mut self, index: usize) -> Option<&mut Vec<u64>> {
        self.0.home.classes.get_mut(index)
    }
}

/// A thread's cache as its pool keeps it: for taking its blocks from any thread.
pub struct CacheOfThread(Arc<PoolCache>);

impl CacheOfThread {
    pub fn is(&self, cache: &Arc<PoolCache>) -> bool {
        Arc::ptr_eq(&self.0, cache)
    }
}

/// Takes every block out of `caches`, as (stream, addr) pairs, whether their threads are busy,
/// idle or exiting; a cache that another trim has at the moment is left to it. Nothing is taken
/// where the barrier this needs is missing.
pub fn take_all(caches: &[CacheOfThread]) -> Vec<(u64, u64)> {
    let me = this_thread();
    let mut blocks = Vec::new();
    let all_mine = caches.iter().all(|c| c.0.thread == me);
    steal_each(caches.iter().map(|c| &c.0.lists), all_mine, |lists| blocks.extend(lists.take_all()));
    blocks
}

/// This thread's caches, one per pool it used. `CURRENT` points into one of the `Arc`s, which
/// stays put while the vector grows.
#[derive(Default)]
struct Caches(Vec<Arc<PoolCache>>);

impl Drop for Caches {
    fn drop(&mut self) {
        // The pointer must not outlive the cache; later calls (other thread-local destructors that
        // free blocks) then find no cache and count into the pool's shared counters.
        FAST.with(|f| f.current.set(std::ptr::null()));
        for cache in self.0.drain(..) {
            let Some(owner) = cache.owner.upgrade() else { continue };
            // SAFETY: this thread owns the cache, and no section is open: the thread is past
            // every call.
            let blocks = unsafe { cache.lists.own_waiting() }.take_all();
            owner.adopt(blocks);
            owner.retire(&cache);
        }
    }
}

thread_local! {
    static CACHES: UnsafeCell<Caches> = const { UnsafeCell::new(Caches(Vec::new())) };
    // No destructor, so it stays readable while the thread's other storage is torn down.
    static FAST: FastState = const { FastState { current: Cell::new(std::ptr::null()), busy: Cell::new(false) } };
}

/// What the fast path reads first, in one thread-local so that one address computation finds
/// both. `CURRENT` (`current`) is the cache used last (null when none); `BUSY` (`busy`) is set
/// while a call uses a cache.
struct FastState {
    current: Cell<*const PoolCache>,
    busy: Cell<bool>,
}

/// This thread, as an address unique among live threads (its `FAST`).
fn this_thread() -> usize {
    FAST.with(|f| f as *const FastState as usize)
}

/// This thread's cache for one pool, in use: `BUSY` is set while it lives (and cleared when it
/// goes, even by a panic), so that no other call of this thread reaches the cache meanwhile.
pub struct CacheRef {
    cache: *const PoolCache,
}

impl CacheRef {
    /// Takes the cache that `cache` points at. Only when nothing is busy, with `cache` from
    /// `CURRENT` or just found in `CACHES`.
    #[inline(always)]
    fn enter(cache: *const PoolCache) -> Self {
        // `with` rather than `LocalKey::set`, which LLVM does not always inline.
        FAST.with(|f| f.busy.set(true));
        Self { cache }
    }
}

impl std::ops::Deref for CacheRef {
    type Target = PoolCache;
    #[inline(always)]
    fn deref(&self) -> &PoolCache {
        // SAFETY: see `current_cache`: the cache outlives this guard.
        unsafe { &*self.cache }
    }
}

impl Drop for CacheRef {
    #[inline(always)]
    fn drop(&mut self) {
        FAST.with(|f| f.busy.set(false));
    }
}

/// What `with_pool_cache` needs to make a cache for a pool this thread has not used yet.
pub struct PoolHandle<'a> {
    pub id: u64,
    pub owner: &'a Weak<dyn CacheOwner>,
    pub register: &'a dyn Fn() -> Arc<LocalCounters>,
    /// Hands the pool its handle on the new cache.
    pub enlist: &'a dyn Fn(CacheOfThread),
}

/// Runs `f` on this thread's cache for the pool; None when thread-local storage is gone (the
/// thread is exiting), when the process cannot make the barrier that lets trims reach thread
/// caches (then there are none), or when called from inside another call's `f` (which must not
/// happen: `f` must not call back into the pool).
#[inline]
pub fn with_pool_cache<R>(pool: &PoolHandle<'_>, f: impl FnOnce(&PoolCache) -> R) -> Option<R> {
    match current_cache(pool.id) {
        Some(cache) => Some(f(&cache)),
        None if FAST.with(|f| f.busy.get()) => None,
        None => with_pool_cache_slow(pool, f),
    }
}

/// This thread's cache for the pool `pool_id`: None unless it is the cache this thread used last
/// and nothing is busy.
///
/// A non-null `CURRENT` points into an `Arc` that `CACHES` holds: those are dropped only by
/// `find_or_make` (whose caller sets `CURRENT` again before it returns) and by the destructor of
/// `CACHES` (which nulls `CURRENT` first). The `CacheRef` sets `BUSY` for its life, and
/// `find_or_make` runs only when nothing is busy.
#[inline(always)]
fn current_cache(pool_id: u64) -> Option<CacheRef> {
    // SAFETY: the reference becomes a pointer at once, and `CacheRef` marks the cache busy.
    let cache: *const PoolCache = unsafe { current_unmarked(pool_id) }?;
    Some(CacheRef::enter(cache))
}

/// This thread's cache for the pool `pool_id`, if it is the cache this thread used last and
/// nothing is busy. The fastest paths' way in: unlike `current_cache` it does not mark the cache
/// busy, which would cost two stores, and it never makes a cache.
///
/// # Safety
///
/// While the reference lives, the caller must not call anything that may use a thread cache (a
/// pool's methods, a drop that frees blocks or ends a pool): nothing marks the cache busy, so
/// such a call could open a section of the cache's lists inside another.
#[inline(always)]
pub unsafe fn current_unmarked<'a>(pool_id: u64) -> Option<&'a PoolCache> {
    let (busy, cache) = FAST.with(|f| (f.busy.get(), f.current.get()));
    if busy {
        return None;
    }
    // SAFETY: as the doc of `current_cache` says, a non-null `CURRENT` points at a live cache.
    let cache = unsafe { cache.as_ref() }?;
    (cache.pool_id == pool_id).then_some(cache)
}

#[cold]
fn with_pool_cache_slow<R>(pool: &PoolHandle<'_>, f: impl FnOnce(&PoolCache) -> R) -> Option<R> {
    let cache = CACHES.try_with(|caches| find_or_make(caches.get(), pool)).ok();
    let cache = cache.flatten().unwrap_or(std::ptr::null());
    FAST.with(|f| f.current.set(cache));
    if cache.is_null() {
        return None;
    }
    Some(f(&CacheRef::enter(cache)))
}

/// This thread's cache for the pool, made if the thread has none yet; None where thread caches
/// cannot be reached by other threads (no heavy barrier).
fn find_or_make(caches: *mut Caches, pool: &PoolHandle<'_>) -> Option<*const PoolCache> {
    // SAFETY: only this thread reaches its `CACHES`, and no reference into it is alive: callers
    // run this only when no call is busy, and `CURRENT` points into an `Arc`, not the vector.
    let caches = unsafe { &mut (*caches).0 };
    if let Some(cache) = caches.iter().find(|c| c.pool_id == pool.id) {
        return Some(Arc::as_ptr(cache));
    }
    // Forget caches of pools that are gone, then make this one.
    caches.retain(|c| c.owner.strong_count() > 0);
    if !barrier::available() {
        return None;
    }
    let cache = Arc::new(PoolCache {
        pool_id: pool.id,
        owner: pool.owner.clone(),
        counters: (pool.register)(),
        since_checkpoint: Cell::new(0),
        lane: Cell::new(0),
        contended: Cell::new(0),
        window: Cell::new(0),
        thread: this_thread(),
        lists: StealCell::new(Lists { home: StreamCache::new(HOME_STREAM), others: Vec::new(), slots: HashMap::default() }),
    });
    (pool.enlist)(CacheOfThread(Arc::clone(&cache)));
    let ptr = Arc::as_ptr(&cache);
    caches.push(cache);
    Some(ptr)
}

/// In a forked child: forgets this thread's caches without touching them (they belong to pools
/// of the parent, which refuse every call in the child) and leaks them, as dropping them would
/// give their blocks back through locks that a thread of the parent may have held.
pub fn forget_after_fork() {
    FAST.with(|f| {
        f.current.set(std::ptr::null());
        f.busy.set(false);
    });
    // SAFETY: only this thread reaches its `CACHES`, and the fork did not happen inside one of
    // its calls into a pool (nothing is busy), so no reference into it is alive.
    let _ = CACHES.try_with(|caches| std::mem::forget(std::mem::take(unsafe { &mut (*caches.get()).0 })));
}

/// Pops a cached block of class `index` for `stream`; None also while a trim has the lists.
#[inline(always)]
pub fn pop(cache: &PoolCache, stream: u64, index: usize) -> Option<u64> {
    // SAFETY: the owner calls (see `PoolCache`).
    let mut lists = unsafe { cache.lists.own() }?;
    lists.stream(stream).classes.get_mut(index)?.pop()
}

/// Caches a block of class `index` (of `class_size` bytes) for `stream`; false when full (or
/// while a trim has the lists).
#[inline(always)]
pub fn push(cache: &PoolCache, stream: u64, index: usize, class_size: u64, addr: u64) -> bool {
    // SAFETY: the owner calls (see `PoolCache`).
    let Some(mut lists) = (unsafe { cache.lists.own() }) else { return false };
    let sc = lists.stream(stream);
    let list = match sc.classes.get_mut(index) {
        Some(list) if list.capacity() > 0 => list,
        Some(_) => first_list(sc, index, class_size),
        None => return false,
    };
    if list.len() == list.capacity() {
        return false;
    }
    list.push(addr);
    true
}

/// The list of class `index`, made on its first push.
#[cold]
fn first_list(sc: &mut StreamCache, index: usize, class_size: u64) -> &mut Vec<u64> {
    let list = &mut sc.classes[index];
    // The depth is fixed per class: reserve it once, so the fast path needs no division.
    list.reserve_exact(((CLASS_BYTES / class_size) as usize).max(CLASS_MIN_DEPTH));
    list
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_take_leaves_only_the_home_streams_lists() {
        let mut lists = Lists { home: StreamCache::new(HOME_STREAM), others: Vec::new(), slots: HashMap::default() };
        for stream in 0..=100 {
            lists.stream(stream).classes[0].push(stream * 512);
        }
        assert_eq!(lists.stream(42).classes[0], vec![42 * 512], "each stream finds its own lists");
        assert_eq!(lists.take_all().len(), 101);
        // The next take costs the streams used since, not the hundred used before.
        assert!(lists.others.is_empty() && lists.slots.is_empty());
        assert!(lists.stream(42).classes[0].is_empty());
    }
}
