//! CuPy's `MemoryPool` (`SingleDeviceMemoryPool`): per-stream arenas of free chunks binned by
//! size, best fit with splitting, and exact-size device allocations that are freed, when whole,
//! on out of memory.
//!
//! Rules from cupy/cupy `cupy/cuda/memory.pyx` (CuPy 13, commit 005d7598); each rule names the
//! method it comes from.

use std::sync::Arc;

use super::held::{BlockModel, Held, StreamOrder};
use super::parse_size;
use vrampool_core::device::Device;
use vrampool_core::error::PoolError;
use vrampool_core::sizes::round_up;

/// `ALLOCATION_UNIT_SIZE`: `_round_size` rounds every request up to 512 B.
const UNIT: u64 = 512;

/// `set_limit` (or `CUPY_GPU_MEMORY_LIMIT`): the most the pool may hold from the device.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CupyOptions {
    pub limit: Option<u64>,
}

impl CupyOptions {
    pub const KEYS: [&'static str; 1] = ["limit"];

    pub(super) fn apply(&mut self, key: &str, value: &str) -> Option<Result<(), String>> {
        (key == "limit").then(|| parse_size(value).map(|v| self.limit = Some(v)))
    }
}

pub(super) struct Cupy {
    held: Held,
    limit: Option<u64>,
    /// Arenas by stream (`_arenas`).
    arenas: StreamOrder,
}

impl Cupy {
    pub fn new(options: CupyOptions, device: Arc<dyn Device>) -> Self {
        Self { held: Held::new(device), limit: options.limit, arenas: StreamOrder::default() }
    }

    /// `free_all_blocks`: every free chunk that is a whole allocation, in every arena.
    fn free_all_blocks(&mut self) {
        for n in self.held.blocks.all_free() {
            if self.held.blocks.is_whole(n) {
                self.held.release_segment(n);
            }
        }
    }

    /// `_try_malloc`: the limit is checked first (no retry past it); a device failure frees all
    /// blocks and tries again (twice, the second after `gc.collect()`, which frees nothing more
    /// here).
    fn try_malloc(&mut self, size: u64, arena: u32) -> Option<u32> {
        if self.limit.is_some_and(|limit| limit != 0 && self.held.figures.reserved.saturating_add(size) > limit) {
            return None;
        }
        if let Some(n) = self.held.new_segment(arena, size) {
            return Some(n);
        }
        self.free_all_blocks();
        self.held.figures.alloc_retries += 1;
        self.held.new_segment(arena, size)
    }
}

/// `free`: merged with the next and the previous chunk when they are free in the arena, as
/// [`Held::free`] does.
impl BlockModel for Cupy {
    fn held(&self) -> &Held {
        &self.held
    }

    fn held_mut(&mut self) -> &mut Held {
        &mut self.held
    }

    /// `_malloc`: `_get_chunk` (the smallest bin that fits; within a bin CuPy pops any chunk, the
    /// model the lowest address), split with the remainder back in the arena; else `_try_malloc`
    /// of exactly the rounded size.
    fn serve(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        let size = round_up(size.max(1), UNIT).unwrap_or(u64::MAX);
        let arena = self.arenas.list(stream);
        let found = match self.held.blocks.best_fit(arena, size) {
            Some(n) => Some(n),
            None => self.try_malloc(size, arena),
        };
        let Some(n) = found else {
            return Err(self.held.out_of_memory(size, self.limit));
        };
        self.held.figures.allocate(size);
        Ok(self.held.blocks.hand_out(n, size))
    }

    fn release_cache(&mut self) {
        self.free_all_blocks();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::PeerModel;
    use vrampool_core::device::{SimDevice, SimMode};
    use vrampool_core::sizes::MIB;

    fn cupy(capacity: u64, limit: Option<u64>) -> Cupy {
        Cupy::new(CupyOptions { limit }, Arc::new(SimDevice::new(capacity, SimMode::AddressOnly)))
    }

    #[test]
    fn device_allocations_are_the_rounded_request_and_chunks_split() {
        let mut pool = cupy(1 << 30, None);
        let a = pool.allocate(1000, 0).unwrap();
        assert_eq!(pool.figures().reserved, 1024, "no segment rounding: exactly 512 B multiples");
        pool.free(a).unwrap();
        // A smaller request splits the cached chunk: 512 B used, 512 B left in the arena.
        let b = pool.allocate(100, 0).unwrap();
        let c = pool.allocate(300, 0).unwrap();
        assert_eq!((b, c, pool.figures().reserved), (a, a + 512, 1024));
        // Other streams have their own arenas.
        pool.free(c).unwrap();
        pool.allocate(300, 1).unwrap();
        assert_eq!(pool.figures().reserved, 1536);
    }

    #[test]
    fn out_of_memory_frees_whole_free_chunks_and_retries() {
        let mut pool = cupy(13 * MIB, None);
        let a = pool.allocate(4 * MIB, 0).unwrap();
        let b = pool.allocate(4 * MIB, 0).unwrap();
        pool.free(a).unwrap();
        // Split chunks stay: `a`'s segment is cut by `part`, so only it cannot go back.
        let part = pool.allocate(MIB, 0).unwrap();
        pool.free(b).unwrap();
        pool.allocate(8 * MIB, 1).unwrap();
        assert_eq!((pool.figures().reserved, pool.figures().alloc_retries), (12 * MIB, 1));
        let _ = part;
        // Past the limit there is no retry.
        let mut limited = cupy(1 << 30, Some(2 * MIB));
        let x = limited.allocate(MIB, 0).unwrap();
        limited.free(x).unwrap();
        assert!(limited.allocate(2 * MIB, 0).is_err());
        assert_eq!(limited.figures().reserved, MIB);
    }
}
