//! Private pools over a resource, as PyTorch's `beginAllocateToPool` / `endAllocateToPool` /
//! `releasePool` make them (CUDA graph capture, `torch.cuda.MemPool`): while one is open, every
//! allocation goes to it, and its blocks are reused only by its own allocations until it is
//! released; a released pool goes (its memory back to the device) once its last block is freed.
//!
//! A free finds its block's pool in an address map, filled as private pools hand blocks out; an
//! address not in it is the upstream's. While no private pool exists the map is not read: the
//! fast path costs one relaxed load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use foldhash::fast::FixedState;
use parking_lot::Mutex;

use crate::config::{Limit, PoolConfig};
use crate::device::{Device, StreamId};
use crate::error::{PoolError, Result};
use crate::event_log::PieceEvent;
use crate::pool::{CachedFree, LiveBlockInfo, Pool, PoolCore};
use crate::resource::{MemoryResource, PoolId, PoolSegment};
use crate::stats::{CounterValues, Stats};

mod tags;

pub use tags::TagInfo;

struct Private {
    id: PoolId,
    pool: Arc<Pool>,
    released: bool,
    /// The tag of a tagged region's pool (`tags.rs`), which pauses and resumes.
    tag: Option<String>,
}

#[derive(Default)]
struct Pools {
    pools: Vec<Private>,
    /// Pools allocations are routed to, innermost last.
    open: Vec<PoolId>,
    /// The figures of the private pools released and gone: their totals and peaks stay in the
    /// resource's.
    retired: Stats,
}

/// An upstream resource and the private pools beside it, each a pool of its own on the same
/// device and configuration.
pub struct PrivatePools<U> {
    upstream: U,
    device: Arc<dyn Device>,
    config: PoolConfig,
    /// The limit `set_limit` set last, for private pools made later.
    limit: Mutex<Option<Limit>>,
    pools: Mutex<Pools>,
    /// The private pool of each block a private pool handed out and that is still live.
    owners: Mutex<HashMap<u64, Arc<Pool>, FixedState>>,
    /// `pools.open.len()` and `pools.pools.len()`, read without the lock on the fast paths.
    open_count: AtomicUsize,
    pool_count: AtomicUsize,
}

impl<U: MemoryResource> PrivatePools<U> {
    /// Private pools made on `device` with `config`, beside `upstream`.
    pub fn new(upstream: U, device: Arc<dyn Device>, config: PoolConfig) -> Self {
        Self {
            upstream,
            device,
            config,
            limit: Mutex::new(None),
            pools: Mutex::default(),
            owners: Mutex::default(),
            open_count: AtomicUsize::new(0),
            pool_count: AtomicUsize::new(0),
        }
    }

    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Routes allocations to the private pool `id` (made on first use) until `end(id)`; pools
    /// opened inside it take over until they end.
    pub fn begin(&self, id: PoolId) -> Result<()> {
        let mut pools = self.pools.lock();
        match pools.pools.iter_mut().find(|p| p.id == id) {
            Some(p) => p.released = false,
            None => {
                let pool = Pool::new(Arc::clone(&self.device), self.config.clone())?;
                if let Some(limit) = *self.limit.lock() {
                    pool.set_limit(Some(limit))?;
                }
                pools.pools.push(Private { id, pool: Arc::new(pool), released: false, tag: None });
            }
        }
        pools.open.push(id);
        self.sync_counts(&pools);
        Ok(())
    }

    /// Stops routing allocations to `id`; false when it is not open.
    pub fn end(&self, id: PoolId) -> bool {
        let mut pools = self.pools.lock();
        let found = pools.open.iter().rposition(|&o| o == id).map(|i| pools.open.remove(i)).is_some();
        self.sync_counts(&pools);
        found
    }

    /// Gives `id`'s free memory back; the pool goes once its last block is freed. False when
    /// there is no such pool.
    pub fn release(&self, id: PoolId) -> bool {
        let mut pools = self.pools.lock();
        pools.open.retain(|&o| o != id);
        let found = match pools.pools.iter_mut().find(|p| p.id == id) {
            Some(p) => {
                p.released = true;
                let _ = p.pool.trim();
                true
            }
            None => false,
        };
        self.drop_finished(&mut pools);
        found
    }

    /// The private pools, and those open (innermost last).
    pub fn ids(&self) -> (Vec<PoolId>, Vec<PoolId>) {
        let pools = self.pools.lock();
        (pools.pools.iter().map(|p| p.id).collect(), pools.open.clone())
    }

    /// The limit `set_limit` set, if it did.
    pub fn limit(&self) -> Option<Limit> {
        *self.limit.lock()
    }

    /// The private pools' live blocks.
    pub fn live_blocks(&self) -> Vec<LiveBlockInfo> {
        self.private_pools().iter().flat_map(|(_, p)| p.live_blocks()).collect()
    }

    /// Closes every private pool (they refuse later calls); returns their live blocks.
    pub fn close(&self) -> Vec<LiveBlockInfo> {
        self.private_pools().iter().flat_map(|(_, p)| p.close()).collect()
    }

    fn private_pools(&self) -> Vec<(PoolId, Arc<Pool>)> {
        if self.pool_count.load(Relaxed) == 0 {
            return Vec::new();
        }
        self.pools.lock().pools.iter().map(|p| (p.id, Arc::clone(&p.pool))).collect()
    }

    fn sync_counts(&self, pools: &Pools) {
        self.open_count.store(pools.open.len(), Relaxed);
        self.pool_count.store(pools.pools.len(), Relaxed);
    }

    /// Forgets released private pools that hold no live block, giving their memory back.
    fn drop_finished(&self, pools: &mut Pools) {
        let retired = &mut pools.retired;
        pools.pools.retain(|p| {
            let finished = p.released && p.pool.live_blocks().is_empty();
            if finished {
                let _ = p.pool.close();
                add_stats(retired, &p.pool.stats());
            }
            !finished
        });
        self.sync_counts(pools);
    }

    /// The private pool that handed out the live block at `addr`, if one did.
    #[inline]
    fn owner(&self, addr: u64) -> Option<Arc<Pool>> {
        if self.pool_count.load(Relaxed) == 0 {
            return None;
        }
        self.owner_among_pools(addr)
    }

    #[cold]
    fn owner_among_pools(&self, addr: u64) -> Option<Arc<Pool>> {
        self.owners.lock().get(&addr).cloned()
    }

    #[cold]
    fn allocate_private(&self, size: u64, stream: StreamId) -> Result<u64> {
        let target = {
            let pools = self.pools.lock();
            pools.open.last().and_then(|id| pools.pools.iter().find(|p| p.id == *id)).map(|p| (Arc::clone(&p.pool), p.tag.clone()))
        };
        let Some((pool, tag)) = target else { return self.upstream.allocate(size, stream) };
        let addr = pool.allocate(size, stream).map_err(|e| match (e, tag) {
            (PoolError::Paused(_), Some(tag)) => {
                PoolError::Paused(format!("the memory of tag {tag:?} is paused: resume it before allocating in its region"))
            }
            (e, _) => e,
        })?;
        self.owners.lock().insert(addr, pool);
        Ok(addr)
    }

    #[cold]
    fn free_private(&self, pool: Arc<Pool>, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        // Out of the map before the free, so that a block the pool hands out again at once at
        // this address is recorded anew, not removed after.
        self.owners.lock().remove(&addr);
        if let Err(e) = pool.free(addr, size, stream) {
            self.owners.lock().insert(addr, pool);
            return Err(e);
        }
        self.drop_finished(&mut self.pools.lock());
        Ok(())
    }
}

impl<U: MemoryResource> MemoryResource for PrivatePools<U> {
    #[inline]
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64> {
        if self.open_count.load(Relaxed) == 0 {
            return self.upstream.allocate(size, stream);
        }
        self.allocate_private(size, stream)
    }

    #[inline]
    fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        match self.owner(addr) {
            None => self.upstream.free(addr, size, stream),
            Some(pool) => self.free_private(pool, addr, size, stream),
        }
    }

    #[inline(always)]
    fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
        if self.open_count.load(Relaxed) != 0 {
            return None;
        }
        self.upstream.allocate_cached(size, stream)
    }

    #[inline(always)]
    fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        if self.pool_count.load(Relaxed) != 0 {
            return CachedFree::Untouched;
        }
        self.upstream.free_cached(addr, size, stream)
    }

    fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<()> {
        self.upstream.free_parked(addr, stream)
    }

    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<()> {
        match self.owner(addr) {
            None => self.upstream.record_stream(addr, stream),
            Some(pool) => pool.record_stream(addr, stream),
        }
    }

    fn trim(&self) -> Result<u64> {
        let mut bytes = self.upstream.trim()?;
        for (_, pool) in self.private_pools() {
            bytes += pool.trim()?;
        }
        self.drop_finished(&mut self.pools.lock());
        Ok(bytes)
    }

    /// The upstream's figures plus the private pools', those gone included (their peaks add up
    /// to an upper bound).
    fn stats(&self) -> Stats {
        let mut stats = self.upstream.stats();
        for (_, pool) in self.private_pools() {
            add_stats(&mut stats, &pool.stats());
        }
        add_stats(&mut stats, &self.pools.lock().retired);
        stats
    }

    fn reset_peak_stats(&self) {
        self.upstream.reset_peak_stats();
        self.private_pools().iter().for_each(|(_, p)| p.reset_peak_stats());
        let retired = &mut self.pools.lock().retired;
        for c in [
            &mut retired.allocated_bytes,
            &mut retired.requested_bytes,
            &mut retired.reserved_bytes,
            &mut retired.active_bytes,
            &mut retired.allocation,
            &mut retired.segment,
        ] {
            c.peak = c.current;
        }
    }

    fn snapshot(&self) -> Vec<PoolSegment> {
        let mut segments = self.upstream.snapshot();
        for (id, pool) in self.private_pools() {
            segments.extend(PoolCore::snapshot(&pool).into_iter().map(|segment| PoolSegment { pool: id, segment }));
        }
        segments
    }

    fn set_limit(&self, limit: Option<Limit>) -> Result<()> {
        self.upstream.set_limit(limit)?;
        for (_, pool) in self.private_pools() {
            pool.set_limit(limit)?;
        }
        *self.limit.lock() = limit;
        Ok(())
    }

    fn alignment(&self) -> u64 {
        self.upstream.alignment()
    }
    fn allocate_carved(&self, size: u64, stream: StreamId) -> Result<u64> {
        self.upstream.allocate_carved(size, stream)
    }
    fn free_carved(&self, addr: u64, size: u64, users: &[StreamId]) -> Result<()> {
        self.upstream.free_carved(addr, size, users)
    }
    fn watches_pieces(&self) -> bool {
        self.upstream.watches_pieces()
    }
    fn piece(&self, addr: u64, size: u64, stream: StreamId, event: PieceEvent) -> Result<()> {
        self.upstream.piece(addr, size, stream, event)
    }
}

fn add_counter(a: &mut CounterValues, b: &CounterValues) {
    a.current += b.current;
    a.peak += b.peak;
    a.allocated += b.allocated;
    a.freed += b.freed;
}

fn add_stats(a: &mut Stats, b: &Stats) {
    for (x, y) in [
        (&mut a.allocated_bytes, &b.allocated_bytes),
        (&mut a.requested_bytes, &b.requested_bytes),
        (&mut a.reserved_bytes, &b.reserved_bytes),
        (&mut a.active_bytes, &b.active_bytes),
        (&mut a.allocation, &b.allocation),
        (&mut a.segment, &b.segment),
    ] {
        add_counter(x, y);
    }
    a.num_alloc_retries += b.num_alloc_retries;
    a.num_ooms += b.num_ooms;
    a.num_device_alloc += b.num_device_alloc;
    a.num_device_free += b.num_device_free;
    a.fast_path_hits += b.fast_path_hits;
    a.deferred_frees += b.deferred_frees;
    a.largest_free_bytes = a.largest_free_bytes.max(b.largest_free_bytes);
    a.cached_bytes += b.cached_bytes;
    a.paused_bytes += b.paused_bytes;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimMode};
    use crate::error::{InvalidFreeReason, PoolError};

    const S0: StreamId = StreamId(0);
    const GRAPH: PoolId = PoolId { first: 3, second: 9 };

    fn private_pools() -> PrivatePools<Pool> {
        let device: Arc<dyn Device> = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
        let pool = Pool::new(Arc::clone(&device), PoolConfig::default()).unwrap();
        PrivatePools::new(pool, device, PoolConfig::default())
    }

    fn pool_of(p: &PrivatePools<Pool>, addr: u64) -> Option<PoolId> {
        p.snapshot()
            .into_iter()
            .find(|s| s.segment.blocks.iter().any(|b| b.0 == addr && matches!(b.2, crate::BlockState::Active { .. })))
            .map(|s| s.pool)
    }

    #[test]
    fn allocations_go_to_the_open_pool_and_its_blocks_stay_in_it() {
        let p = private_pools();
        let main = p.allocate(4096, S0).unwrap();
        p.begin(GRAPH).unwrap();
        assert_eq!(p.ids(), (vec![GRAPH], vec![GRAPH]));
        let inside = p.allocate(4096, S0).unwrap();
        assert!(p.end(GRAPH));
        assert!(!p.end(GRAPH), "ended twice");
        let after = p.allocate(4096, S0).unwrap();
        assert_eq!((pool_of(&p, main), pool_of(&p, inside), pool_of(&p, after)), (Some(PoolId::MAIN), Some(GRAPH), Some(PoolId::MAIN)));
        assert_eq!(p.stats().allocation.current, 3, "the figures add the private pools'");
        // A block freed in the private pool is reused only inside it.
        p.free(inside, Some(4096), None).unwrap();
        let other = p.allocate(4096, S0).unwrap();
        assert_ne!(other, inside);
        p.begin(GRAPH).unwrap();
        assert_eq!(p.allocate(4096, S0).unwrap(), inside, "the private pool reuses its own block");
        p.end(GRAPH);
        for addr in [main, after, other, inside] {
            p.free(addr, Some(4096), None).unwrap();
        }
        assert_eq!(p.stats().allocation.current, 0);
    }

    #[test]
    fn nested_pools_route_to_the_innermost() {
        let p = private_pools();
        let outer = PoolId { first: 1, second: 1 };
        p.begin(outer).unwrap();
        p.begin(GRAPH).unwrap();
        let a = p.allocate(4096, S0).unwrap();
        p.end(GRAPH);
        let b = p.allocate(4096, S0).unwrap();
        p.end(outer);
        assert_eq!((pool_of(&p, a), pool_of(&p, b)), (Some(GRAPH), Some(outer)));
    }

    #[test]
    fn a_released_pool_goes_with_its_last_block_and_its_figures_stay() {
        let p = private_pools();
        p.begin(GRAPH).unwrap();
        let a = p.allocate(1 << 20, S0).unwrap();
        let b = p.allocate(4096, S0).unwrap();
        p.end(GRAPH);
        p.free(b, None, None).unwrap();
        assert!(p.release(GRAPH));
        assert_eq!(p.ids().0, vec![GRAPH], "a block is live: the pool stays");
        let peak = p.stats().allocated_bytes.peak;
        p.free(a, None, None).unwrap();
        assert_eq!(p.ids().0, Vec::<PoolId>::new());
        let stats = p.stats();
        assert_eq!((stats.allocation.allocated, stats.allocation.freed, stats.allocated_bytes.peak), (2, 2, peak));
        assert_eq!(stats.reserved_bytes.current, 0, "its memory went back to the device");
        assert!(!p.release(GRAPH), "gone");
        p.reset_peak_stats();
        assert_eq!(p.stats().allocated_bytes.peak, 0);
    }

    #[test]
    fn frees_are_routed_by_address_and_bad_ones_refused() {
        let p = private_pools();
        p.begin(GRAPH).unwrap();
        let a = p.allocate(4096, S0).unwrap();
        p.end(GRAPH);
        let wrong = p.free(a, Some(512), None).unwrap_err();
        assert!(matches!(wrong, PoolError::InvalidFree { reason: InvalidFreeReason::WrongSize { .. }, .. }));
        assert_eq!(pool_of(&p, a), Some(GRAPH), "a refused free leaves the block live, still routed");
        p.record_stream(a, StreamId(5)).unwrap();
        p.free(a, Some(4096), None).unwrap();
        let again = p.free(a, Some(4096), None).unwrap_err();
        assert!(matches!(again, PoolError::InvalidFree { reason: InvalidFreeReason::NotAllocated, .. }), "{again}");
        assert!(p.record_stream(a, StreamId(5)).is_err());
    }

    #[test]
    fn the_cached_lane_stays_out_of_private_pools() {
        let p = private_pools();
        let a = p.allocate(512, S0).unwrap();
        p.free(a, Some(512), None).unwrap();
        let b = p.allocate(512, S0).unwrap();
        assert_eq!(p.free_cached(b, Some(512), None), CachedFree::Done, "no private pool: the upstream's lane");
        p.begin(GRAPH).unwrap();
        assert_eq!(p.allocate_cached(512, S0), None, "an open private pool takes every allocation");
        let private = p.allocate(512, S0).unwrap();
        assert_eq!(pool_of(&p, private), Some(GRAPH));
        p.end(GRAPH);
        assert_eq!(p.free_cached(private, Some(512), None), CachedFree::Untouched, "a private pool's block is routed by free");
        p.free(private, Some(512), None).unwrap();
        assert!(p.release(GRAPH));
        // The thread used the private pool last: the upstream's cache is its again after a call.
        let c = p.allocate(512, S0).unwrap();
        assert_eq!(p.free_cached(c, Some(512), None), CachedFree::Done, "the lane is back once no private pool is left");
        assert_eq!(p.allocate_cached(512, S0), Some(c));
    }

    #[test]
    fn limits_reach_every_pool_and_those_made_later() {
        let p = private_pools();
        p.begin(GRAPH).unwrap();
        p.set_limit(Some(Limit::Bytes(1 << 20))).unwrap();
        assert!(p.allocate(2 << 20, S0).is_err(), "the open private pool is capped");
        p.end(GRAPH);
        assert!(p.allocate(2 << 20, S0).is_err(), "the upstream is capped");
        let later = PoolId { first: 7, second: 7 };
        p.begin(later).unwrap();
        assert!(p.allocate(2 << 20, S0).is_err(), "a pool made later is capped");
        assert_eq!(p.limit(), Some(Limit::Bytes(1 << 20)));
    }

    #[test]
    fn trim_and_close_reach_the_private_pools() {
        let p = private_pools();
        p.begin(GRAPH).unwrap();
        let a = p.allocate(3 << 20, S0).unwrap();
        p.free(a, None, None).unwrap();
        assert!(p.trim().unwrap() >= 3 << 20);
        let b = p.allocate(4096, S0).unwrap();
        let live = p.close();
        assert_eq!(live.iter().map(|b| b.addr).collect::<Vec<_>>(), vec![b]);
        assert!(p.allocate(4096, S0).is_err(), "a closed private pool refuses");
    }

    #[test]
    fn many_threads_allocate_and_free_beside_a_private_pool() {
        let p = Arc::new(private_pools());
        p.begin(GRAPH).unwrap();
        let private: Vec<u64> = (0..64).map(|_| p.allocate(4096, S0).unwrap()).collect();
        p.end(GRAPH);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = Arc::clone(&p);
                let mine: Vec<u64> = private.iter().copied().skip(t).step_by(4).collect();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let a = p.allocate(512 * (1 + (i + t as u64) % 16), S0).unwrap();
                        p.free(a, None, None).unwrap();
                    }
                    for a in mine {
                        p.free(a, Some(4096), None).unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let stats = p.stats();
        assert_eq!(stats.allocation.current, 0);
        assert_eq!(stats.allocation.allocated, 64 + 4 * 2000);
    }
}
