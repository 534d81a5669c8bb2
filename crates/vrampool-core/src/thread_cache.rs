//! Per-thread caches of freed small blocks and per-thread counters: the part of the fast path
//! that touches no shared memory at all (the live-block table's compare-and-swap aside).
//!
//! A thread keeps, for each pool and stream it used, a short LIFO list per size class. A block
//! freed on a thread goes to that thread's list for the block's own stream, so stream ordering is
//! unchanged. The lists are bounded (`CLASS_BYTES` per class); what does not fit goes to the
//! shared magazines. A trim raises the pool's flush epoch: each thread empties its lists into the
//! pool at its next call, and a thread that exits gives its lists back at once.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use crate::stats::{Fast, LocalCounters};

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

struct StreamCache {
    stream: u64,
    /// Block addresses per size class index.
    classes: Vec<Vec<u64>>,
}

/// One thread's state for one pool.
pub struct PoolCache {
    pool_id: u64,
    owner: Weak<dyn CacheOwner>,
    epoch: u64,
    counters: Arc<LocalCounters>,
    /// Bytes allocated since this thread last updated the pool's peaks.
    since_checkpoint: u64,
    streams: Vec<StreamCache>,
}

impl PoolCache {
    fn take_all(&mut self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for sc in &mut self.streams {
            for list in &mut sc.classes {
                out.extend(list.drain(..).map(|addr| (sc.stream, addr)));
            }
        }
        out
    }

    fn stream(&mut self, stream: u64) -> &mut StreamCache {
        // Most threads use one stream: check the first before searching.
        if self.streams.first().is_some_and(|s| s.stream == stream) {
            return &mut self.streams[0];
        }
        match self.streams.iter().position(|s| s.stream == stream) {
            Some(i) => &mut self.streams[i],
            None => {
                self.streams.push(StreamCache { stream, classes: Vec::new() });
                self.streams.last_mut().expect("just pushed")
            }
        }
    }

    pub fn bump(&self, which: Fast, n: u64) {
        self.counters.bump_owned(which, n);
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

thread_local! {
    static CACHES: RefCell<Vec<PoolCache>> = const { RefCell::new(Vec::new()) };
}

/// What `with_pool_cache` needs to make a cache for a pool this thread has not used yet.
pub struct PoolHandle<'a> {
    pub id: u64,
    pub epoch: u64,
    pub owner: &'a Weak<dyn CacheOwner>,
    pub register: &'a dyn Fn() -> Arc<LocalCounters>,
}

/// Runs `f` on this thread's cache for the pool; None when thread-local storage is gone (the
/// thread is exiting). `f` must not call back into the pool. When the pool's flush epoch moved on
/// since the last call, the cached blocks go back to the pool first (after `f`, outside the
/// borrow, so the pool may use this thread's cache again meanwhile).
pub fn with_pool_cache<R>(pool: &PoolHandle<'_>, f: impl FnOnce(&mut PoolCache) -> R) -> Option<R> {
    let mut stale = Vec::new();
    let result = CACHES
        .try_with(|caches| {
            let mut caches = caches.try_borrow_mut().ok()?;
            // The pool used last sits at the end, so the common case is one comparison.
            let last = caches.len().wrapping_sub(1);
            let found = match caches.get(last) {
                Some(c) if c.pool_id == pool.id => Some(last),
                _ => caches.iter().position(|c| c.pool_id == pool.id).map(|i| {
                    let cache = caches.remove(i);
                    caches.push(cache);
                    last
                }),
            };
            let index = match found {
                Some(i) => i,
                None => {
                    // Forget caches of pools that are gone, then make this one.
                    caches.retain(|c| c.owner.strong_count() > 0);
                    caches.push(PoolCache {
                        pool_id: pool.id,
                        owner: pool.owner.clone(),
                        epoch: pool.epoch,
                        counters: (pool.register)(),
                        since_checkpoint: 0,
                        streams: Vec::new(),
                    });
                    caches.len() - 1
                }
            };
            let cache = &mut caches[index];
            if cache.epoch != pool.epoch {
                cache.epoch = pool.epoch;
                stale = cache.take_all();
            }
            Some(f(cache))
        })
        .ok()
        .flatten();
    if !stale.is_empty() {
        if let Some(owner) = pool.owner.upgrade() {
            owner.adopt(stale);
        }
    }
    result
}

/// Pops a cached block of class `index` for `stream`.
pub fn pop(cache: &mut PoolCache, stream: u64, index: usize) -> Option<u64> {
    cache.stream(stream).classes.get_mut(index)?.pop()
}

/// Caches a block of class `index` (of `class_size` bytes) for `stream`; false when full.
pub fn push(cache: &mut PoolCache, stream: u64, index: usize, class_size: u64, addr: u64) -> bool {
    let sc = cache.stream(stream);
    if sc.classes.len() <= index {
        sc.classes.resize_with(index + 1, Vec::new);
    }
    let list = &mut sc.classes[index];
    if list.capacity() == 0 {
        // The depth is fixed per class: reserve it once, so the fast path needs no division.
        list.reserve_exact(((CLASS_BYTES / class_size) as usize).max(CLASS_MIN_DEPTH));
    }
    if list.len() == list.capacity() {
        return false;
    }
    list.push(addr);
    true
}
