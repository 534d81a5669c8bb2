//! What the pool shows of itself: stats, the segment map, live blocks, the event log, out-of-memory reports.

use super::*;

impl PoolCore {
    pub fn stats(&self) -> Stats {
        let (largest, free_ranges) = self.free_ranges();
        let mut stats = self.counters.read(largest, free_ranges);
        stats.paused_bytes = self.paused_bytes.load(Relaxed);
        stats
    }

    /// Allocated bytes, from the counters alone: unlike `stats`, no strategy is visited, so the
    /// cost does not grow with the streams.
    pub(super) fn allocated_bytes(&self) -> CounterValues {
        self.counters.read(0, 0).allocated_bytes
    }

    /// `[allocated bytes, requested bytes, active bytes, blocks]` held now, from the counters alone.
    pub fn held(&self) -> [u64; 4] {
        self.counters.fast.currents_now()
    }

    pub fn reset_peak_stats(&self) {
        self.counters.reset_peaks();
    }

    /// Segments with their blocks and free ranges, per stream and strategy.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let deferred: Vec<u64> = self.deferred.lock().iter().map(|d| d.addr).collect();
        let paused = self.is_paused();
        let mut out = Vec::new();
        self.for_each_arena(|arena| {
            for tier in arena.tiers.iter() {
                let strategy = tier.lock();
                for (segment, blocks) in strategy.snapshot() {
                    let expandable = arena.with_vm(|vm_arena| vm_arena.reservations.iter().any(|r| r.contains(segment.base)));
                    let blocks = blocks
                        .iter()
                        .map(|&BlockInfo { addr, size, allocated }| {
                            let state = match (allocated, self.live_block(addr)) {
                                (false, _) => BlockState::Free,
                                (true, Some(b)) => BlockState::Active { requested: b.requested },
                                (true, None) if deferred.contains(&addr) => BlockState::PendingFree,
                                (true, None) => BlockState::Cached,
                            };
                            (addr, size, state)
                        })
                        .collect();
                    out.push(SegmentSnapshot {
                        stream: lanes::real(arena.stream),
                        strategy: strategy.name(),
                        base: segment.base,
                        size: segment.size,
                        expandable,
                        paused: paused && expandable,
                        blocks,
                    });
                }
            }
        });
        out.sort_by_key(|s| s.base);
        out
    }

    /// Every live block (for leak reports), by address; with its age when `track_leaks` is on.
    pub fn live_blocks(&self) -> Vec<LiveBlockInfo> {
        let births: Option<HashMap<u64, u64>> = self.births.as_ref().map(|b| b.entries().into_iter().collect());
        let now = self.now_ns();
        let mut blocks: Vec<_> = self
            .live
            .iter()
            .chain(self.overflow.entries())
            .map(|(addr, b)| {
                let age_ns = births.as_ref().and_then(|m| m.get(&addr).map(|&born| now.saturating_sub(born)));
                LiveBlockInfo { addr, size: b.size, requested: b.requested, stream: lanes::real(StreamId(b.stream)), age_ns }
            })
            .collect();
        blocks.sort_by_key(|b| b.addr);
        blocks
    }

    /// The events recorded since the last call (empty unless `record_events` is on).
    pub fn take_events(&self) -> Vec<LogEvent> {
        self.log.as_ref().map(EventLog::take).unwrap_or_default()
    }

    /// The largest free range of any strategy, and the bytes of all their free ranges.
    pub(super) fn free_ranges(&self) -> (u64, u64) {
        let (mut largest, mut bytes) = (0, 0);
        self.for_each_holding_arena(|arena| {
            for tier in arena.tiers.iter() {
                let usage = tier.lock().usage();
                largest = largest.max(usage.largest_free);
                bytes += usage.reserved.saturating_sub(usage.allocated);
            }
        });
        (largest, bytes)
    }

    pub(super) fn oom_report(&self, requested: u64) -> OomReport {
        let stats = self.stats();
        let rounded = self.config.padded(requested).unwrap_or(u64::MAX);
        let block = self.config.block_size_for(rounded, self.tier_of(rounded));
        OomReport {
            requested,
            block: if block > rounded { block } else { 0 },
            allocated: stats.allocated_bytes.current,
            reserved: stats.reserved_bytes.current,
            largest_free: stats.largest_free_bytes,
            device_free: self.device.mem_info().map(|m| m.free).unwrap_or(0),
            limit: self.config.limit.is_some().then(|| self.capacity()),
            arena: ArenaHeld::default(),
        }
    }
}
