//! RMM's `pool_memory_resource`: a coalescing best fit over blocks obtained from upstream (the
//! device), with one free list per stream.
//!
//! Rules from rapidsai/rmm `include/rmm/mr/device/pool_memory_resource.hpp` and
//! `detail/stream_ordered_memory_resource.hpp`, `detail/coalescing_free_list.hpp` (RMM 24.x,
//! commit 2c8ca92e); each rule names the function it comes from. The pool never gives memory
//! back before it is destroyed, so it has no release-and-retry: a growth that fails is an
//! out-of-memory error.

use std::sync::Arc;

use super::held::{BlockModel, Held, StreamOrder};
use super::parse_size;
use vrampool_core::device::Device;
use vrampool_core::error::PoolError;
use vrampool_core::sizes::round_up;

/// `rmm::CUDA_ALLOCATION_ALIGNMENT`: requests are rounded up to 256 B (`do_allocate`).
const ALIGNMENT: u64 = 256;

/// The constructor's sizes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RmmOptions {
    /// The pool made up front; by default half the device's memory, as the Python
    /// `rmm.reinitialize(pool_allocator=True)` chooses (0 when the replay's device has no
    /// capacity to take half of).
    pub initial_pool_size: Option<u64>,
    /// The most the pool may grow to (unlimited by default).
    pub maximum_pool_size: Option<u64>,
}

impl RmmOptions {
    pub const KEYS: [&'static str; 2] = ["initial_pool_size", "maximum_pool_size"];

    pub(super) fn apply(&mut self, key: &str, value: &str) -> Option<Result<(), String>> {
        let size = parse_size(value);
        Some(match key {
            "initial_pool_size" => size.map(|v| self.initial_pool_size = Some(v)),
            "maximum_pool_size" => size.map(|v| self.maximum_pool_size = Some(v)),
            _ => return None,
        })
    }
}

pub(super) struct Rmm {
    held: Held,
    maximum: Option<u64>,
    /// Free lists by stream (`stream_free_blocks_`).
    streams: StreamOrder,
    pool_size: u64,
    /// The initial pool could not be made: every allocation fails, as the constructor would have.
    broken: bool,
}

impl Rmm {
    /// `initialize_pool`: the initial block goes to the default stream's free list.
    pub fn new(options: RmmOptions, device: Arc<dyn Device>, capacity: Option<u64>) -> Self {
        let initial = options.initial_pool_size.unwrap_or_else(|| capacity.map_or(0, |c| round_up(c / 2, ALIGNMENT).unwrap_or(c)));
        let mut rmm = Self {
            held: Held::new(device),
            maximum: options.maximum_pool_size,
            streams: StreamOrder::starting_with(0),
            pool_size: 0,
            broken: false,
        };
        if initial > 0 {
            rmm.broken = rmm.maximum.is_some_and(|m| initial > m) || rmm.try_to_expand(initial, initial, 0).is_none();
        }
        rmm
    }

    /// `size_to_grow`: half the way to the maximum, or the pool's size again (doubling).
    fn size_to_grow(&self, size: u64) -> u64 {
        match self.maximum {
            Some(maximum) => {
                let remaining = round_up(maximum.saturating_sub(self.pool_size), ALIGNMENT).unwrap_or(u64::MAX);
                if size <= remaining {
                    size.max(remaining / 2)
                } else {
                    0
                }
            }
            None => size.max(self.pool_size),
        }
    }

    /// `try_to_expand`: an upstream block of `try_size`, halving on failure down to `min_size`.
    fn try_to_expand(&mut self, mut try_size: u64, min_size: u64, list: u32) -> Option<u32> {
        while try_size >= min_size && try_size > 0 {
            if let Some(n) = self.held.new_segment(list, try_size) {
                self.pool_size += try_size;
                return Some(n);
            }
            if try_size == min_size {
                break;
            }
            try_size = min_size.max(try_size / 2);
        }
        None
    }

    /// `get_block`: the stream's own list, then a block from another stream's list, then every
    /// other list merged into this one, then growth.
    fn get_block(&mut self, size: u64, list: u32) -> Option<u32> {
        if let Some(n) = self.held.blocks.best_fit(list, size) {
            return Some(n);
        }
        let others: Vec<u32> = (0..self.streams.len()).filter(|&l| l != list).collect();
        // `get_block_from_other_stream(merge_first = false)`: the remainder stays on that list.
        if let Some(n) = others.iter().find_map(|&other| self.held.blocks.best_fit(other, size)) {
            return Some(n);
        }
        // `merge_first = true`: another stream's blocks join this list, coalescing as they come.
        for other in others {
            for n in self.held.blocks.free_blocks(other) {
                self.held.blocks.set_pool(n, list);
                self.held.blocks.coalesce(n);
            }
            if let Some(n) = self.held.blocks.best_fit(list, size) {
                return Some(n);
            }
        }
        // `expand_pool`.
        self.try_to_expand(self.size_to_grow(size), size, list)
    }
}

/// `do_deallocate`: into the free list of the stream it was allocated on (the trace's frees name
/// no other), merged with contiguous free blocks of the same upstream block, as [`Held::free`]
/// does.
impl BlockModel for Rmm {
    fn held(&self) -> &Held {
        &self.held
    }

    fn held_mut(&mut self) -> &mut Held {
        &mut self.held
    }

    fn serve(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        let size = round_up(size, ALIGNMENT).unwrap_or(u64::MAX);
        let list = self.streams.list(stream);
        let found = if self.broken { None } else { self.get_block(size, list) };
        let Some(n) = found else {
            return Err(self.held.out_of_memory(size, self.maximum));
        };
        // `allocate_from_block`: any remainder goes back to the list the block came from; the
        // block itself is freed to the list of the stream it was allocated on.
        let addr = self.held.blocks.hand_out(n, size);
        self.held.blocks.set_pool(n, list);
        self.held.figures.allocate(size);
        Ok(addr)
    }

    /// Nothing: the pool keeps what it took from upstream until it is destroyed.
    fn release_cache(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::PeerModel;
    use vrampool_core::device::{SimDevice, SimMode};
    use vrampool_core::sizes::{GIB, MIB};

    fn rmm(initial: Option<u64>, maximum: Option<u64>, capacity: u64) -> Rmm {
        Rmm::new(
            RmmOptions { initial_pool_size: initial, maximum_pool_size: maximum },
            Arc::new(SimDevice::new(capacity, SimMode::AddressOnly)),
            Some(capacity),
        )
    }

    #[test]
    fn the_initial_pool_is_half_the_device_and_serves_best_fit() {
        let mut pool = rmm(None, None, 8 * GIB);
        assert_eq!(pool.figures().reserved, 4 * GIB);
        let a = pool.allocate(100, 0).unwrap();
        let b = pool.allocate(MIB, 0).unwrap();
        assert_eq!(b, a + 256, "256 B alignment");
        pool.free(a).unwrap();
        // The 256 B hole is the best fit for a 200 B request.
        assert_eq!(pool.allocate(200, 0).unwrap(), a);
        assert_eq!(pool.figures().device_allocs, 1);
    }

    #[test]
    fn growth_doubles_without_a_maximum_and_halves_the_way_with_one() {
        let mut pool = rmm(Some(0), None, 64 * GIB);
        pool.allocate(100 * MIB, 0).unwrap();
        assert_eq!(pool.figures().reserved, 100 * MIB, "from nothing, the first growth is the request");
        pool.allocate(150 * MIB, 0).unwrap();
        assert_eq!(pool.figures().reserved, 250 * MIB, "then max(request, pool size)");
        pool.allocate(10 * MIB, 0).unwrap();
        assert_eq!(pool.figures().reserved, 250 * MIB + 250 * MIB);
        let mut capped = rmm(Some(0), Some(GIB), 64 * GIB);
        capped.allocate(100 * MIB, 0).unwrap();
        assert_eq!(capped.figures().reserved, 512 * MIB, "half the way to the maximum");
        // 500 MiB fits neither the 412 MiB left nor half the remaining 512 MiB: the request itself.
        capped.allocate(500 * MIB, 0).unwrap();
        assert_eq!(capped.figures().reserved, 1012 * MIB);
        assert!(matches!(capped.allocate(500 * MIB, 0), Err(PoolError::OutOfMemory(_))), "never past the maximum");
    }

    #[test]
    fn a_failed_growth_halves_down_to_the_request_and_memory_is_never_given_back() {
        let mut pool = rmm(Some(0), None, GIB);
        let a = pool.allocate(600 * MIB, 0).unwrap();
        // Doubling would ask for 600 MiB more: it halves to 300 MiB, which fits.
        pool.allocate(200 * MIB, 0).unwrap();
        assert_eq!(pool.figures().reserved, 900 * MIB);
        pool.free(a).unwrap();
        // 700 MiB fits nowhere: the cached 600 MiB is not given back to make room.
        assert!(matches!(pool.allocate(700 * MIB, 0), Err(PoolError::OutOfMemory(r)) if r.reserved == 900 * MIB));
    }

    #[test]
    fn other_streams_lists_are_searched_before_growing() {
        let mut pool = rmm(Some(64 * MIB), None, GIB);
        let a = pool.allocate(10 * MIB, 1).unwrap();
        assert_eq!(pool.figures().reserved, 64 * MIB, "stream 1 took a block from the default stream's list");
        pool.free(a).unwrap();
        // Stream 1's freed block and stream 0's rest do not merge while on different lists...
        pool.allocate(60 * MIB, 0).unwrap();
        // ...until stream 0 finds nothing that fits and merges stream 1's list into its own.
        assert_eq!(pool.figures().reserved, 64 * MIB);
    }

    #[test]
    fn fragmentation_is_one_less_the_largest_free_block_over_the_free_bytes() {
        // The `frag` column of every replay table.
        let mut pool = rmm(Some(64 * MIB), None, GIB);
        assert_eq!(pool.fragmentation(), 0.0, "one free block");
        let [a, b, c] = [0; 3].map(|_| pool.allocate(16 * MIB, 0).unwrap());
        pool.free(b).unwrap();
        assert_eq!(pool.fragmentation(), 0.5, "b's 16 MiB and the tail's 16 MiB, apart");
        pool.free(a).unwrap();
        assert!((pool.fragmentation() - 1.0 / 3.0).abs() < 1e-12, "a merged with b: 32 MiB and 16 MiB");
        pool.free(c).unwrap();
        assert_eq!(pool.fragmentation(), 0.0, "all one block again");
    }

    #[test]
    fn an_initial_pool_too_large_for_the_device_fails_every_allocation() {
        let mut pool = rmm(Some(2 * GIB), None, GIB);
        assert!(pool.allocate(1, 0).is_err());
    }
}
