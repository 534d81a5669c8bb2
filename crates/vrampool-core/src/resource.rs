//! `MemoryResource`: what every layer above the pool talks to, as RMM's `device_memory_resource`
//! is. The pool is one; the adaptors are others, each over the resource it wraps (its upstream):
//! [`PrivatePools`](crate::PrivatePools) routes the blocks of private pools (CUDA graphs,
//! `torch.cuda.MemPool`), and the planned arena's mode (`vrampool_steady::PlannedMode`) serves
//! repeated iterations from one arena. A binding composes them once and calls the outermost.
//!
//! Adaptors are generic over their upstream rather than boxed: the allocation fast path then
//! stays one inlined call chain, with one relaxed load per adaptor in front of the pool's own.

use std::sync::Arc;

use crate::config::Limit;
use crate::device::StreamId;
use crate::error::Result;
use crate::event_log::PieceEvent;
use crate::pool::{CachedFree, Pool, PoolCore, SegmentSnapshot};
use crate::stats::Stats;

/// The id of a private pool: PyTorch's `MempoolId_t` (a pair of `unsigned long long`, passed by
/// value, so laid out as that pair). [`PoolId::MAIN`] names a resource's own pool.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PoolId {
    pub first: u64,
    pub second: u64,
}

impl PoolId {
    pub const MAIN: PoolId = PoolId { first: 0, second: 0 };
}

/// A segment of a snapshot and the pool it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSegment {
    pub pool: PoolId,
    pub segment: SegmentSnapshot,
}

/// Device memory handed out by address, stream-ordered, with the pool's figures.
pub trait MemoryResource: Send + Sync {
    /// At least `size` bytes for use on `stream`.
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64>;
    /// Frees a block `allocate` returned; `size`, when given, must be the size asked for;
    /// `stream`, when given, is a stream that used the block last.
    fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()>;
    /// The live block at `addr` is used on `stream` too: once freed, it is not reused before
    /// `stream` has passed the free.
    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<()>;
    /// Gives wholly free memory back to the device; returns the bytes given back.
    fn trim(&self) -> Result<u64>;
    fn stats(&self) -> Stats;
    /// `[allocated bytes, requested bytes, active bytes, blocks]` held now, as `stats` has them
    /// current, for a caller that reads them at every allocation.
    fn held(&self) -> [u64; 4] {
        let s = self.stats();
        [s.allocated_bytes.current, s.requested_bytes.current, s.active_bytes.current, s.allocation.current]
    }
    fn reset_peak_stats(&self);
    /// Every segment, with its blocks, in address order per pool.
    fn snapshot(&self) -> Vec<PoolSegment>;
    /// Caps what the resource may reserve (`torch.cuda.set_per_process_memory_fraction`).
    fn set_limit(&self, limit: Option<Limit>) -> Result<()>;
    /// Every block handed out is aligned to this.
    fn alignment(&self) -> u64;

    /// The fastest path alone, for a caller that pays for a panic guard around `allocate`: a
    /// block from the calling thread's cache where the resource would take it from there, else
    /// None with nothing done (the caller then calls `allocate`). It cannot fail, and it calls
    /// nothing that can panic: relaxed loads, the thread's cache and the pool's live table.
    #[inline(always)]
    fn allocate_cached(&self, _size: u64, _stream: StreamId) -> Option<u64> {
        None
    }
    /// The fastest path of a free alone, as `allocate_cached`: `Done`, `Parked` (end it with
    /// `free_parked`) or `Untouched` (call `free`).
    #[inline(always)]
    fn free_cached(&self, _addr: u64, _size: Option<u64>, _stream: Option<StreamId>) -> CachedFree {
        CachedFree::Untouched
    }
    /// Ends a free that `free_cached` left `Parked`.
    fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<()> {
        self.free(addr, None, stream)
    }

    /// A block that an adaptor cuts into pieces of its own (the planned arena's regions): as `allocate`,
    /// but the block itself is neither scrubbed, logged nor tracked as a leak, since each piece is
    /// (`piece`).
    fn allocate_carved(&self, size: u64, stream: StreamId) -> Result<u64> {
        self.allocate(size, stream)
    }
    /// Frees a block of `allocate_carved` of `size` bytes, whose reuse waits for `users`, streams other
    /// than its own that used pieces of it.
    fn free_carved(&self, addr: u64, size: u64, users: &[StreamId]) -> Result<()> {
        users.iter().try_for_each(|&s| self.record_stream(addr, s))?;
        self.free(addr, Some(size), None)
    }
    /// Whether `piece` has anything to do (scrubbing, the event log or leak tracking is on).
    fn watches_pieces(&self) -> bool {
        false
    }
    /// A piece of a carved block handed out or freed: scrubbed and logged as a block of the
    /// resource's own would be. After an error (the device could not scrub it) the piece's bytes
    /// must not be handed out again.
    fn piece(&self, _addr: u64, _size: u64, _stream: StreamId, _event: PieceEvent) -> Result<()> {
        Ok(())
    }
}

impl MemoryResource for PoolCore {
    #[inline]
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64> {
        PoolCore::allocate(self, size, stream)
    }
    #[inline]
    fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        PoolCore::free(self, addr, size, stream)
    }
    #[inline(always)]
    fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
        PoolCore::allocate_cached(self, size, stream)
    }
    #[inline(always)]
    fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        PoolCore::free_cached(self, addr, size, stream)
    }
    fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<()> {
        PoolCore::free_parked(self, addr, stream)
    }
    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<()> {
        PoolCore::record_stream(self, addr, stream)
    }
    fn trim(&self) -> Result<u64> {
        PoolCore::trim(self)
    }
    fn stats(&self) -> Stats {
        PoolCore::stats(self)
    }
    fn held(&self) -> [u64; 4] {
        PoolCore::held(self)
    }
    fn reset_peak_stats(&self) {
        PoolCore::reset_peak_stats(self)
    }
    fn snapshot(&self) -> Vec<PoolSegment> {
        PoolCore::snapshot(self).into_iter().map(|segment| PoolSegment { pool: PoolId::MAIN, segment }).collect()
    }
    fn set_limit(&self, limit: Option<Limit>) -> Result<()> {
        PoolCore::set_limit(self, limit)
    }
    fn alignment(&self) -> u64 {
        self.config().alignment
    }
    fn allocate_carved(&self, size: u64, stream: StreamId) -> Result<u64> {
        PoolCore::allocate_carved(self, size, stream)
    }
    fn free_carved(&self, addr: u64, size: u64, users: &[StreamId]) -> Result<()> {
        PoolCore::free_carved(self, addr, size, users)
    }
    fn watches_pieces(&self) -> bool {
        PoolCore::watches_pieces(self)
    }
    fn piece(&self, addr: u64, size: u64, stream: StreamId, event: PieceEvent) -> Result<()> {
        PoolCore::piece(self, addr, size, stream, event)
    }
}

/// Forwards every method to the resource `$ty` dereferences to.
macro_rules! forward_memory_resource {
    ($([$($generics:tt)*] $ty:ty),* $(,)?) => {$(
        impl<$($generics)*> MemoryResource for $ty {
            #[inline]
            fn allocate(&self, size: u64, stream: StreamId) -> Result<u64> {
                MemoryResource::allocate(&**self, size, stream)
            }
            #[inline]
            fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
                MemoryResource::free(&**self, addr, size, stream)
            }
            #[inline(always)]
            fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
                MemoryResource::allocate_cached(&**self, size, stream)
            }
            #[inline(always)]
            fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
                MemoryResource::free_cached(&**self, addr, size, stream)
            }
            fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<()> {
                MemoryResource::free_parked(&**self, addr, stream)
            }
            fn record_stream(&self, addr: u64, stream: StreamId) -> Result<()> {
                MemoryResource::record_stream(&**self, addr, stream)
            }
            fn trim(&self) -> Result<u64> {
                MemoryResource::trim(&**self)
            }
            fn stats(&self) -> Stats {
                MemoryResource::stats(&**self)
            }
            fn held(&self) -> [u64; 4] {
                MemoryResource::held(&**self)
            }
            fn reset_peak_stats(&self) {
                MemoryResource::reset_peak_stats(&**self)
            }
            fn snapshot(&self) -> Vec<PoolSegment> {
                MemoryResource::snapshot(&**self)
            }
            fn set_limit(&self, limit: Option<Limit>) -> Result<()> {
                MemoryResource::set_limit(&**self, limit)
            }
            fn alignment(&self) -> u64 {
                MemoryResource::alignment(&**self)
            }
            fn allocate_carved(&self, size: u64, stream: StreamId) -> Result<u64> {
                MemoryResource::allocate_carved(&**self, size, stream)
            }
            fn free_carved(&self, addr: u64, size: u64, users: &[StreamId]) -> Result<()> {
                MemoryResource::free_carved(&**self, addr, size, users)
            }
            fn watches_pieces(&self) -> bool {
                MemoryResource::watches_pieces(&**self)
            }
            fn piece(&self, addr: u64, size: u64, stream: StreamId, event: PieceEvent) -> Result<()> {
                MemoryResource::piece(&**self, addr, size, stream, event)
            }
        }
    )*};
}

forward_memory_resource!([] Pool, [R: MemoryResource + ?Sized] &R, [R: MemoryResource + ?Sized] Arc<R>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, SimDevice, SimMode};
    use crate::PoolConfig;

    fn pool() -> Pool {
        Pool::new(Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly)) as Arc<dyn Device>, PoolConfig::default()).unwrap()
    }

    /// Allocates, records a stream, frees and trims through any resource.
    fn round_trip(resource: &dyn MemoryResource) {
        let a = resource.allocate(4096, StreamId(0)).unwrap();
        assert_eq!(a % resource.alignment(), 0);
        resource.record_stream(a, StreamId(0)).unwrap();
        assert_eq!(resource.stats().allocation.current, 1);
        let active: Vec<_> = resource.snapshot().into_iter().filter(|s| s.segment.blocks.iter().any(|b| b.0 == a)).collect();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].pool, PoolId::MAIN);
        resource.free(a, Some(4096), None).unwrap();
        assert!(resource.free(a, Some(4096), None).is_err(), "a double free is refused");
        assert!(resource.trim().unwrap() > 0);
        resource.reset_peak_stats();
        assert_eq!(resource.stats().reserved_bytes.peak, 0);
    }

    #[test]
    fn the_pool_and_what_points_at_it_are_resources() {
        let p = pool();
        round_trip(&p);
        round_trip(&&p);
        round_trip(&Arc::new(pool()));
        let core: &PoolCore = &p;
        round_trip(core);
    }

    /// Frees through the cached lane as a C entry does: the lane, then what it leaves.
    fn free_by_lane(resource: &dyn MemoryResource, addr: u64, size: u64) -> Result<CachedFree> {
        let lane = resource.free_cached(addr, Some(size), None);
        match lane {
            CachedFree::Done => {}
            CachedFree::Parked => resource.free_parked(addr, None)?,
            CachedFree::Untouched => resource.free(addr, Some(size), None)?,
        }
        Ok(lane)
    }

    /// The cached lane hands out and takes back what `allocate` and `free` would, and leaves
    /// the rest to them, with nothing done.
    fn cached_lane(resource: &dyn MemoryResource) {
        let a = resource.allocate(512, StreamId(0)).unwrap();
        free_by_lane(resource, a, 512).unwrap();
        let b = resource.allocate(512, StreamId(0)).unwrap();
        assert_eq!(free_by_lane(resource, b, 512).unwrap(), CachedFree::Done, "a small block goes to the thread's cache");
        assert_eq!(resource.allocate_cached(512, StreamId(0)), Some(b), "and comes back from it");
        assert_eq!(resource.stats().allocation.current, 1);
        assert_eq!(resource.free_cached(b, Some(4096), None), CachedFree::Untouched, "a wrong size is left to free");
        assert!(resource.free(b, Some(4096), None).is_err());
        assert_eq!(resource.free_cached(b, Some(512), Some(StreamId(7))), CachedFree::Untouched, "so is another stream");
        assert_eq!(free_by_lane(resource, b, 512).unwrap(), CachedFree::Done);
        assert_eq!(resource.free_cached(b, Some(512), None), CachedFree::Untouched, "a double free is left to free");
        assert!(resource.free(b, Some(512), None).is_err(), "which refuses it");
        assert_eq!(resource.allocate_cached(8 << 20, StreamId(0)), None, "a large block is the general path's");
        let large = resource.allocate(8 << 20, StreamId(0)).unwrap();
        assert_eq!(free_by_lane(resource, large, 8 << 20).unwrap(), CachedFree::Parked, "out of the table, not cached");
        assert!(resource.free(large, Some(8 << 20), None).is_err(), "freed once only");
        assert_eq!(resource.stats().allocation.current, 0);
    }

    #[test]
    fn the_cached_lane_does_what_allocate_and_free_do() {
        let p = pool();
        cached_lane(&p);
        cached_lane(&Arc::new(pool()));
        let core: &PoolCore = &pool();
        cached_lane(core);
    }

    #[test]
    fn a_limit_set_through_the_trait_caps_the_pool() {
        let p = pool();
        MemoryResource::set_limit(&p, Some(Limit::Bytes(1 << 20))).unwrap();
        assert_eq!(p.capacity(), 1 << 20);
        assert!(MemoryResource::allocate(&p, 2 << 20, StreamId(0)).is_err());
        assert!(MemoryResource::set_limit(&p, Some(Limit::Fraction(1.5))).is_err());
    }

    #[test]
    fn pool_id_has_the_layout_of_a_pair_of_u64() {
        assert_eq!(std::mem::size_of::<PoolId>(), 16);
        assert_eq!(std::mem::align_of::<PoolId>(), 8);
    }
}
