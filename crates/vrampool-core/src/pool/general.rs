//! The general path: a request the fast path left, under one strategy's lock, and the live-block table and counters it keeps.

use super::growth::Growing;
use super::*;

impl PoolCore {
    #[inline(never)]
    pub(super) fn allocate_general(&self, size: u64, stream: StreamId) -> Result<u64> {
        let addr = self.allocate_block(size, stream)?;
        if self.config.scrub == Scrub::OnAlloc {
            self.scrub_new_block(addr)?;
        }
        Ok(addr)
    }

    #[inline(always)]
    pub(super) fn allocate_block(&self, size: u64, stream: StreamId) -> Result<u64> {
        self.ensure_open()?;
        if self.gate.any(FastGate::PAUSED) {
            return Err(PoolError::Paused("this memory is paused: resume it before allocating from it".into()));
        }
        let rounded = self.round_request(size)?;
        self.complete_deferred_frees();
        let stream = self.lane_key(stream);
        // Fast path: a cached block of the size the strategy would hand out, from this thread's
        // cache, else from the shared magazines; no lock either way.
        let tier = self.tier_of(rounded);
        let block_size = self.config.block_size_for(rounded, tier);
        if let Some(index) = self.cache_class(block_size, tier) {
            let block = LiveBlock { size: block_size, requested: size, stream: stream.0, tier, class: class_tag(index) };
            if index < self.thread_classes {
                let from_thread = self.with_thread_cache(|c| {
                    let addr = thread_cache::pop(c, stream.0, index)?;
                    Self::count_alloc(c, &block);
                    Some((addr, c.note_allocated(block.size)))
                });
                if let Some(Some((addr, checkpoint_due))) = from_thread {
                    if checkpoint_due {
                        self.counters.fast.checkpoint();
                    }
                    return Ok(self.record_live(addr, block));
                }
            }
            let arena = self.arena(stream);
            let cached = if self.config.is_kept_run(tier, block_size) { arena.kept_run.take_of(index) } else { arena.magazines.pop(index) };
            if let Some(addr) = cached {
                return Ok(self.hand_out(addr, block, true));
            }
        }
        self.allocate_slow(self.arena(stream), size, rounded, stream)
    }

    #[inline(never)]
    pub(super) fn free_general(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<()> {
        self.ensure_open()?;
        match self.live.remove_if(addr, |b| Self::size_agrees(b, size)) {
            Ok(block) => self.free_removed(addr, block, stream),
            Err(removal) => self.free_untabled(addr, size, stream, removal),
        }
    }

    /// Whether the size a free names (if any) is the block's: as requested, or as handed out.
    #[inline(always)]
    pub(super) fn size_agrees(block: &LiveBlock, size: Option<u64>) -> bool {
        size.is_none_or(|s| s == block.requested || s == block.size)
    }

    /// A free whose block the live table refused (the size is wrong) or does not hold: it is in
    /// the overflow map, or not live at all.
    #[cold]
    #[inline(never)]
    pub(super) fn free_untabled(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>, removal: Removal) -> Result<()> {
        let wrong_size = |b: &LiveBlock| PoolError::InvalidFree {
            ptr: addr,
            reason: InvalidFreeReason::WrongSize { expected: b.requested, given: size.unwrap_or(0) },
        };
        if let Removal::Refused(block) = removal {
            return Err(wrong_size(&block));
        }
        let block = match self.overflow.remove_if(addr, |b| Self::size_agrees(b, size)) {
            Ok(Some(block)) => block,
            Ok(None) => return Err(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated }),
            Err(block) => return Err(wrong_size(&block)),
        };
        self.free_removed(addr, block, stream)
    }

    /// The rest of a free, once its block is out of the live table.
    #[inline(never)]
    pub(super) fn free_removed(&self, addr: u64, block: LiveBlock, stream: Option<StreamId>) -> Result<()> {
        let owner = lanes::real(StreamId(block.stream));
        if !self.gate.any(FastGate::RECORDED) && stream.is_none_or(|s| s == owner) {
            self.forget_birth(addr);
            self.log(EventKind::Free, addr, block.size, owner);
            self.give_back(addr, block, true);
            return Ok(());
        }
        self.free_used_elsewhere(addr, block, stream)
    }

    /// Forgets a freed block's birth time, before the block can be reused, so that a new birth at
    /// this address stays.
    #[inline(always)]
    pub(super) fn forget_birth(&self, addr: u64) {
        if let Some(births) = &self.births {
            Self::forget_birth_in(births, addr);
        }
    }

    #[cold]
    pub(super) fn forget_birth_in(births: &ShardedMap<u64>, addr: u64) {
        births.remove(addr);
    }

    // ---- the slow path ----

    pub(super) fn allocate_slow(&self, arena: &Arena, size: u64, rounded: u64, stream: StreamId) -> Result<u64> {
        let tier = self.tier_of(rounded);
        // Handed out after the strategy's lock is released: counting may give a thread cache's
        // blocks back, which takes that lock.
        let hand_out_in = |block: Block, key: StreamId| {
            let class = self.cache_class(block.size, tier).map_or(0, class_tag);
            self.hand_out(block.addr, LiveBlock { size: block.size, requested: size, stream: key.0, tier, class }, false)
        };
        let hand_out = |block: Block| hand_out_in(block, stream);
        // With memory on more streams than this, a growth neither flushes the caches nor gives back
        // first: each visits every stream holding memory, which made a program that allocates on
        // thousands of streams quadratic (4,000 streams: 29 s). The retry on out of memory below
        // still does both.
        if self.config.reclaim && self.holding.len() <= RECLAIM_MAX_STREAMS {
            // Bound first, so that the guard is gone before `hand_out`.
            let cached = self.allocate_filed(arena, tier, &mut **self.lock_tier_to_allocate(arena, tier), rounded);
            if let Some(block) = cached {
                return Ok(hand_out(block));
            }
            // The emptied caches may make room in this tier: then nothing grows, and nothing is
            // given back either.
            self.flush_caches();
            let flushed = self.allocate_filed(arena, tier, &mut **self.lock_tier(arena, tier), rounded);
            if let Some(block) = flushed {
                return Ok(hand_out(block));
            }
            // Growth ahead. Giving back lowers the peak only when the growth would set a new one:
            // below the high-water mark, the segments given back would be the ones the pool
            // grows again (a workload that frees and reallocates would pay two device calls per
            // segment, over and over) and the peak stays where it is anyway. For the same reason
            // it gives back only the bytes by which the growth would pass the mark: the idle
            // segments beyond those stay cached for the sizes that come back, unless the pool has
            // drifted (`DRIFT_DIVISOR`). The estimate is what the growth will ask of the device.
            // Best effort, as a failed give-back only leaves memory reserved.
            let (growth, extended_tail, joined_hole) = self.growth_estimate(arena, tier, rounded);
            let after = self.committed.load(Relaxed).saturating_add(growth);
            let allocated = self.allocated_bytes();
            let live_peak = allocated.current + rounded > allocated.peak;
            let over = after.saturating_sub(self.give_back_mark.load(Relaxed));
            if over > 0 {
                let base = self.committed_at_live_peak.load(Relaxed);
                let drifted = !live_peak && after > base + base / DRIFT_DIVISOR;
                let first_rise = !self.counters.fast.has_fallen();
                let growing = Growing { stream: arena.stream, tier, extended_tail, joined_hole, first_rise };
                let _ = self.give_back_free(Some(growing), if drifted { u64::MAX } else { over });
            }
            if live_peak {
                self.committed_at_live_peak.fetch_max(self.committed.load(Relaxed).saturating_add(growth), Relaxed);
            }
        }
        for attempt in 0..2 {
            if let Some(block) = self.allocate_in(arena, tier, rounded)? {
                return Ok(hand_out(block));
            }
            // No room on the device: another lane of the stream may have some free.
            if let Some((block, key)) = self.allocate_in_other_lane(stream, tier, rounded) {
                return Ok(hand_out_in(block, key));
            }
            if attempt == 0 {
                // Out of memory: give back every cached segment (all streams) and try once more.
                self.counters.num_alloc_retries.fetch_add(1, Relaxed);
                self.release_free()?;
            }
        }
        self.counters.num_ooms.fetch_add(1, Relaxed);
        Err(PoolError::OutOfMemory(self.oom_report(size)))
    }

    /// A block from the tier's strategy, growing it by a segment if needed; None when the device
    /// (or the cap) has no room.
    pub(super) fn allocate_in(&self, arena: &Arena, tier: u8, rounded: u64) -> Result<Option<Block>> {
        let mut strategy = self.lock_tier(arena, tier);
        if let Some(block) = self.allocate_filed(arena, tier, &mut **strategy, rounded) {
            return Ok(Some(block));
        }
        if let Some(vm) = self.vm.as_ref().filter(|vm| vm.tier == tier) {
            match self.grow_expandable(vm, &mut **strategy, arena, rounded) {
                Ok(true) => {
                    let block = strategy.allocate(rounded).ok_or(PoolError::InvalidSize {
                        size: rounded,
                        reason: "the strategy could not serve a request from the memory mapped for it",
                    })?;
                    return Ok(Some(block));
                }
                // No reservation, or it is full: a plain segment instead.
                Ok(false) => {}
                Err(PoolError::Device(DeviceError::OutOfMemory)) => return Ok(None),
                Err(other) => return Err(other),
            }
        }
        let segment_size = strategy.segment_size_for(rounded);
        match self.grow(segment_size, arena.stream) {
            Ok(base) => {
                strategy.add_segment(Segment { base, size: segment_size });
                let block = strategy.allocate(rounded).ok_or(PoolError::InvalidSize {
                    size: rounded,
                    reason: "the strategy could not serve a request from a new segment sized for it",
                })?;
                Ok(Some(block))
            }
            Err(PoolError::Device(DeviceError::OutOfMemory)) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// A block from the tier's strategy, after filing back into it the tier's large blocks
    /// cached in the arena's magazines. The cache serves only requests for exactly a cached
    /// block's class; every other request is placed with all the tier's free memory merged (small
    /// blocks stay cached: the slab places each class on its own). Called under the tier's lock
    /// (`lock_tier`).
    pub(super) fn allocate_filed(&self, arena: &Arena, tier: u8, strategy: &mut dyn Strategy, rounded: u64) -> Option<Block> {
        self.file_back_large_cached(arena, tier, strategy);
        strategy.allocate(rounded)
    }

    /// Files back into `strategy` the tier's large blocks cached in the arena's magazines.
    pub(super) fn file_back_large_cached(&self, arena: &Arena, tier: u8, strategy: &mut dyn Strategy) {
        if arena.take_large_cached(tier) {
            arena.magazines.drain(
                |index| index >= self.thread_classes && self.class_tier(index) == tier,
                |_, addr| {
                    let freed = self.file_back(strategy, addr);
                    debug_assert!(freed.is_some(), "a cached block belongs to the tier of its size");
                },
            );
        }
    }

    /// Counts a block handed out from a thread cache.
    pub(super) fn count_alloc(cache: &PoolCache, block: &LiveBlock) {
        let counters = cache.counters();
        counters.bump_owned(Fast::AllocatedIn, block.size);
        counters.bump_owned(Fast::RequestedIn, block.requested);
        counters.bump_owned(Fast::BlocksIn, 1);
    }

    pub(super) fn count_free(cache: &PoolCache, block: &LiveBlock) {
        let counters = cache.counters();
        counters.bump_owned(Fast::AllocatedOut, block.size);
        counters.bump_owned(Fast::RequestedOut, block.requested);
        counters.bump_owned(Fast::BlocksOut, 1);
    }

    pub(super) fn hand_out(&self, addr: u64, block: LiveBlock, cache_hit: bool) -> u64 {
        let counts = [
            (Fast::AllocatedIn, block.size),
            (Fast::RequestedIn, block.requested),
            (Fast::BlocksIn, 1),
            (Fast::Misses, u64::from(!cache_hit)),
        ];
        self.count(&counts, block.size);
        self.record_live(addr, block)
    }

    /// Enters a handed-out block in the live table (or its overflow map), the event log, and
    /// (when leaks are tracked) the birth times.
    #[inline(always)]
    pub(super) fn record_live(&self, addr: u64, block: LiveBlock) -> u64 {
        if self.log.is_some() || self.births.is_some() {
            self.record_birth(addr, block);
        }
        self.insert_live(addr, block);
        addr
    }

    /// Enters a live block in the table (reviving its parked slot when it comes from a cache), or
    /// in the overflow map when its slot is taken.
    #[inline(never)]
    pub(super) fn insert_live(&self, addr: u64, block: LiveBlock) {
        if !self.live.revive(addr, block) && !self.live.insert(addr, block) {
            self.overflow.insert(addr, block);
        }
    }

    #[cold]
    pub(super) fn record_birth(&self, addr: u64, block: LiveBlock) {
        self.log(EventKind::Alloc, addr, block.size, StreamId(block.stream));
        if let Some(births) = &self.births {
            births.insert(addr, self.now_ns());
        }
    }

    /// Makes a freed block reusable on its own stream: into this thread's cache, a magazine, or
    /// back to its strategy. `just_freed` counts the free itself too (else `free` counted it when
    /// it deferred the block).
    /// With `scrub: on_free` the block is zero-filled first; one the device fails to fill is
    /// never handed out again (it stays taken in its strategy until the pool is dropped).
    #[inline(always)]
    pub(super) fn give_back(&self, addr: u64, block: LiveBlock, just_freed: bool) {
        let counts = [
            (Fast::AllocatedOut, block.size * u64::from(just_freed)),
            (Fast::RequestedOut, block.requested * u64::from(just_freed)),
            (Fast::BlocksOut, u64::from(just_freed)),
            (Fast::PendingOut, block.size * u64::from(!just_freed)),
        ];
        // Paused memory is unmapped: the resume zero-fills all of it instead.
        let scrub = self.config.scrub == Scrub::OnFree && !self.gate.any(FastGate::PAUSED);
        if scrub && self.device.fill_zero(addr, block.size, lanes::real(StreamId(block.stream))).is_err() {
            self.count(&counts, 0);
            return;
        }
        let class = block.cache_index();
        let cached = self.with_thread_cache(|c| {
            counts.iter().for_each(|&(which, n)| c.counters().bump_owned(which, n));
            class.is_some_and(|index| index < self.thread_classes && thread_cache::push(c, block.stream, index, block.size, addr))
        });
        match cached {
            Some(true) => return,
            Some(false) => {}
            None => counts.iter().for_each(|&(which, n)| self.counters.fast.bump_shared(which, n)),
        }
        let arena = self.arena(StreamId(block.stream));
        let kept_if_placed_next = self.config.is_kept_run(block.tier, block.size);
        if let Some(index) = class.filter(|_| !kept_if_placed_next) {
            if arena.magazines.push(index, addr) {
                if index >= self.thread_classes {
                    arena.note_large_cached(block.tier);
                }
                return;
            }
        }
        let mut strategy = self.lock_tier(arena, block.tier);
        if let Some(index) = class.filter(|_| kept_if_placed_next && strategy.placed_next(addr)) {
            arena.kept_run.keep(addr, index);
            return;
        }
        let freed = self.file_back(&mut **strategy, addr);
        debug_assert_eq!(freed, Some(block.size), "a live block must go back to the strategy that made it");
    }

    /// The tier's strategy, locked, with the first tier's kept run (see
    /// `PoolConfig::first_tier_cached_max`) filed back into it: a run is kept only while it is
    /// where the next run of its size goes, which any change to the tier may undo, so whatever
    /// places, frees or gives back under the lock sees the run free. Every change to a tier locks
    /// it here; only reads (introspection) lock `Arena::tiers` directly.
    #[inline(always)]
    pub(super) fn lock_tier<'a>(&self, arena: &'a Arena, tier: u8) -> MutexGuard<'a, Box<dyn Strategy>> {
        self.file_kept_run(arena, tier, arena.tiers[tier as usize].lock())
    }

    /// `lock_tier` once the lock is taken.
    #[inline(always)]
    pub(super) fn file_kept_run<'a>(
        &self,
        arena: &'a Arena,
        tier: u8,
        mut strategy: MutexGuard<'a, Box<dyn Strategy>>,
    ) -> MutexGuard<'a, Box<dyn Strategy>> {
        if let Some(addr) = (tier == 0).then(|| arena.kept_run.take()).flatten() {
            let freed = self.file_back(&mut **strategy, addr);
            debug_assert!(freed.is_some(), "a kept run belongs to the first tier");
        }
        strategy
    }

    /// Frees a block that no one uses (cached, or just freed) in its strategy, which may split or
    /// merge it or hand the address out again at another size: the block's parked slot in the
    /// live table is freed first. Returns what the strategy freed.
    pub(super) fn file_back(&self, strategy: &mut dyn Strategy, addr: u64) -> Option<u64> {
        self.live.unpark(addr);
        strategy.free(addr)
    }

    /// Runs `f` on this thread's cache for this pool; None when the thread has none (it is
    /// exiting, or thread caches are off: see `thread_cache::with_pool_cache`).
    pub(super) fn with_thread_cache<R>(&self, f: impl FnOnce(&PoolCache) -> R) -> Option<R> {
        let register = || self.counters.fast.register();
        let enlist = |cache| self.thread_caches.lock().push(cache);
        let handle = PoolHandle { id: self.id, owner: &self.this, register: &register, enlist: &enlist };
        thread_cache::with_pool_cache(&handle, f)
    }

    /// Adds to this thread's counters (the shared ones when it has none), and updates the peaks
    /// after every `PEAK_SLACK` bytes this thread allocated.
    pub(super) fn count(&self, updates: &[(Fast, u64)], allocated: u64) {
        let due = self.with_thread_cache(|c| {
            updates.iter().for_each(|&(which, n)| c.counters().bump_owned(which, n));
            allocated > 0 && c.note_allocated(allocated)
        });
        if due.is_none() {
            updates.iter().for_each(|&(which, n)| self.counters.fast.bump_shared(which, n));
        }
        if due.unwrap_or(allocated > 0) {
            self.counters.fast.checkpoint();
        }
    }

    #[inline(always)]
    pub(super) fn cache_class(&self, size: u64, tier: u8) -> Option<usize> {
        cache_class(&self.config, &self.default_arena, self.thread_classes, size, tier)
    }

    /// The tier whose blocks of class `index` are cached (see `cache_class`).
    pub(super) fn class_tier(&self, index: usize) -> u8 {
        self.tier_of(class_size(index))
    }

    pub(super) fn live_block(&self, addr: u64) -> Option<LiveBlock> {
        self.live.get(addr).or_else(|| self.overflow.get(addr))
    }

    /// Zero-fills a block just handed out (`scrub: on_alloc`); when the device fails to, the
    /// block is freed again and the error returned.
    #[cold]
    pub(super) fn scrub_new_block(&self, addr: u64) -> Result<()> {
        let Some(block) = self.live_block(addr) else { return Ok(()) };
        if let Err(e) = self.device.fill_zero(addr, block.size, lanes::real(StreamId(block.stream))) {
            let _ = self.free(addr, None, None);
            return Err(e.into());
        }
        Ok(())
    }

    // ---- blocks cut into pieces by an adaptor (`MemoryResource::allocate_carved`) ----

    /// A block for an adaptor to cut into pieces: not scrubbed, logged nor tracked, as its pieces are.
    pub fn allocate_carved(&self, size: u64, stream: StreamId) -> Result<u64> {
        // Carved before the block is counted, so that no reading counts it as allocated; what it
        // holds is counted by its carver.
        let rounded = self.round_request(size)?;
        let estimate = [rounded, size, rounded, 1];
        self.counters.fast.carve(estimate);
        let addr = self.allocate_block(size, stream).inspect_err(|_| self.counters.fast.uncarve(estimate))?;
        let block = self.live_block(addr).expect("a block just handed out is live");
        let (more, less) = (block.size.saturating_sub(estimate[0]), estimate[0].saturating_sub(block.size));
        self.counters.fast.carve([more, 0, more, 0]);
        self.counters.fast.uncarve([less, 0, less, 0]);
        self.unlog(EventKind::Alloc, addr);
        self.forget_birth(addr);
        Ok(addr)
    }

    /// Frees a carved block once `users` (streams other than its own that used its pieces) pass
    /// their last use of it.
    pub fn free_carved(&self, addr: u64, size: u64, users: &[StreamId]) -> Result<()> {
        let block = self.live_block(addr).ok_or(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated })?;
        users.iter().try_for_each(|&s| self.record_stream(addr, s))?;
        self.free(addr, Some(size), None)?;
        self.counters.fast.uncarve([block.size, block.requested, block.size, 1]);
        self.unlog(EventKind::Free, addr);
        Ok(())
    }

    /// Whether `piece` does anything: scrubbing, the event log or leak tracking is on.
    pub fn watches_pieces(&self) -> bool {
        self.config.scrub != Scrub::Off || self.log.is_some() || self.births.is_some()
    }

    /// A piece of a carved block handed out or freed: scrubbed (as `scrub` says) and logged as a
    /// block of `size` bytes is (at the size the pool would have handed out). A piece holds its
    /// size rounded up to the alignment, and the whole of it is scrubbed, as a block is.
    pub fn piece(&self, addr: u64, size: u64, stream: StreamId, event: PieceEvent) -> Result<()> {
        let (kind, scrub) = match event {
            PieceEvent::Allocated => {
                self.ensure_open()?;
                (EventKind::Alloc, self.config.scrub == Scrub::OnAlloc)
            }
            PieceEvent::Freed => (EventKind::Free, self.config.scrub == Scrub::OnFree),
            PieceEvent::FreedInUse => (EventKind::Free, false),
        };
        if scrub {
            self.device.fill_zero(addr, size.next_multiple_of(self.config.alignment), stream)?;
        }
        if self.log.is_some() {
            let block = self.config.padded(size).map_or(size, |rounded| self.config.block_size_for(rounded, self.tier_of(rounded)));
            self.log(kind, addr, block, stream);
        }
        Ok(())
    }

    fn unlog(&self, kind: EventKind, addr: u64) {
        if let Some(log) = &self.log {
            log.retract(kind, addr);
        }
    }

    // ---- small helpers ----

    pub(super) fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn ensure_open(&self) -> Result<()> {
        self.check_process()?;
        match self.gate.any(FastGate::CLOSED) {
            true => Err(PoolError::Closed),
            false => Ok(()),
        }
    }

    /// `Forked` in a process forked after the pool was made (see `fork.rs`), where its locks
    /// and caches may be held by threads that do not exist: callers of the methods that do not
    /// check (`stats`, `snapshot`, ...) check first.
    pub fn check_process(&self) -> Result<()> {
        match crate::fork::forked_since(self.generation) {
            true => Err(PoolError::Forked),
            false => Ok(()),
        }
    }

    /// The size the strategies see: aligned, optionally padded to a bucket. Zero and sizes past
    /// one block's 128 TiB are invalid; a size past the cap (the device, or the limit) is out of
    /// memory, as any request the pool cannot get memory for, so that callers catching
    /// out-of-memory see it. No cache is given back for it: nothing could make room.
    pub(super) fn round_request(&self, size: u64) -> Result<u64> {
        if let Some(invalid) = PoolError::for_request(size) {
            return Err(invalid);
        }
        // Padding may take a size just below the largest past it.
        let rounded = self
            .config
            .padded(size)
            .filter(|&rounded| rounded <= MAX_REQUEST)
            .ok_or(PoolError::InvalidSize { size, reason: crate::error::TOO_LARGE })?;
        if rounded > self.capacity() {
            self.counters.num_ooms.fetch_add(1, Relaxed);
            return Err(PoolError::OutOfMemory(self.oom_report(size)));
        }
        Ok(rounded)
    }

    #[inline(always)]
    pub(super) fn tier_of(&self, rounded: u64) -> u8 {
        self.config.tier_of(rounded)
    }

    pub(super) fn arena(&self, stream: StreamId) -> &Arena {
        if stream == StreamId(0) {
            return &self.default_arena;
        }
        self.arenas.get_or_make(stream, || Arena::for_config(&self.config, stream))
    }

    pub(super) fn for_each_arena(&self, mut f: impl FnMut(&Arena)) {
        f(&self.default_arena);
        self.arenas.for_each(f);
    }

    #[inline(always)]
    pub(super) fn log(&self, kind: EventKind, addr: u64, size: u64, stream: StreamId) {
        if let Some(log) = &self.log {
            Self::log_in(log, kind, addr, size, lanes::real(stream));
        }
    }

    #[cold]
    pub(super) fn log_in(log: &EventLog, kind: EventKind, addr: u64, size: u64, stream: StreamId) {
        log.push(kind, addr, size, stream);
    }
}
