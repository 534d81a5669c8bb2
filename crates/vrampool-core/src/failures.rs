//! The record of failed calls, for an interface that cannot return errors (a C ABI answers null
//! or nothing): the last error's message, the last out-of-memory's figures, and counts by kind.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::device::StreamId;
use crate::error::{human, ArenaHeld, OomReport, PoolError};
use crate::pool::PoolCore;
use crate::stats::Stats;

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An allocation that returned nothing.
    Malloc,
    /// A free refused (double free, foreign pointer, wrong size).
    Free,
    /// A `record_stream` of something that is no live block.
    RecordStream,
    /// Any other refused call (configuration, limits, private pools, ...).
    Other,
    /// A panic caught at the interface.
    Panic,
}

impl Failure {
    pub const ALL: [Failure; 5] = [Self::Malloc, Self::Free, Self::RecordStream, Self::Other, Self::Panic];

    /// The name its count goes by.
    pub fn name(self) -> &'static str {
        match self {
            Self::Malloc => "failed_mallocs",
            Self::Free => "refused_frees",
            Self::RecordStream => "refused_record_streams",
            Self::Other => "other_errors",
            Self::Panic => "panics",
        }
    }
}

/// The figures of an allocation that failed for want of memory, and its message (the text of
/// the exception PyTorch raises).
#[derive(Debug, Clone, PartialEq)]
pub struct OomRecord {
    pub device: i32,
    pub stream: StreamId,
    pub report: OomReport,
    /// The most the pool may reserve (the limit, or the device's memory).
    pub capacity: u64,
    /// The request is larger than the pool could ever hold (no retry could help).
    pub too_large: bool,
    pub strategy: &'static str,
    pub round_up_divisions: u32,
    pub num_ooms: u64,
    pub message: String,
}

impl OomRecord {
    /// The record of `error`, the failure of an allocation of `size` bytes on `device`'s `pool`
    /// (whose figures, with any beside it, are `stats`), if it is for want of memory: out of
    /// memory, or a size above what the pool may ever reserve. `limited`: a limit is set.
    pub fn of(error: &PoolError, device: i32, stream: StreamId, size: u64, pool: &PoolCore, stats: &Stats, limited: bool) -> Option<Self> {
        let capacity = pool.capacity();
        let (mut report, too_large) = match error {
            PoolError::OutOfMemory(report) => (*report, pool.config().padded(size).is_none_or(|rounded| rounded > capacity)),
            PoolError::InvalidSize { .. } => {
                let report = OomReport {
                    requested: size,
                    block: 0,
                    allocated: stats.allocated_bytes.current,
                    reserved: stats.reserved_bytes.current,
                    largest_free: stats.largest_free_bytes,
                    device_free: pool.device().mem_info().map(|m| m.free).unwrap_or(0),
                    limit: None,
                    arena: ArenaHeld::default(),
                };
                (report, true)
            }
            _ => return None,
        };
        report.limit = limited.then_some(capacity);
        let mut message = format!("CUDA out of memory. vrampool could not allocate {} on device {device}: ", human(report.requested));
        if too_large {
            message.push_str(&format!("the request is larger than the pool may ever reserve ({}); ", human(capacity)));
        }
        message.push_str(&format!("{report}. vrampool.torch.last_oom() says what to try."));
        let config = pool.config();
        Some(Self {
            device,
            stream,
            report,
            capacity,
            too_large,
            strategy: config.strategy.name(),
            round_up_divisions: config.round_up_divisions,
            num_ooms: stats.num_ooms,
            message,
        })
    }

    /// Reserved bytes no block uses.
    pub fn free(&self) -> u64 {
        self.report.unallocated()
    }

    /// 1 - largest free block / free bytes: 0 when the free memory is one block.
    pub fn fragmentation(&self) -> f64 {
        crate::stats::fragmentation(self.report.largest_free, self.free())
    }
}

/// The last error, the last out-of-memory and the count of each kind of failure.
pub struct FailureLog {
    last_error: Mutex<Option<String>>,
    last_oom: Mutex<Option<OomRecord>>,
    counts: [AtomicU64; Failure::ALL.len()],
}

impl Default for FailureLog {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FailureLog {
    pub const fn new() -> Self {
        Self { last_error: Mutex::new(None), last_oom: Mutex::new(None), counts: [const { AtomicU64::new(0) }; Failure::ALL.len()] }
    }

    /// Counts a failure of `kind`; `message`, when given, becomes the last error.
    pub fn record(&self, kind: Failure, message: Option<String>) {
        self.counts[kind as usize].fetch_add(1, Relaxed);
        if let Some(message) = message {
            *lock(&self.last_error) = Some(message);
        }
    }

    /// Keeps `oom` as the last out-of-memory (its message is recorded with the failure).
    pub fn record_oom(&self, oom: OomRecord) {
        *lock(&self.last_oom) = Some(oom);
    }

    pub fn count(&self, kind: Failure) -> u64 {
        self.counts[kind as usize].load(Relaxed)
    }

    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    pub fn last_oom(&self) -> Option<OomRecord> {
        lock(&self.last_oom).clone()
    }

    /// Forgets the last error and the last out-of-memory.
    pub fn clear(&self) {
        *lock(&self.last_error) = None;
        *lock(&self.last_oom) = None;
    }

    /// Forgets everything, the counts too.
    pub fn reset(&self) {
        self.clear();
        self.counts.iter().for_each(|c| c.store(0, Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limit;
    use crate::device::{Device, SimDevice, SimMode};
    use crate::{Pool, PoolConfig};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    #[test]
    fn failures_are_counted_by_kind_and_the_last_message_kept() {
        let log = FailureLog::new();
        log.record(Failure::Free, Some("first".into()));
        log.record(Failure::Free, Some("second".into()));
        log.record(Failure::Panic, None);
        assert_eq!(Failure::ALL.map(|k| log.count(k)), [0, 2, 0, 0, 1]);
        assert_eq!(log.last_error().as_deref(), Some("second"));
        log.clear();
        assert_eq!((log.last_error(), log.count(Failure::Free)), (None, 2));
        log.reset();
        assert_eq!(log.count(Failure::Free), 0);
        assert_eq!(
            Failure::ALL.map(Failure::name),
            ["failed_mallocs", "refused_frees", "refused_record_streams", "other_errors", "panics"]
        );
    }

    #[test]
    fn an_out_of_memory_is_recorded_with_its_figures_and_message() {
        let device: Arc<dyn Device> = Arc::new(SimDevice::new(64 * MIB, SimMode::AddressOnly));
        let config = PoolConfig { expandable: false, ..PoolConfig::default() };
        let pool = Pool::new(device, config).unwrap();
        let a = pool.allocate(40 * MIB, StreamId(0)).unwrap();
        let err = pool.allocate(40 * MIB, StreamId(3)).unwrap_err();
        let stats = pool.stats();
        let oom = OomRecord::of(&err, 2, StreamId(3), 40 * MIB, &pool, &stats, false).unwrap();
        assert_eq!((oom.device, oom.stream, oom.too_large, oom.capacity, oom.num_ooms), (2, StreamId(3), false, 64 * MIB, 1));
        assert_eq!((oom.report.requested, oom.report.limit, oom.strategy), (40 * MIB, None, "hybrid"));
        assert!(
            oom.message.starts_with("CUDA out of memory. vrampool could not allocate 40.00 MiB on device 2: tried to allocate"),
            "{}",
            oom.message
        );
        assert!(oom.fragmentation() >= 0.0 && oom.free() == oom.report.reserved - oom.report.allocated);
        pool.free(a, None, None).unwrap();

        pool.set_limit(Some(Limit::Bytes(16 * MIB))).unwrap();
        let err = pool.allocate(32 * MIB, StreamId(0)).unwrap_err();
        let too_large = OomRecord::of(&err, 0, StreamId(0), 32 * MIB, &pool, &pool.stats(), true).unwrap();
        assert!(too_large.too_large && too_large.report.limit == Some(16 * MIB));
        assert!(too_large.message.contains("larger than the pool may ever reserve (16.00 MiB)"), "{}", too_large.message);
        assert!(OomRecord::of(&PoolError::Closed, 0, StreamId(0), 1, &pool, &pool.stats(), false).is_none());
    }
}
