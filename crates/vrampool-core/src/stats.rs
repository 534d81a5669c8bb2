//! Counters with PyTorch's key names (`allocated_bytes.all.current`, ...). The ones every alloc
//! and free touches are kept per thread and summed on read; the rest are shared atomics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError};

use crossbeam_utils::sync::ShardedLock;

/// current / peak / allocated (cumulative in) / freed (cumulative out), as PyTorch keeps them.
///
/// Only the two cumulative totals are counted; `current` is their difference. That is one atomic
/// read-modify-write per update instead of two, on the fast path of every alloc and free.
#[derive(Default)]
pub struct Counter {
    allocated: CachePadded<AtomicU64>,
    freed: CachePadded<AtomicU64>,
    peak: CachePadded<AtomicU64>,
}

/// Keeps each total on its own cache line, so that allocs and frees on different cores do not
/// invalidate each other's line for nothing.
#[derive(Default)]
#[repr(align(128))]
struct CachePadded<T>(T);

impl Counter {
    pub fn add(&self, n: u64) {
        let now = (self.allocated.0.fetch_add(n, Relaxed) + n).wrapping_sub(self.freed.0.load(Relaxed));
        // A plain load first: the peak line stays shared between cores until a new peak is set.
        // `now` may lag a concurrent free (never lead it), so the peak is never overstated.
        if now > self.peak.0.load(Relaxed) && now < 1 << 63 {
            self.peak.0.fetch_max(now, Relaxed);
        }
    }

    pub fn sub(&self, n: u64) {
        self.freed.0.fetch_add(n, Relaxed);
    }

    pub fn current(&self) -> u64 {
        // Freed first: a free is always counted after its alloc, so this never goes negative.
        let freed = self.freed.0.load(Relaxed);
        self.allocated.0.load(Relaxed).saturating_sub(freed)
    }

    fn reset_peak(&self) {
        self.peak.0.store(self.current(), Relaxed);
    }

    fn read(&self) -> CounterValues {
        let freed = self.freed.0.load(Relaxed);
        let allocated = self.allocated.0.load(Relaxed);
        let current = allocated.saturating_sub(freed);
        CounterValues { current, peak: self.peak.0.load(Relaxed).max(current), allocated, freed }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterValues {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

/// The counters every alloc and free touches, kept per thread (see `FastCounters`), and the few
/// that the others are read with. A fast-path pair updates six: active bytes and cache hits are
/// derived on read (active = allocated + pending frees; hits = blocks - misses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fast {
    AllocatedIn,
    AllocatedOut,
    RequestedIn,
    RequestedOut,
    BlocksIn,
    BlocksOut,
    /// Bytes of frees deferred until other streams' work passes the block, and of those done.
    PendingIn,
    PendingOut,
    /// Blocks handed out by a strategy, not from a cache.
    Misses,
}

const FAST: usize = 9;

/// One thread's cumulative totals. Only the owning thread writes them, with a plain load and
/// store (no read-modify-write, so no locked instruction and no cache line shared for writing);
/// other threads only read them.
#[derive(Default)]
#[repr(align(128))]
pub struct LocalCounters {
    totals: [AtomicU64; FAST],
}

impl LocalCounters {
    /// Adds `n` to counter `which`. Only the owning thread may call this.
    pub fn bump_owned(&self, which: Fast, n: u64) {
        let total = &self.totals[which as usize];
        total.store(total.load(Relaxed).wrapping_add(n), Relaxed);
    }

    fn bump_shared(&self, which: Fast, n: u64) {
        self.totals[which as usize].fetch_add(n, Relaxed);
    }

    fn get(&self, which: usize) -> u64 {
        self.totals[which].load(Relaxed)
    }
}

/// The fast-path counters: a `LocalCounters` per thread, summed on read, plus a shared set for
/// threads whose thread-local storage is gone (updated with read-modify-writes) and for the totals
/// of threads that exited.
///
/// Peaks need the pool-wide current value, which no thread has at hand without reading every
/// other thread's counters; a thread does that read (a `checkpoint`) after each `PEAK_SLACK` bytes
/// it allocated, and every read of the stats counts too. So a peak is exact for blocks of at least
/// `PEAK_SLACK` bytes and lags the true peak by less than `PEAK_SLACK` per allocating thread.
#[derive(Default)]
pub struct FastCounters {
    shared: LocalCounters,
    /// Design: a reader takes the lock of its own shard, so that two threads' checkpoints do not
    /// take turns at one lock word; with one read-write lock, two threads each on its own stream
    /// ran the C ABI's `random` at 1.0x one thread's throughput, a checkpoint every allocation of
    /// 64 KiB or more (the counters read were 19% of the time).
    threads: ShardedLock<Vec<Arc<LocalCounters>>>,
    /// Peaks of allocated, requested and active bytes and of blocks.
    peaks: [AtomicU64; 4],
    /// The same four of the carved blocks held (`PoolCore::allocate_carved`): left out of every
    /// current and peak, as their pieces are counted by whoever carves them.
    carved: [AtomicU64; 4],
    /// A checkpoint has seen allocated bytes a quarter or more below their peak (`has_fallen`).
    fallen: AtomicBool,
}

pub const PEAK_SLACK: u64 = 64 * 1024;

impl FastCounters {
    /// A new thread's counters, included in every later read.
    pub fn register(&self) -> Arc<LocalCounters> {
        let counters = Arc::new(LocalCounters::default());
        self.threads.write().unwrap_or_else(PoisonError::into_inner).push(Arc::clone(&counters));
        counters
    }

    /// Folds an exiting thread's totals into the shared set and forgets its counters.
    pub fn retire(&self, counters: &Arc<LocalCounters>) {
        let mut threads = self.threads.write().unwrap_or_else(PoisonError::into_inner);
        for i in 0..FAST {
            self.shared.totals[i].fetch_add(counters.get(i), Relaxed);
        }
        threads.retain(|c| !Arc::ptr_eq(c, counters));
    }

    /// For callers without thread-local counters.
    pub fn bump_shared(&self, which: Fast, n: u64) {
        self.shared.bump_shared(which, n);
    }

    fn totals(&self) -> [u64; FAST] {
        let threads = self.threads.read().unwrap_or_else(PoisonError::into_inner);
        // Thread by thread: each thread's counters share its cache line.
        let mut totals: [u64; FAST] = std::array::from_fn(|i| self.shared.get(i));
        for counters in threads.iter() {
            for (i, total) in totals.iter_mut().enumerate() {
                *total = total.wrapping_add(counters.get(i));
            }
        }
        totals
    }

    /// allocated, requested and active bytes, and blocks: (cumulative in, cumulative out).
    fn flows(totals: &[u64; FAST]) -> [(u64, u64); 4] {
        let t = |which: Fast| totals[which as usize];
        let pending = t(Fast::PendingIn).wrapping_sub(t(Fast::PendingOut));
        [
            (t(Fast::AllocatedIn), t(Fast::AllocatedOut)),
            (t(Fast::RequestedIn), t(Fast::RequestedOut)),
            (t(Fast::AllocatedIn), t(Fast::AllocatedOut).wrapping_sub(pending)),
            (t(Fast::BlocksIn), t(Fast::BlocksOut)),
        ]
    }

    fn currents(&self, totals: &[u64; FAST]) -> [u64; 4] {
        let mut currents = Self::flows(totals).map(|(into, out)| into.saturating_sub(out));
        for (current, carved) in currents.iter_mut().zip(&self.carved) {
            *current = current.saturating_sub(carved.load(Relaxed));
        }
        currents
    }

    /// Allocated, requested and active bytes and blocks now.
    pub fn currents_now(&self) -> [u64; 4] {
        self.currents(&self.totals())
    }

    /// Counts `[bytes, requested bytes, active bytes, blocks]` of carved blocks as held.
    pub fn carve(&self, amounts: [u64; 4]) {
        for (carved, n) in self.carved.iter().zip(amounts) {
            carved.fetch_add(n, Relaxed);
        }
    }

    /// Counts carved blocks as no longer held.
    pub fn uncarve(&self, amounts: [u64; 4]) {
        for (carved, n) in self.carved.iter().zip(amounts) {
            carved.fetch_sub(n, Relaxed);
        }
    }

    /// Allocated bytes held in carved blocks.
    fn carved_bytes(&self) -> u64 {
        self.carved[0].load(Relaxed)
    }

    /// Blocks handed out from a cache.
    fn hits(totals: &[u64; FAST]) -> u64 {
        totals[Fast::BlocksIn as usize].saturating_sub(totals[Fast::Misses as usize])
    }

    /// Reads every thread's counters and raises the peaks to the current values.
    pub fn checkpoint(&self) -> [u64; FAST] {
        let totals = self.totals();
        let currents = self.currents(&totals);
        for (peak, &current) in self.peaks.iter().zip(&currents) {
            // A plain load first: no locked read-modify-write (nor a stolen cache line) unless
            // this is a new peak, which it rarely is.
            if current > peak.load(Relaxed) {
                peak.fetch_max(current, Relaxed);
            }
        }
        let peak = self.peaks[0].load(Relaxed);
        if currents[0] < peak - peak / 4 && !self.fallen.load(Relaxed) {
            self.fallen.store(true, Relaxed);
        }
        totals
    }

    /// Whether allocated bytes have fallen a quarter below their peak at some checkpoint: until
    /// then the pool is in its first rise.
    pub fn has_fallen(&self) -> bool {
        self.fallen.load(Relaxed)
    }

    fn reset_peaks(&self) {
        let currents = self.currents(&self.totals());
        for (peak, current) in self.peaks.iter().zip(currents) {
            peak.store(current, Relaxed);
        }
    }

    fn read(&self) -> [CounterValues; 4] {
        let totals = self.checkpoint();
        let flows = Self::flows(&totals);
        let currents = self.currents(&totals);
        [0, 1, 2, 3].map(|k| CounterValues {
            current: currents[k],
            peak: self.peaks[k].load(Relaxed).max(currents[k]),
            allocated: flows[k].0,
            freed: flows[k].1,
        })
    }
}

/// The pool's live counters.
#[derive(Default)]
pub struct Counters {
    /// Allocated (real block sizes), requested and active bytes, and the block count.
    pub fast: FastCounters,
    /// Segment bytes held from the device.
    pub reserved_bytes: Counter,
    pub segment: Counter,
    pub num_alloc_retries: AtomicU64,
    pub num_ooms: AtomicU64,
    pub num_device_alloc: AtomicU64,
    pub num_device_free: AtomicU64,
    pub deferred_frees: AtomicU64,
}

impl Counters {
    pub fn reset_peaks(&self) {
        self.fast.reset_peaks();
        self.reserved_bytes.reset_peak();
        self.segment.reset_peak();
    }

    /// The counters, with the strategies' largest free range and the bytes of all their free
    /// ranges (read by the caller under the strategies' locks).
    pub fn read(&self, largest_free: u64, free_range_bytes: u64) -> Stats {
        let get = |a: &AtomicU64| a.load(Relaxed);
        let totals = self.fast.checkpoint();
        let [allocated_bytes, requested_bytes, active_bytes, allocation] = self.fast.read();
        let reserved_bytes = self.reserved_bytes.read();
        // Carved blocks are not cached.
        let unallocated = reserved_bytes.current.saturating_sub(allocated_bytes.current + self.fast.carved_bytes());
        Stats {
            allocated_bytes,
            requested_bytes,
            reserved_bytes,
            active_bytes,
            allocation,
            segment: self.segment.read(),
            num_alloc_retries: get(&self.num_alloc_retries),
            num_ooms: get(&self.num_ooms),
            num_device_alloc: get(&self.num_device_alloc),
            num_device_free: get(&self.num_device_free),
            fast_path_hits: FastCounters::hits(&totals),
            deferred_frees: get(&self.deferred_frees),
            largest_free_bytes: largest_free,
            cached_bytes: unallocated.saturating_sub(free_range_bytes),
            paused_bytes: 0,
        }
    }
}

/// A reading of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub allocated_bytes: CounterValues,
    pub requested_bytes: CounterValues,
    pub reserved_bytes: CounterValues,
    pub active_bytes: CounterValues,
    pub allocation: CounterValues,
    pub segment: CounterValues,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub fast_path_hits: u64,
    pub deferred_frees: u64,
    /// The largest free range of the strategies: the largest block the pool can cut without a
    /// new segment, not counting cached blocks.
    pub largest_free_bytes: u64,
    /// Freed blocks that the strategies still count as taken: held in the caches (handed out
    /// again at their own size, and merged back into the free ranges before the pool grows) or
    /// waiting for other streams' work.
    pub cached_bytes: u64,
    /// Bytes a pause gave back to the device, mapped again at the same addresses on resume (not
    /// in `reserved_bytes` meanwhile).
    pub paused_bytes: u64,
}

/// One figure of [`Stats::to_pairs`], typed so that a binding need not guess it from the value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StatValue {
    /// Bytes, blocks, segments or events.
    Count(u64),
    /// A share or a quotient of two counts.
    Ratio(f64),
}

/// 1 - largest free range / bytes in free ranges: how scattered free memory is, 0 when it is one
/// range (or there is none) and near 1 when it is many small ones.
pub fn fragmentation(largest_free: u64, free: u64) -> f64 {
    match free {
        0 => 0.0,
        free => 1.0 - largest_free.min(free) as f64 / free as f64,
    }
}

impl Stats {
    /// Bytes held from the device that no live block uses.
    pub fn free_bytes(&self) -> u64 {
        self.reserved_bytes.current.saturating_sub(self.allocated_bytes.current)
    }

    /// 1 - largest free range / bytes in free ranges: 0 when the free memory is one range.
    /// Cached blocks are no free range: a freed block waiting in a cache is not scattered memory.
    pub fn fragmentation(&self) -> f64 {
        fragmentation(self.largest_free_bytes, self.free_bytes().saturating_sub(self.cached_bytes))
    }

    /// Reserved over allocated bytes (1.0 is perfect; 0 when nothing is allocated).
    pub fn reserved_per_allocated(&self) -> f64 {
        match self.allocated_bytes.current {
            0 => 0.0,
            a => self.reserved_bytes.current as f64 / a as f64,
        }
    }

    /// Every figure under PyTorch's key name where one exists, and vrampool's own otherwise.
    pub fn to_pairs(&self) -> Vec<(String, StatValue)> {
        let mut pairs = Vec::new();
        let groups = [
            ("allocated_bytes", &self.allocated_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("allocation", &self.allocation),
            ("segment", &self.segment),
        ];
        for (name, c) in groups {
            for (field, v) in [("current", c.current), ("peak", c.peak), ("allocated", c.allocated), ("freed", c.freed)] {
                pairs.push((format!("{name}.all.{field}"), StatValue::Count(v)));
            }
        }
        for (name, v) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("fast_path_hits", self.fast_path_hits),
            ("deferred_frees", self.deferred_frees),
            ("largest_free_bytes", self.largest_free_bytes),
            ("cached_bytes", self.cached_bytes),
            ("free_bytes", self.free_bytes()),
            ("paused_bytes", self.paused_bytes),
        ] {
            pairs.push((name.to_string(), StatValue::Count(v)));
        }
        pairs.push(("fragmentation".into(), StatValue::Ratio(self.fragmentation())));
        pairs.push(("reserved_per_allocated".into(), StatValue::Ratio(self.reserved_per_allocated())));
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::{fragmentation, StatValue, Stats};

    #[test]
    fn counts_are_counts_and_ratios_are_ratios_whatever_their_value() {
        let stats = Stats::default();
        for (key, value) in stats.to_pairs() {
            let ratio = matches!(key.as_str(), "fragmentation" | "reserved_per_allocated");
            assert_eq!(matches!(value, StatValue::Ratio(_)), ratio, "{key}: {value:?}");
        }
    }

    #[test]
    fn fragmentation_is_the_share_of_free_bytes_outside_the_largest_range() {
        assert_eq!(fragmentation(0, 0), 0.0);
        assert_eq!(fragmentation(100, 100), 0.0);
        assert_eq!(fragmentation(25, 100), 0.75);
        // A largest range reported above the free bytes (cached blocks counted apart) is capped.
        assert_eq!(fragmentation(200, 100), 0.0);
    }
}
