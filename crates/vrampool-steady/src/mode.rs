//! The planned arena as a mode of a resource: off, every call goes to the upstream resource; on,
//! allocations go through a [`PlannedPool`] over it, and frees reach the arena wherever its buffers
//! are. What the binding puts over every pool: steady (on for good, iterations that end by
//! themselves) unless configured off, or switched by `vrampool.torch.planned()`.
//!
//! ```
//! use std::sync::Arc;
//! use vrampool_core::{MemoryResource, Pool, PoolConfig, SimDevice, SimMode, StreamId};
//! use vrampool_steady::PlannedMode;
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

use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::{Arc, OnceLock};

use vrampool_core::stats::Stats;
use vrampool_core::{
    ArenaHeld, BlockState, CachedFree, Limit, LiveBlockInfo, MemoryResource, PieceEvent, PoolError, PoolSegment, StreamId,
};

use crate::figures::{ArenaBuffer, ArenaRegion, PlannedStats};
use crate::peaks::{currents, Four};
use crate::pool::PlannedPool;
use crate::thread_lanes::{lane, LANES};

/// An upstream resource and the planned arena over it, used while the mode is on.
pub struct PlannedMode<U: MemoryResource> {
    /// Lane 0: the planned pool of every thread, until threads interleave (`thread_lanes.rs`).
    planned: PlannedPool<Arc<U>>,
    /// Lanes 1 and up, each made when a thread of it first calls once threads interleave.
    lanes: [OnceLock<PlannedPool<Arc<U>>>; LANES - 1],
}

impl<U: MemoryResource> PlannedMode<U> {
    /// The mode, off, over `upstream`.
    pub fn new(upstream: U) -> Self {
        Self { planned: PlannedPool::new(Arc::new(upstream)).off(), lanes: Default::default() }
    }

    /// The mode, on for good, over `upstream`, with iterations that end by themselves (see
    /// [`PlannedPool::with_auto_steps`]): a repeating workload reaches its steady state, one arena
    /// and no device call, with no call of its own. Explicit `step`s still mark boundaries. Threads
    /// that repeat their steps at once get an arena each (`thread_lanes.rs`).
    pub fn steady(upstream: U) -> Self {
        Self { planned: PlannedPool::new(Arc::new(upstream)).with_auto_steps(), lanes: Default::default() }
    }

    pub fn upstream(&self) -> &U {
        self.planned.backing()
    }

    /// The planned pool of lane 0: every thread's until threads interleave.
    pub fn planned(&self) -> &PlannedPool<Arc<U>> {
        &self.planned
    }

    /// Whether threads have lanes of their own.
    #[inline(always)]
    fn split(&self) -> bool {
        self.planned.threads_interleave.0.load(Relaxed)
    }

    /// The calling thread's lane's planned pool (made on its first call).
    #[inline(always)]
    fn own(&self) -> &PlannedPool<Arc<U>> {
        match lane() {
            0 => &self.planned,
            at => self.lanes[at - 1].get_or_init(|| self.planned.sibling(Arc::clone(self.planned.backing()))),
        }
    }

    /// Every lane's planned pool that exists.
    fn each(&self) -> impl Iterator<Item = &PlannedPool<Arc<U>>> {
        std::iter::once(&self.planned).chain(self.lanes.iter().filter_map(OnceLock::get))
    }

    /// The planned pool that answers for `addr`: the lane whose arena holds it, else `own`.
    fn owner<'a>(&'a self, addr: u64, own: &'a PlannedPool<Arc<U>>) -> &'a PlannedPool<Arc<U>> {
        self.each().find(|p| !std::ptr::eq(*p, own) && p.in_bounds(addr) && p.claims(addr)).unwrap_or(own)
    }

    /// Where `own` ran out of memory: the other lanes' idle arenas go back (a lane's thread may have
    /// gone quiet, or exited, holding one) and `again` is tried once more where any did.
    #[cold]
    fn after_out_of_memory(
        &self,
        own: &PlannedPool<Arc<U>>,
        e: PoolError,
        again: impl FnOnce() -> Result<u64, PoolError>,
    ) -> Result<u64, PoolError> {
        if !matches!(e, PoolError::OutOfMemory(_)) {
            return Err(e);
        }
        let released: u64 = self.each().filter(|p| !std::ptr::eq(*p, own)).filter_map(|p| p.release_idle_arena().ok()).sum();
        if released == 0 {
            return Err(e);
        }
        again()
    }

    /// `e` with what the arena holds, where it is out of memory: the upstream's report counts the
    /// arena's regions as reserved and none of its buffers as allocated.
    #[cold]
    #[inline(never)]
    fn with_arena(&self, e: PoolError) -> PoolError {
        let PoolError::OutOfMemory(mut report) = e else { return e };
        if let Some(stats) = self.gathered(PlannedPool::figures).filter(|s| s.arena_bytes > 0) {
            report.allocated += stats.arena_live_block_bytes;
            report.arena =
                ArenaHeld { bytes: stats.arena_bytes, live_bytes: stats.arena_live_block_bytes, live_buffers: stats.arena_live as u64 };
        }
        PoolError::OutOfMemory(report)
    }

    // The calls once threads have lanes, out of line: a program whose threads never interleave
    // keeps the calls of lane 0 alone inlined.

    #[inline(never)]
    fn allocate_in_lane(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        let own = self.own();
        own.allocate(size, stream).or_else(|e| self.after_out_of_memory(own, e, || own.allocate(size, stream)))
    }

    #[inline(never)]
    fn free_in_lane(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        let own = self.own();
        if own.free_in_arena(own.word.load(Acquire), addr, size, stream) {
            return Ok(());
        }
        self.owner(addr, own).free(addr, size, stream)
    }

    #[inline(never)]
    fn allocate_cached_in_lane(&self, size: u64, stream: StreamId) -> Option<u64> {
        self.own().allocate_cached(size, stream)
    }

    #[inline(never)]
    fn free_cached_in_lane(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        let own = self.own();
        let word = own.word.load(Acquire);
        if own.free_in_arena(word, addr, size, stream) {
            return CachedFree::Done;
        }
        // Another lane's arena address must not reach the pool's cached path.
        if self.maybe_other(addr, own) {
            return CachedFree::Untouched;
        }
        own.free_cached_by_pool(word, addr, size, stream)
    }

    /// Whether `addr` may lie in the arena of a lane other than `own` (bounds only, no lock).
    fn maybe_other(&self, addr: u64, own: &PlannedPool<Arc<U>>) -> bool {
        self.each().any(|p| !std::ptr::eq(p, own) && p.in_bounds(addr))
    }

    pub fn is_on(&self) -> bool {
        self.planned.is_on()
    }

    /// Whether the mode is on for good, with automatic boundaries ([`PlannedMode::steady`]).
    pub fn is_steady(&self) -> bool {
        self.planned.has_auto_steps()
    }

    /// Turns the mode on or off (a steady mode stays on). Off, the arena only waits for its last
    /// buffers: it goes back to the upstream now if none is live.
    pub fn set_on(&self, on: bool) {
        if !self.is_steady() {
            self.planned.set_on(on);
        }
    }

    /// An iteration boundary; `key` names the next iteration's signature (see
    /// [`PlannedPool::step`]).
    pub fn step(&self, key: u64) {
        // Refused only in a forked child, where the upstream refuses every call too.
        let _ = if self.split() { self.own().step(key) } else { self.planned.step(key) };
    }

    /// Gives the arena back to the upstream if none of its buffers is live (before a close, so that
    /// the arena is not taken for a leak); the bytes given back.
    pub fn release_idle_arena(&self) -> Result<u64, PoolError> {
        self.each().map(PlannedPool::release_idle_arena).sum()
    }

    /// Stops serving from the arena (the upstream is closing) and gives it back if it is idle.
    pub fn close(&self) {
        self.each().for_each(PlannedPool::close);
    }

    /// The arena's figures, every lane's together, or None while the mode has never been on (or in
    /// a forked child).
    pub fn planned_stats(&self) -> Option<PlannedStats> {
        self.gathered(PlannedPool::stats).filter(|stats| self.has_been_on(stats))
    }

    /// `figures` of every lane, added up.
    fn gathered(&self, figures: impl Fn(&PlannedPool<Arc<U>>) -> Result<PlannedStats, PoolError>) -> Option<PlannedStats> {
        let mut lanes = self.each().map(figures);
        let mut all = lanes.next()?.ok()?;
        for stats in lanes {
            all.absorb(stats.ok()?);
        }
        Some(all)
    }

    /// Every lane's regions and live arena buffers, by address.
    fn arenas(&self) -> Option<(Vec<ArenaRegion>, Vec<ArenaBuffer>)> {
        let (mut regions, mut buffers) = (Vec::new(), Vec::new());
        for planned in self.each() {
            regions.extend(planned.regions().ok()?);
            buffers.extend(planned.arena_buffers().ok()?);
        }
        regions.sort_unstable_by_key(|r| r.base);
        buffers.sort_unstable_by_key(|b| b.addr);
        Some((regions, buffers))
    }

    /// The peaks of every lane, raised to `current`. Design: each lane's peak is what the pool held
    /// when its schedule's peak came plus that peak, which leaves out the other lanes' arena buffers
    /// live then; the highest is kept.
    fn peaks(&self, current: Four) -> Four {
        self.each().map(|p| p.peaks(current)).fold(current, |most, peak| std::array::from_fn(|k| most[k].max(peak[k])))
    }

    fn has_been_on(&self, stats: &PlannedStats) -> bool {
        self.is_on() || stats.planned_allocations + stats.dynamic_allocations + stats.arena_blocks_taken > 0
    }

    /// The upstream's live blocks (`upstream_blocks`) as a caller sees them: each live arena buffer a
    /// block of its own, the arena's regions none (an idle arena is no leak).
    pub fn live_blocks(&self, upstream_blocks: Vec<LiveBlockInfo>) -> Vec<LiveBlockInfo> {
        let Some((regions, buffers)) = self.arenas() else { return upstream_blocks };
        let alignment = self.upstream().alignment().max(1);
        let mut blocks: Vec<LiveBlockInfo> = upstream_blocks.into_iter().filter(|b| !regions.iter().any(|r| r.base == b.addr)).collect();
        blocks.extend(buffers.iter().map(|b| LiveBlockInfo {
            addr: b.addr,
            size: b.size.next_multiple_of(alignment),
            requested: b.size,
            stream: b.stream,
            age_ns: b.age_ns,
        }));
        blocks.sort_by_key(|b| b.addr);
        blocks
    }
}

/// `segment`'s blocks with the block of `region` cut into the arena buffers in it (active) and the
/// bytes between them (cached: the arena's, for its next buffers).
fn carve(blocks: &mut Vec<(u64, u64, BlockState)>, region: &ArenaRegion, buffers: &[ArenaBuffer], alignment: u64) {
    let Some(at) = blocks.iter().position(|&(addr, _, _)| addr == region.base) else { return };
    let (base, block_size, _) = blocks.remove(at);
    let end = base + block_size;
    let mut pieces = Vec::new();
    let mut cursor = base;
    for b in buffers.iter().filter(|b| base <= b.addr && b.addr < end) {
        if b.addr > cursor {
            pieces.push((cursor, b.addr - cursor, BlockState::Cached));
        }
        let size = b.size.next_multiple_of(alignment).min(end - b.addr);
        pieces.push((b.addr, size, BlockState::Active { requested: b.size }));
        cursor = b.addr + size;
    }
    if cursor < end {
        pieces.push((cursor, end - cursor, BlockState::Cached));
    }
    blocks.splice(at..at, pieces);
}

impl<U: MemoryResource> MemoryResource for PlannedMode<U> {
    #[inline]
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        let allocated = if self.split() { self.allocate_in_lane(size, stream) } else { self.planned.allocate(size, stream) };
        match allocated {
            Ok(addr) => Ok(addr),
            Err(e) => Err(self.with_arena(e)),
        }
    }

    /// The arena answers for its buffers and for addresses inside it (a double free there must not
    /// reach the upstream, where the arena's own block is), also after the mode is off. With lanes,
    /// the lane whose arena holds the address answers, whichever thread frees it.
    #[inline]
    fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        if self.split() {
            return self.free_in_lane(addr, size, stream);
        }
        self.planned.free(addr, size, stream)
    }

    #[inline(always)]
    fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
        if self.split() {
            return self.allocate_cached_in_lane(size, stream);
        }
        self.planned.allocate_cached(size, stream)
    }

    #[inline(always)]
    fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        if self.split() {
            return self.free_cached_in_lane(addr, size, stream);
        }
        self.planned.free_cached(addr, size, stream)
    }

    fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<(), PoolError> {
        self.planned.free_parked(addr, stream)
    }

    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        if !self.split() {
            return self.planned.record_stream(addr, stream);
        }
        let own = self.own();
        self.owner(addr, own).record_stream(addr, stream)
    }

    /// Gives the idle arena back too: the next served iteration takes new regions.
    fn trim(&self) -> Result<u64, PoolError> {
        self.release_idle_arena()?;
        self.upstream().trim()
    }

    /// The upstream's figures, which leave the regions out (they are carved), with the live arena
    /// buffers counted as the blocks they are, and peaks that include them (`peaks.rs`).
    fn stats(&self) -> Stats {
        let mut stats = self.upstream().stats();
        let Some(p) = self.gathered(PlannedPool::figures).filter(|p| self.has_been_on(p)) else { return stats };
        // Bytes as blocks (allocated, active) and as requested: (live, every one handed out).
        let as_blocks = (p.arena_live_block_bytes, p.planned_block_bytes);
        let as_requested = (p.arena_live_bytes, p.planned_bytes);
        for (bytes, (live, handed_out)) in [&mut stats.allocated_bytes, &mut stats.requested_bytes, &mut stats.active_bytes]
            .into_iter()
            .zip([as_blocks, as_requested, as_blocks])
        {
            bytes.current += live;
            bytes.allocated = (bytes.allocated + handed_out).saturating_sub(p.arena_bytes_taken);
            bytes.freed = (bytes.freed + handed_out.saturating_sub(live)).saturating_sub(p.arena_bytes_returned);
        }
        let blocks = &mut stats.allocation;
        blocks.current += p.arena_live as u64;
        blocks.allocated = (blocks.allocated + p.planned_allocations).saturating_sub(p.arena_blocks_taken);
        blocks.freed = (blocks.freed + p.planned_allocations.saturating_sub(p.arena_live as u64)).saturating_sub(p.arena_blocks_returned);
        let peaks = self.peaks(currents(&stats));
        for (counter, peak) in
            [&mut stats.allocated_bytes, &mut stats.requested_bytes, &mut stats.active_bytes, &mut stats.allocation].into_iter().zip(peaks)
        {
            counter.peak = counter.peak.max(peak);
        }
        stats
    }

    fn reset_peak_stats(&self) {
        self.upstream().reset_peak_stats();
        let current = currents(&self.stats());
        self.each().for_each(|p| p.reset_peaks(current));
    }

    /// The upstream's segments, with each region's block cut into its arena buffers.
    fn snapshot(&self) -> Vec<PoolSegment> {
        let mut segments = self.upstream().snapshot();
        let Some((regions, buffers)) = self.arenas() else { return segments };
        let alignment = self.upstream().alignment().max(1);
        for region in &regions {
            for s in segments.iter_mut().filter(|s| s.segment.base <= region.base && region.base < s.segment.base + s.segment.size) {
                carve(&mut s.segment.blocks, region, &buffers, alignment);
            }
        }
        segments
    }

    fn set_limit(&self, limit: Option<Limit>) -> Result<(), PoolError> {
        self.upstream().set_limit(limit)
    }

    fn alignment(&self) -> u64 {
        self.upstream().alignment()
    }

    fn allocate_carved(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        self.upstream().allocate_carved(size, stream)
    }

    fn free_carved(&self, addr: u64, size: u64, users: &[StreamId]) -> Result<(), PoolError> {
        self.upstream().free_carved(addr, size, users)
    }

    fn watches_pieces(&self) -> bool {
        self.upstream().watches_pieces()
    }

    fn piece(&self, addr: u64, size: u64, stream: StreamId, event: PieceEvent) -> Result<(), PoolError> {
        self.upstream().piece(addr, size, stream, event)
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
        assert_eq!(stats.arena_blocks_taken, 1, "the arena is the replay's one upstream allocation");
        assert_eq!(m.stats().allocation.allocated - upstream_allocations, 6, "each arena buffer counts, the arena not");
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

    const STEP_ALLOCATIONS: u64 = 32;

    /// A steady mode over a pool on a simulated device, and the device.
    fn steady() -> (PlannedMode<Pool>, Arc<SimDevice>) {
        let device = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
        let pool = Pool::new(device.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap();
        (PlannedMode::steady(pool), device)
    }

    /// A step of a loop: 32 buffers, the first `first` bytes and the others of
    /// several sizes, each freed two allocations later; every one freed at the end.
    fn loop_step(mode: &PlannedMode<Pool>, first: u64) -> Vec<u64> {
        let sizes: Vec<u64> = (0..STEP_ALLOCATIONS).map(|i| if i == 0 { first } else { (1 + i % 5) << 20 }).collect();
        let mut addrs = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            addrs.push(mode.allocate(size, S0).unwrap());
            if i >= 2 {
                mode.free(addrs[i - 2], Some(sizes[i - 2]), None).unwrap();
            }
        }
        for i in sizes.len() - 2..sizes.len() {
            mode.free(addrs[i], Some(sizes[i]), None).unwrap();
        }
        addrs
    }

    fn device_calls(device: &SimDevice) -> u64 {
        let c = device.counters();
        c.alloc_calls + c.free_calls + c.map_calls + c.unmap_calls + c.stream_syncs
    }

    #[test]
    fn steady_a_loop_that_frees_all_it_allocates_reaches_no_device_call_with_no_step() {
        let (m, device) = steady();
        assert!(m.is_on() && m.is_steady());
        m.set_on(false);
        assert!(m.is_on(), "a steady mode stays on");
        let first = loop_step(&m, 8 << 20);
        let second = loop_step(&m, 8 << 20);
        assert_ne!(first, second, "the second step comes from the arena");
        let calls = device_calls(&device);
        let reserved = m.stats().reserved_bytes.peak;
        for _ in 0..5 {
            assert_eq!(loop_step(&m, 8 << 20), second, "the same offsets every step");
        }
        assert_eq!(device_calls(&device), calls, "no device call once the arena is there");
        assert_eq!(m.stats().reserved_bytes.peak, reserved);
        let stats = m.planned_stats().unwrap();
        assert_eq!((stats.recorded_iterations, stats.replayed_iterations, stats.fallbacks), (1, 6, 0));
        let figures = m.stats();
        assert_eq!((figures.allocation.current, figures.allocated_bytes.current), (0, 0), "an idle arena holds nothing allocated");
        let served = 7 * STEP_ALLOCATIONS;
        assert_eq!((figures.allocation.allocated, figures.allocation.freed), (served, served));
    }

    #[test]
    fn steady_each_step_shape_gets_its_own_plan_by_its_first_allocation() {
        let (m, device) = steady();
        // Two shapes, told apart by their first buffer, taking turns as a loop's input lengths do.
        for _ in 0..2 {
            loop_step(&m, 8 << 20);
            loop_step(&m, 12 << 20);
        }
        let calls = device_calls(&device);
        for _ in 0..3 {
            loop_step(&m, 8 << 20);
            loop_step(&m, 12 << 20);
        }
        assert_eq!(device_calls(&device), calls);
        let stats = m.planned_stats().unwrap();
        assert_eq!(stats.plans.len(), 2);
        assert_eq!(stats.fallbacks, 0);
    }

    #[test]
    fn steady_a_step_that_changes_falls_back_at_its_first_difference_and_loses_nothing() {
        let (m, _) = steady();
        loop_step(&m, 8 << 20);
        loop_step(&m, 8 << 20);
        // Same first buffer, then other sizes: the arena stops at the difference, the pool serves the rest.
        let live: Vec<u64> = (0..40).map(|i| m.allocate(if i == 0 { 8 << 20 } else { 3 << 19 }, S0).unwrap()).collect();
        let mut sorted = live.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), live.len(), "no two live buffers share an address");
        assert_eq!(m.planned_stats().unwrap().fallbacks, 1);
        for (i, addr) in live.into_iter().enumerate() {
            m.free(addr, Some(if i == 0 { 8 << 20 } else { 3 << 19 }), None).unwrap();
        }
        assert_eq!(m.stats().allocation.current, 0);
    }

    #[test]
    fn steady_pairs_of_different_sizes_cost_the_device_what_the_pool_alone_does() {
        let calls = |m: &PlannedMode<Pool>, device: &SimDevice| {
            for i in 0..2000u64 {
                let size = (1 + (i * 7919) % 97) << 16;
                let a = m.allocate(size, S0).unwrap();
                m.free(a, Some(size), None).unwrap();
            }
            assert_eq!(m.stats().allocation.current, 0);
            device_calls(device)
        };
        let (steady, device) = steady();
        let alone_device = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
        let alone = PlannedMode::new(Pool::new(alone_device.clone() as Arc<dyn Device>, PoolConfig::default()).unwrap());
        assert_eq!(calls(&steady, &device), calls(&alone, &alone_device));
    }
}
