//! What the block-list models (PyTorch's and the driver's, RMM's, CuPy's) have in common: the
//! device they take memory from, their blocks and their figures ([`Held`]), the free lists they
//! number by stream ([`StreamOrder`]), and the part of [`PeerModel`] that follows from these
//! alone ([`BlockModel`]).

use std::sync::Arc;

use super::blocks::{BlockList, State};
use super::{Figures, PeerModel};
use vrampool_core::device::Device;
use vrampool_core::error::{ArenaHeld, OomReport, PoolError};

/// What a model holds: the device, the blocks cut from what it took from it, and the figures.
pub(super) struct Held {
    pub device: Arc<dyn Device>,
    pub blocks: BlockList,
    pub figures: Figures,
}

impl Held {
    pub fn new(device: Arc<dyn Device>) -> Self {
        Self { device, blocks: BlockList::default(), figures: Figures::default() }
    }

    /// Frees the allocated block at `addr` into its free list, merged with its free neighbours;
    /// returns the merged block.
    pub fn free(&mut self, addr: u64) -> Result<u32, PoolError> {
        let (merged, size) = self.blocks.free(addr)?;
        self.figures.free(size);
        Ok(merged)
    }

    /// A device allocation of `size` bytes, as one free block of free list `pool`; None when the
    /// device has no room.
    pub fn new_segment(&mut self, pool: u32, size: u64) -> Option<u32> {
        let base = self.device.alloc_segment(size).ok()?;
        self.figures.reserve(size);
        Some(self.blocks.add_segment(pool, base, size, State::Free))
    }

    /// Gives free block `n`, a whole device allocation, back to the device.
    pub fn release_segment(&mut self, n: u32) {
        let (base, size) = self.blocks.remove_segment(n);
        let _ = self.device.free_segment(base, size);
        self.figures.release(size);
    }

    /// The out-of-memory error of a request for `requested` bytes under `limit`.
    pub fn out_of_memory(&self, requested: u64, limit: Option<u64>) -> PoolError {
        PoolError::OutOfMemory(OomReport {
            requested,
            block: 0,
            allocated: self.figures.allocated,
            reserved: self.figures.reserved,
            largest_free: self.blocks.free_summary().0,
            device_free: self.device.mem_info().map(|m| m.free).unwrap_or(0),
            limit,
            arena: ArenaHeld::default(),
        })
    }
}

/// Free lists by stream, numbered in the order the streams first appear.
#[derive(Debug, Default)]
pub(super) struct StreamOrder {
    streams: Vec<u64>,
}

impl StreamOrder {
    /// Numbers `stream`'s list 0 before any request names it.
    pub fn starting_with(stream: u64) -> Self {
        Self { streams: vec![stream] }
    }

    /// The number of `stream`'s list, a new one if the stream is new.
    pub fn list(&mut self, stream: u64) -> u32 {
        match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i as u32,
            None => {
                self.streams.push(stream);
                (self.streams.len() - 1) as u32
            }
        }
    }

    /// How many lists there are.
    pub fn len(&self) -> u32 {
        self.streams.len() as u32
    }
}

/// A model over [`Held`]: it says how it serves a request, what else a free does and how it
/// empties its cache; freeing, the figures and the fragmentation of [`PeerModel`] are those of
/// what it holds.
///
/// The methods have names of their own, not [`PeerModel`]'s, so that a call on a model names
/// one method whichever of the two traits is in scope.
pub(super) trait BlockModel: Send {
    fn held(&self) -> &Held;
    fn held_mut(&mut self) -> &mut Held;
    /// [`PeerModel::allocate`].
    fn serve(&mut self, size: u64, stream: u64) -> Result<u64, PoolError>;
    /// What follows a free, given the block the freed one merged into: nothing by default.
    fn after_free(&mut self, _merged: u32) {}
    /// [`PeerModel::empty_cache`].
    fn release_cache(&mut self);
}

impl<M: BlockModel> PeerModel for M {
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError> {
        self.serve(size, stream)
    }

    fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        let merged = self.held_mut().free(addr)?;
        self.after_free(merged);
        Ok(())
    }

    fn figures(&self) -> Figures {
        self.held().figures
    }

    fn fragmentation(&self) -> f64 {
        self.held().blocks.fragmentation()
    }

    fn empty_cache(&mut self) {
        self.release_cache();
    }
}
