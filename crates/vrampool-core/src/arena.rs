//! One stream's memory: a strategy instance per tier, each behind its own lock, the lock-free
//! magazines of cached blocks (`magazine.rs`) in front of them, and the expandable segments of
//! the pool's expandable tier (`expandable.rs`).
//!
//! Blocks belong to the stream they were allocated on and go back to that stream's arena, so a
//! block freed on a stream is reusable at once on that stream and on no other (PyTorch's
//! per-stream pools). Memory moves between streams only as whole segments given back to the device.

use std::sync::atomic::{
    AtomicBool,
    Ordering::{AcqRel, Relaxed, Release},
};

use parking_lot::Mutex;

use crate::config::PoolConfig;
use crate::device::StreamId;
use crate::expandable::VmArena;
use crate::kept_run::KeptRun;
use crate::magazine::Magazines;
use crate::strategy::{BestFit, BestFitConfig, Buddy, BuddyConfig, Slab, SlabConfig, Strategy, StrategyKind};

/// Blocks up to this size are cached, in every tier: a training loop asks for the same sizes each
/// step, and a cached block comes back without the tier's lock. Larger blocks are rare enough
/// that the lock costs nothing beside their use.
pub const CACHED_MAX: u64 = 1 << 30;

pub struct Arena {
    pub stream: StreamId,
    pub tiers: Box<[Mutex<Box<dyn Strategy>>]>,
    pub magazines: Magazines,
    /// Per tier: the magazines may hold some of its large blocks (set after a push, cleared by
    /// the drain that files them back), so that a tier with none skips the scan.
    large_cached: Box<[AtomicBool]>,
    /// The first tier's kept run (see `PoolConfig::first_tier_cached_max`). One slot is enough:
    /// the tier files it back whenever it is locked to change (`PoolCore::lock_tier`).
    pub kept_run: KeptRun,
    /// The expandable segments of the tier `Expandable::tier` names (none unless the pool has
    /// expandable segments).
    vm: Mutex<VmArena>,
}

impl Arena {
    pub fn new(stream: StreamId, tiers: Vec<Box<dyn Strategy>>) -> Self {
        let large_cached = tiers.iter().map(|_| AtomicBool::new(false)).collect();
        Self {
            stream,
            tiers: tiers.into_iter().map(Mutex::new).collect(),
            magazines: Magazines::new(CACHED_MAX),
            large_cached,
            kept_run: KeptRun::default(),
            vm: Mutex::default(),
        }
    }

    /// Runs `f` on the arena's expandable segments. Callers hold the expandable tier's lock (but
    /// the pool's drop, which is alone), so that the strategy's view and the mappings change
    /// together, and this lock is never contended.
    pub fn with_vm<R>(&self, f: impl FnOnce(&mut VmArena) -> R) -> R {
        f(&mut self.vm.lock())
    }

    /// Notes that a large block of `tier` was just cached (after the push). The mark is a hint:
    /// a block pushed while another thread drains may be missed by both, and then stays cached
    /// until a hit, a trim or a growth takes it; never lost.
    pub fn note_large_cached(&self, tier: u8) {
        let mark = &self.large_cached[tier as usize];
        // A plain load first: the line stays shared while the mark is already set.
        if !mark.load(Relaxed) {
            mark.store(true, Release);
        }
    }

    /// Clears the mark of `tier`; true if it was set (some large blocks may be cached).
    pub fn take_large_cached(&self, tier: u8) -> bool {
        self.large_cached[tier as usize].swap(false, AcqRel)
    }
}

impl Arena {
    /// A stream's arena with the tiers of `config`'s strategy.
    pub(crate) fn for_config(config: &PoolConfig, stream: StreamId) -> Self {
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
}
