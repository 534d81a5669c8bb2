//! The planned arena as a mode of a resource: off, every call goes to the upstream resource;
//! on, allocations go through a [`PlannedPool`] over it (recorded per iteration, then served
//! from one arena at planned offsets), and frees reach the arena wherever its buffers are.
//! What `vrampool.torch.planned()` turns on for the allocator PyTorch calls.
//!
//! ```
//! use std::sync::Arc;
//! use vrampool_core::{MemoryResource, Pool, PoolConfig, SimDevice, SimMode, StreamId};
//! use vrampool_plan::PlannedMode;
//!
//! let device = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
//! let mode = PlannedMode::new(Pool::new(device, PoolConfig::default())?);
//! let before = mode.allocate(4096, StreamId(0))?; // the pool's
//! mode.set_on(true);
//! for _ in 0..3 {
//!     let a = mode.allocate(4096, StreamId(0))?;
//!     mode.free(a, None, None)?;
//!     mode.step(0);
//! }
//! mode.free(before, None, None)?; // still the pool's to free
//! let stats = mode.planned_stats().unwrap();
//! assert_eq!((stats.dynamic_allocations, stats.planned_allocations), (1, 2));
//! # Ok::<(), vrampool_core::PoolError>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use vrampool_core::stats::Stats;
use vrampool_core::{Limit, MemoryResource, PoolError, PoolSegment, StreamId};

use crate::arena::{PlannedPool, PlannedStats};

/// An upstream resource and the planned arena over it, used while the mode is on.
pub struct PlannedMode<U: MemoryResource> {
    planned: PlannedPool<U>,
    on: AtomicBool,
    /// Set by the first planned allocation: until then no buffer can be the arena's, and frees
    /// go straight to the upstream.
    engaged: AtomicBool,
}

impl<U: MemoryResource> PlannedMode<U> {
    /// The mode, off, over `upstream`.
    pub fn new(upstream: U) -> Self {
        Self { planned: PlannedPool::new(upstream), on: AtomicBool::new(false), engaged: AtomicBool::new(false) }
    }

    pub fn upstream(&self) -> &U {
        self.planned.backing()
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// Turns the mode on or off. Off, the arena only waits for its last buffers: it goes back to
    /// the upstream now if none is live.
    pub fn set_on(&self, on: bool) {
        self.on.store(on, Relaxed);
        if !on {
            let _ = self.planned.release_idle_arena();
        }
    }

    /// An iteration boundary; `key` names the next iteration's signature (see
    /// [`PlannedPool::step`]).
    pub fn step(&self, key: u64) {
        // Refused only in a forked child, where the upstream refuses every call too.
        let _ = self.planned.step(key);
    }

    /// The arena's figures, or None before the first planned allocation (or in a forked child).
    pub fn planned_stats(&self) -> Option<PlannedStats> {
        self.engaged.load(Relaxed).then(|| self.planned.stats().ok()).flatten()
    }

    fn engaged(&self) -> bool {
        self.engaged.load(Relaxed)
    }

    #[cold]
    fn allocate_planned(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        if !self.engaged() {
            self.engaged.store(true, Relaxed);
        }
        self.planned.allocate(size, stream)
    }
}

impl<U: MemoryResource> MemoryResource for PlannedMode<U> {
    #[inline]
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        if !self.is_on() {
            return self.upstream().allocate(size, stream);
        }
        self.allocate_planned(size, stream)
    }

    /// The arena answers for its buffers and for addresses inside it (a double free there must
    /// not reach the upstream, where the arena's own block is), also after the mode is off.
    #[inline]
    fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        if self.engaged() && self.planned.claims(addr) {
            return self.planned.free(addr, size, stream);
        }
        self.upstream().free(addr, size, stream)
    }

    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        if self.engaged() && self.planned.owns(addr) {
            return self.planned.record_stream(addr, stream);
        }
        self.upstream().record_stream(addr, stream)
    }

    fn trim(&self) -> Result<u64, PoolError> {
        self.upstream().trim()
    }

    /// The upstream's figures: the arena is one of its blocks.
    fn stats(&self) -> Stats {
        self.upstream().stats()
    }

    fn reset_peak_stats(&self) {
        self.upstream().reset_peak_stats()
    }

    fn snapshot(&self) -> Vec<PoolSegment> {
        self.upstream().snapshot()
    }

    fn set_limit(&self, limit: Option<Limit>) -> Result<(), PoolError> {
        self.upstream().set_limit(limit)
    }

    fn alignment(&self) -> u64 {
        self.upstream().alignment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vrampool_core::{Device, InvalidFreeReason, Pool, PoolConfig, SimDevice, SimMode};

    const S0: StreamId = StreamId(0);

    fn mode() -> PlannedMode<Pool> {
        let device: Arc<dyn Device> = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
        PlannedMode::new(Pool::new(device, PoolConfig::default()).unwrap())
    }

    /// One iteration: three allocations, each freed after the next, then `step(key)`.
    fn iteration(mode: &PlannedMode<Pool>, key: u64) -> Vec<u64> {
        let sizes = [4096, 3 << 20, 64 << 10];
        let mut addrs: Vec<u64> = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            addrs.push(mode.allocate(size, S0).unwrap());
            if i > 0 {
                mode.free(addrs[i - 1], Some(sizes[i - 1]), None).unwrap();
            }
        }
        mode.free(addrs[2], Some(sizes[2]), None).unwrap();
        mode.step(key);
        addrs
    }

    #[test]
    fn off_it_is_the_upstream_and_reports_nothing() {
        let m = mode();
        assert!(!m.is_on());
        iteration(&m, 0);
        iteration(&m, 0);
        assert!(m.planned_stats().is_none(), "no planned allocation yet");
        assert_eq!(m.stats().allocation.allocated, 6, "every allocation went to the upstream");
    }

    #[test]
    fn on_a_repeated_iteration_comes_from_the_arena() {
        let m = mode();
        m.set_on(true);
        m.step(7); // names the first iteration
        let recorded = iteration(&m, 7);
        let upstream_allocations = m.stats().allocation.allocated;
        let replayed = iteration(&m, 7);
        assert_eq!(iteration(&m, 7), replayed, "the same sequence, the same offsets");
        assert_ne!(recorded, replayed);
        let stats = m.planned_stats().unwrap();
        assert_eq!((stats.dynamic_allocations, stats.planned_allocations, stats.fallbacks), (3, 6, 0));
        assert_eq!(
            m.stats().allocation.allocated - upstream_allocations,
            1,
            "the arena is the replay's one upstream allocation"
        );
        m.set_on(false);
        assert_eq!(m.stats().allocation.current, 0, "off, the idle arena goes back");
    }

    #[test]
    fn frees_reach_the_arena_and_the_upstream_alike() {
        let m = mode();
        let before = m.allocate(4096, S0).unwrap();
        m.set_on(true);
        m.step(1);
        iteration(&m, 1);
        let in_arena = m.allocate(4096, S0).unwrap();
        assert_eq!(m.planned_stats().unwrap().planned_allocations, 1);
        m.set_on(false);
        m.record_stream(in_arena, StreamId(0)).unwrap();
        m.free(in_arena, Some(4096), None).unwrap();
        let double = m.free(in_arena, Some(4096), None).unwrap_err();
        assert!(matches!(double, PoolError::InvalidFree { reason: InvalidFreeReason::NotAllocated, .. }), "{double}");
        m.free(before, Some(4096), None).unwrap();
        assert!(m.free(before, Some(4096), None).is_err());
        assert!(m.record_stream(before, StreamId(2)).is_err());
        m.set_limit(Some(Limit::Bytes(1 << 20))).unwrap();
        assert!(m.allocate(2 << 20, S0).is_err(), "the limit reaches the upstream");
        assert_eq!(m.alignment(), 512);
        assert!(m.snapshot().iter().all(|s| s.pool == vrampool_core::PoolId::MAIN));
    }
}
