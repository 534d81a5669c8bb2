//! Cross-stream reuse: a block freed while other streams may still use it waits for their events.

use super::*;

impl PoolCore {
    /// The free of a block that other streams used too (`record_stream`, or a free naming
    /// another stream): its reuse waits for an event on each of them.
    #[cold]
    pub(super) fn free_used_elsewhere(&self, addr: u64, block: LiveBlock, stream: Option<StreamId>) -> Result<()> {
        let owner = lanes::real(StreamId(block.stream));
        let recorded = self.take_recorded_streams(addr);
        let mut users = recorded.clone();
        if let Some(s) = stream.filter(|&s| s != owner && !users.contains(&s)) {
            users.push(s);
        }
        let events = match self.record_events(&users) {
            Ok(events) => events,
            Err(e) => {
                // Without events the pool cannot know when the block is safe to reuse: the free
                // does nothing, the block stays live and the caller may free it again.
                self.restore_live(addr, block, recorded);
                return Err(e);
            }
        };
        self.forget_birth(addr);
        self.log(EventKind::Free, addr, block.size, stream.unwrap_or(owner));
        if events.is_empty() {
            self.give_back(addr, block, true);
            return Ok(());
        }
        let counts =
            [(Fast::AllocatedOut, block.size), (Fast::RequestedOut, block.requested), (Fast::BlocksOut, 1), (Fast::PendingIn, block.size)];
        self.count(&counts, 0);
        self.defer_free(addr, block, events, users);
        Ok(())
    }

    /// Marks the live block at `addr` as used by `stream` too: when freed, it is not reused until
    /// `stream`'s work queued before the free has completed (`Tensor.record_stream`).
    pub fn record_stream(&self, addr: u64, stream: StreamId) -> Result<()> {
        self.ensure_open()?;
        let owner = match self.live_block(addr) {
            Some(block) => lanes::real(StreamId(block.stream)),
            None => return Err(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated }),
        };
        if owner != stream {
            let mut recorded = self.recorded.lock();
            let users = recorded.entry(addr).or_default();
            if !users.contains(&stream) {
                users.push(stream);
            }
            self.gate.set(FastGate::RECORDED, true);
        }
        Ok(())
    }

    /// One event on each of `users`; on a failure, the ones already recorded are released.
    pub(super) fn record_events(&self, users: &[StreamId]) -> Result<Vec<EventId>> {
        let mut events = Vec::with_capacity(users.len());
        for &s in users {
            match self.device.record_event(lanes::real(s)) {
                Ok(e) => events.push(e),
                Err(err) => {
                    events.into_iter().for_each(|e| self.device.release_event(e));
                    return Err(err.into());
                }
            }
        }
        Ok(events)
    }

    /// Undoes the removal of a block whose free failed: live again, with its recorded streams.
    #[cold]
    pub(super) fn restore_live(&self, addr: u64, block: LiveBlock, recorded: Vec<StreamId>) {
        self.insert_live(addr, block);
        if !recorded.is_empty() {
            let mut map = self.recorded.lock();
            map.insert(addr, recorded);
            self.gate.set(FastGate::RECORDED, true);
        }
    }

    pub(super) fn defer_free(&self, addr: u64, block: LiveBlock, events: Vec<EventId>, streams: Vec<StreamId>) {
        self.counters.deferred_frees.fetch_add(1, Relaxed);
        let mut deferred = self.deferred.lock();
        deferred.push(DeferredFree { addr, block, events, streams });
        self.gate.set(FastGate::DEFERRED, true);
    }

    /// Gives back the deferred frees whose events have all completed.
    #[inline]
    pub(super) fn complete_deferred_frees(&self) {
        if self.gate.any(FastGate::DEFERRED) {
            self.complete_ready_deferred_frees();
        }
    }

    #[cold]
    pub(super) fn complete_ready_deferred_frees(&self) {
        let ready: Vec<DeferredFree> = {
            let mut deferred = self.deferred.lock();
            let (ready, waiting) = std::mem::take(&mut *deferred)
                .into_iter()
                .partition(|d| d.events.iter().all(|&e| self.device.event_done(e).unwrap_or(false)));
            *deferred = waiting;
            self.gate.set(FastGate::DEFERRED, !deferred.is_empty());
            ready
        };
        for d in ready {
            d.events.iter().for_each(|&e| self.device.release_event(e));
            self.give_back(d.addr, d.block, false);
        }
    }

    pub(super) fn take_recorded_streams(&self, addr: u64) -> Vec<StreamId> {
        if !self.gate.any(FastGate::RECORDED) {
            return Vec::new();
        }
        let mut recorded = self.recorded.lock();
        let users = recorded.remove(&addr).unwrap_or_default();
        self.gate.set(FastGate::RECORDED, !recorded.is_empty());
        users
    }
}
