//! Per-thread caches of freed small blocks and per-thread counters: the part of the fast path
//! that touches no shared memory at all (the live-block table's compare-and-swap aside).
//!
//! A thread keeps, for each pool and stream it used, a short LIFO list per size class (the default
//! stream's inline, so that a hit follows as few pointers as glibc's tcache). A block
//! freed on a thread goes to that thread's list for the block's own stream, so stream ordering is
//! unchanged. The lists are bounded (`CLASS_BYTES` per class); what does not fit goes to the
//! shared magazines. A trim raises the pool's flush epoch: each thread empties its lists into the
//! pool at its next call, and a thread that exits gives its lists back at once.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use crate::stats::LocalCounters;

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
    /// Folds an exiting thread's counters into the pool's.
    fn retire_counters(&self, counters: &Arc<LocalCounters>);
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

/// One thread's state for one pool.
pub struct PoolCache {
    pool_id: u64,
    owner: Weak<dyn CacheOwner>,
    epoch: u64,
    counters: Arc<LocalCounters>,
    /// Bytes allocated since this thread last updated the pool's peaks.
    since_checkpoint: u64,
    /// The default stream's cache (the stream most threads use only), and the other streams'.
    home: StreamCache,
    others: Vec<StreamCache>,
}

impl PoolCache {
    fn take_all(&mut self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for sc in std::iter::once(&mut self.home).chain(&mut self.others) {
            for list in &mut sc.classes {
                out.extend(list.drain(..).map(|addr| (sc.stream, addr)));
            }
        }
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
        match self.others.iter().position(|s| s.stream == stream) {
            Some(i) => &mut self.others[i],
            None => {
                self.others.push(StreamCache::new(stream));
                self.others.last_mut().expect("just pushed")
            }
        }
    }

    /// This thread's counters for the pool.
    #[inline(always)]
    pub fn counters(&self) -> &LocalCounters {
        &self.counters
    }

    /// The default stream's list of class `index`.
    #[inline(always)]
    pub fn home_list(&mut self, index: usize) -> Option<&mut Vec<u64>> {
        self.home.classes.get_mut(index)
    }

    /// Caches a block of class `index` for the default stream, if its list has room without
    /// growing (a list not made yet has none: its first push makes it, on the general path).
    #[inline(always)]
    pub fn push_home(&mut self, index: usize, addr: u64) -> bool {
        match self.home.classes.get_mut(index) {
            // `push` can't grow here: the fast path makes no call.
            Some(list) if list.len() < list.capacity() => {
                list.push(addr);
                true
            }
            _ => false,
        }
    }

    /// Counts `bytes` allocated; true when the pool's peaks are due for an update.
    pub fn note_allocated(&mut self, bytes: u64) -> bool {
        self.since_checkpoint += bytes;
        if self.since_checkpoint >= crate::stats::PEAK_SLACK {
            self.since_checkpoint = 0;
            return true;
        }
        false
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.upgrade() {
            let blocks = self.take_all();
            owner.adopt(blocks);
            owner.retire_counters(&self.counters);
        }
    }
}

/// This thread's caches, one per pool it used. Boxed, so that `CURRENT` may point into one
/// while the vector grows.
#[derive(Default)]
#[allow(clippy::vec_box)]
struct Caches(Vec<Box<PoolCache>>);

impl Drop for Caches {
    fn drop(&mut self) {
        // The pointer must not outlive the box; later calls (other thread-local destructors that
        // free blocks) then find no cache and count into the pool's shared counters.
        FAST.with(|f| f.current.set(std::ptr::null_mut()));
    }
}

thread_local! {
    static CACHES: UnsafeCell<Caches> = const { UnsafeCell::new(Caches(Vec::new())) };
    // No destructor, so it stays readable while the thread's other storage is torn down.
    static FAST: FastState = const { FastState { current: Cell::new(std::ptr::null_mut()), busy: Cell::new(false) } };
}

/// What the fast path reads first, in one thread-local so that one address computation finds
/// both. `CURRENT` (`current`) is the cache used last (null when none); `BUSY` (`busy`) is set
/// while a call uses a cache.
struct FastState {
    current: Cell<*mut PoolCache>,
    busy: Cell<bool>,
}

/// This thread's cache for one pool, in use: `BUSY` is set while it lives (and cleared when it
/// goes, even by a panic), so it is the only reference to the cache.
pub struct CacheRef {
    cache: *mut PoolCache,
}

impl CacheRef {
    /// Takes the cache that `cache` points at. Only when nothing is busy, with `cache` from
    /// `CURRENT` or just found in `CACHES`.
    #[inline(always)]
    fn enter(cache: *mut PoolCache) -> Self {
        // `with` rather than `LocalKey::set`, which LLVM does not always inline.
        FAST.with(|f| f.busy.set(true));
        Self { cache }
    }
}

impl std::ops::Deref for CacheRef {
    type Target = PoolCache;
    #[inline(always)]
    fn deref(&self) -> &PoolCache {
        // SAFETY: see `current_cache`: the box outlives this guard, which is its only reference.
        unsafe { &*self.cache }
    }
}

impl std::ops::DerefMut for CacheRef {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut PoolCache {
        // SAFETY: as in `deref`.
        unsafe { &mut *self.cache }
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
    pub epoch: u64,
    pub owner: &'a Weak<dyn CacheOwner>,
    pub register: &'a dyn Fn() -> Arc<LocalCounters>,
}

/// Runs `f` on this thread's cache for the pool; None when thread-local storage is gone (the
/// thread is exiting) or when called from inside another call's `f` (which must not happen: `f`
/// must not call back into the pool). When the pool's flush epoch moved on since the last call,
/// the cached blocks go back to the pool first (after `f`, outside the call, so the pool may use
/// this thread's cache again meanwhile).
#[inline]
pub fn with_pool_cache<R>(pool: &PoolHandle<'_>, f: impl FnOnce(&mut PoolCache) -> R) -> Option<R> {
    match current_cache(pool.epoch) {
        Some(mut cache) => Some(f(&mut cache)),
        None if FAST.with(|f| f.busy.get()) => None,
        None => with_pool_cache_slow(pool, f),
    }
}

/// This thread's cache for the pool whose flush epoch is `epoch` (see `new_epoch`): None unless
/// it is the cache this thread used last and nothing is busy.
///
/// A non-null `CURRENT` points into a box that `CACHES` owns: boxes are dropped only by
/// `find_or_make` (whose caller sets `CURRENT` again before it returns) and by the destructor of
/// `CACHES` (which nulls `CURRENT` first). The `CacheRef` sets `BUSY` for its life, which makes
/// it the only reference to the box, as `find_or_make` runs only when nothing is busy.
#[inline(always)]
fn current_cache(epoch: u64) -> Option<CacheRef> {
    // SAFETY: the reference becomes a pointer at once, and `CacheRef` marks the cache busy.
    let cache: *mut PoolCache = unsafe { current_unmarked(epoch) }?;
    Some(CacheRef::enter(cache))
}

/// A flush epoch no pool had before: unique in the process, so that an epoch alone tells which
/// pool a cache belongs to.
pub fn new_epoch() -> u64 {
    static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);
    NEXT_EPOCH.fetch_add(1, Relaxed)
}

/// This thread's cache for the pool whose flush epoch is `epoch` (see `new_epoch`), if it is the
/// cache this thread used last and nothing is busy. The fastest paths' way in: unlike
/// `current_cache` it does not mark the cache busy, which would cost two stores, and it never
/// makes a cache.
///
/// # Safety
///
/// While the reference lives, the caller must not call anything that may use a thread cache (a
/// pool's methods, a drop that frees blocks or ends a pool): nothing marks the cache busy, so
/// such a call would make a second mutable reference to it.
#[inline(always)]
pub unsafe fn current_unmarked<'a>(epoch: u64) -> Option<&'a mut PoolCache> {
    let (busy, cache) = FAST.with(|f| (f.busy.get(), f.current.get()));
    if busy {
        return None;
    }
    // SAFETY: as the doc of `current_cache` says, nothing busy means no other reference into the
    // box exists, and the caller makes none while this one lives.
    let cache = unsafe { cache.as_mut() }?;
    (cache.epoch == epoch).then_some(cache)
}

#[cold]
fn with_pool_cache_slow<R>(pool: &PoolHandle<'_>, f: impl FnOnce(&mut PoolCache) -> R) -> Option<R> {
    let cache = CACHES.try_with(|caches| find_or_make(caches.get(), pool)).ok()?;
    FAST.with(|f| f.current.set(cache));
    let stale = {
        // SAFETY: as in `current_cache`: `cache` was just found in `CACHES`, nothing is busy,
        // and this reference ends before `CacheRef` makes another.
        let cache = unsafe { &mut *cache };
        if cache.epoch != pool.epoch {
            cache.epoch = pool.epoch;
            cache.take_all()
        } else {
            Vec::new()
        }
    };
    let result = f(&mut CacheRef::enter(cache));
    if !stale.is_empty() {
        if let Some(owner) = pool.owner.upgrade() {
            owner.adopt(stale);
        }
    }
    Some(result)
}

/// This thread's cache for the pool, made if the thread has none yet.
fn find_or_make(caches: *mut Caches, pool: &PoolHandle<'_>) -> *mut PoolCache {
    // SAFETY: only this thread reaches its `CACHES`, and no reference into it is alive: callers
    // run this only when no call is busy, and boxes (not the vector) are what `CURRENT` points at.
    let caches = unsafe { &mut (*caches).0 };
    if let Some(cache) = caches.iter_mut().find(|c| c.pool_id == pool.id) {
        return &mut **cache;
    }
    // Forget caches of pools that are gone, then make this one.
    caches.retain(|c| c.owner.strong_count() > 0);
    caches.push(Box::new(PoolCache {
        pool_id: pool.id,
        owner: pool.owner.clone(),
        epoch: pool.epoch,
        counters: (pool.register)(),
        since_checkpoint: 0,
        home: StreamCache::new(HOME_STREAM),
        others: Vec::new(),
    }));
    &mut **caches.last_mut().expect("just pushed")
}

/// Pops a cached block of class `index` for `stream`.
#[inline(always)]
pub fn pop(cache: &mut PoolCache, stream: u64, index: usize) -> Option<u64> {
    cache.stream(stream).classes.get_mut(index)?.pop()
}

/// Caches a block of class `index` (of `class_size` bytes) for `stream`; false when full.
#[inline(always)]
pub fn push(cache: &mut PoolCache, stream: u64, index: usize, class_size: u64, addr: u64) -> bool {
    let sc = cache.stream(stream);
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
