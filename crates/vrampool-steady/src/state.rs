//! What the cold path keeps, under the planned pool's one lock, and its errors.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use foldhash::fast::FixedState;
use vrampool_core::{InvalidFreeReason, PoolError, StreamId};

use crate::ahead::Ahead;
use crate::figures::Figures;
use crate::idle::{Backoff, Probes, WastedPlans};
use crate::peaks::Peaks;
use crate::record::Recorder;
use crate::regions::Regions;
use crate::schedule::{Recorded, Schedule};
use crate::serving::Serving;

/// An arena buffer live outside a served iteration: its iteration left the schedule, or ended, while
/// it lived.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loose {
    pub(crate) size: u64,
    pub(crate) stream: StreamId,
    /// Used on another stream (`record_stream`): its bytes are scrubbed when its region goes back,
    /// after that stream's work, not at its free.
    pub(crate) used_elsewhere: bool,
}

/// Everything the cold path keeps, under the lock.
pub(crate) struct Cold {
    /// The iteration's key (`AUTO_KEY` until its first allocation names it).
    pub(crate) key: u64,
    /// The caller named the key (`step(key)`): an iteration that leaves its schedule at once is a
    /// fallback, not another schedule's start.
    pub(crate) named: bool,
    pub(crate) plans: HashMap<u64, Arc<Schedule>, FixedState>,
    /// Recordings not planned yet, by key: a key's recording is planned when an iteration of the key
    /// starts again, so a program whose iterations never repeat never pays for a plan.
    pub(crate) pending: HashMap<u64, Vec<Recorded>, FixedState>,
    /// The epoch's serving state, while serving.
    pub(crate) serving: Option<Arc<Serving>>,
    pub(crate) epoch: u32,
    /// `PlannedPool::wraps` when the epoch began.
    pub(crate) wraps_at_epoch: u64,
    pub(crate) recorder: Recorder,
    pub(crate) regions: Regions,
    pub(crate) loose: HashMap<u64, Loose, FixedState>,
    /// Birth times of live arena buffers (ns since `started`), where the pool watches its blocks.
    pub(crate) births: HashMap<u64, u64, FixedState>,
    pub(crate) figures: Figures,
    pub(crate) backoff: Backoff,
    pub(crate) probes: Probes,
    pub(crate) wasted: WastedPlans,
    /// A plan made ahead, where one is set (`set_ahead`).
    pub(crate) ahead: Option<Ahead>,
    /// Free steps of the served iteration taken ahead of their turn: frees of one group
    /// (between two allocations) may come in any order. Non-empty only while the word is held.
    pub(crate) early: BTreeSet<usize>,
    pub(crate) peaks: Peaks,
}

pub(crate) fn not_allocated(addr: u64) -> PoolError {
    PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated }
}

pub(crate) fn wrong_size(addr: u64, expected: u64, given: u64) -> PoolError {
    PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::WrongSize { expected, given } }
}
