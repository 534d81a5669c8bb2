//! Pause and resume: the pool's physical memory goes back to the device while its address ranges
//! stay reserved, and comes back at the same addresses (RL post-training, where a trainer and an
//! inference engine take turns on one GPU: vLLM's sleep mode, `torch_memory_saver`).
//!
//! Only expandable segments can do it: their address ranges are reserved apart from the memory
//! mapped into them, so a pause unmaps every mapping (`cuMemUnmap` + `cuMemRelease`) and keeps the
//! reservations, and a resume maps new memory at the same places. A pool with plain segments
//! (`cuMemAlloc`, whose address goes with its memory) refuses to pause.
//!
//! While paused, allocations fail (`PoolError::Paused`) and frees go on in the books: the block is
//! free when the memory comes back. Nothing touches the unmapped memory meanwhile: scrubbing waits
//! for the resume, which zero-fills everything it maps when scrubbing is on.
//!
//! A pause waits for the streams that used the memory (an event on each, never the whole context),
//! copies the live blocks to the host if asked, then unmaps. If an unmap fails, what was
//! unmapped stays so: the memory is paused, the error says so, and pausing again finishes. A
//! resume that cannot map or restore everything (the device is full) unmaps what it mapped and
//! stays paused, so that a later resume can succeed.

use super::*;
use crate::expandable::VmArena;

/// What a pause took away.
pub(super) struct Paused {
    /// The mappings unmapped, with their arena's stream: mapped again on resume.
    unmapped: Vec<(StreamId, Segment)>,
    /// The live blocks' bytes at the pause, when backed up.
    backup: Option<Backup>,
}

/// Live blocks' bytes in one host buffer.
struct Backup {
    bytes: Box<dyn crate::device::HostBuffer>,
    /// Each block's address, and its bytes' offset and length in `bytes`.
    blocks: Vec<(u64, usize, usize)>,
}

/// What a pause did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PauseReport {
    /// Physical memory given back to the device by this call.
    pub released: u64,
    /// Bytes of live blocks copied to the host (0 without a backup).
    pub backed_up: u64,
}

impl PoolCore {
    /// Gives the pool's physical memory back to the device, keeping every address: see the
    /// module's documentation. With `backup`, live blocks' bytes are copied to the host first and
    /// restored by `resume`. Pausing a paused pool finishes what a failed pause left mapped.
    pub fn pause(&self, backup: bool) -> Result<PauseReport> {
        self.ensure_open()?;
        let mut paused = self.paused.lock();
        if paused.is_none() {
            self.check_pausable()?;
            self.gate.set(FastGate::PAUSED, true);
            let started = self.wait_for_users().and_then(|()| backup.then(|| self.back_up()).transpose());
            match started {
                Ok(backup) => *paused = Some(Paused { unmapped: Vec::new(), backup }),
                Err(e) => {
                    self.gate.set(FastGate::PAUSED, false);
                    return Err(e);
                }
            }
        }
        let state = paused.as_mut().expect("set just above");
        let (released, error) = self.unmap_everything(&mut state.unmapped);
        self.paused_bytes.store(state.unmapped.iter().map(|(_, m)| m.size).sum(), Relaxed);
        let backed_up = state.backup.as_ref().map_or(0, |b| b.bytes.bytes().len() as u64);
        match error {
            None => Ok(PauseReport { released, backed_up }),
            Some(e) => Err(PoolError::Paused(format!(
                "the pause gave back {released} bytes, but the device refused to unmap the rest ({e}); the memory is \
                 paused (allocations fail, every address is kept) and pausing again finishes the job"
            ))),
        }
    }

    /// Maps memory again where a pause unmapped it, restores the backup if the pause kept one,
    /// and lets allocations in again; returns the bytes mapped. With `cached` false, memory that
    /// held no live block at the pause stays with the device (the pool maps it again when it
    /// needs it). On a failure nothing stays mapped and the pool stays paused, ready to retry.
    /// A pool that is not paused returns 0.
    pub fn resume(&self, cached: bool) -> Result<u64> {
        self.ensure_open()?;
        let mut paused = self.paused.lock();
        let Some(state) = paused.as_mut() else { return Ok(0) };
        let vm = self.vm.as_ref().expect("only a pool of expandable segments pauses");
        if !cached {
            // Cached blocks count as taken in the strategies: filed back, their memory is free.
            self.flush_caches();
        }
        let (to_map, to_leave): (Vec<_>, Vec<_>) =
            state.unmapped.iter().copied().partition(|&(stream, m)| cached || self.holds_blocks(vm, stream, m));
        let mut mapped = Vec::new();
        let mut failure = None;
        for (stream, m) in self.runs(to_map) {
            match self.map_again(vm, stream, m) {
                Ok(()) => mapped.push((stream, m)),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() {
            failure = self.restore(state, &mapped).err();
        }
        if let Some(e) = failure {
            for &(stream, m) in &mapped {
                self.unmap_again(vm, stream, m);
            }
            return Err(PoolError::Paused(format!(
                "the resume could not bring the memory back ({e}); it is still paused, every address kept, and a later \
                 resume can succeed"
            )));
        }
        for &(stream, m) in &to_leave {
            self.leave_released(vm, stream, m);
        }
        *paused = None;
        self.paused_bytes.store(0, Relaxed);
        self.gate.set(FastGate::PAUSED, false);
        Ok(mapped.iter().map(|(_, m)| m.size).sum())
    }

    /// Whether the pool's memory is paused.
    pub fn is_paused(&self) -> bool {
        self.gate.any(FastGate::PAUSED)
    }

    /// Refuses a pool whose memory cannot keep its addresses: one without expandable segments,
    /// or one holding plain segments beside them.
    fn check_pausable(&self) -> Result<()> {
        if self.vm.is_none() {
            return Err(PoolError::CannotPause(
                "this pool allocates plain segments (cuMemAlloc), whose addresses go with their memory; pausing needs \
                 virtual-memory mapping (cuMemCreate/cuMemMap), which the device, or a pool shared with other processes, lacks"
                    .into(),
            ));
        }
        // The snapshot tells each segment of the tiers an expandable run or a plain segment.
        let plain: u64 = self.snapshot().iter().filter(|s| !s.expandable).map(|s| s.size).sum();
        match plain {
            0 => Ok(()),
            bytes => Err(PoolError::CannotPause(format!(
                "{bytes} bytes of this pool are plain segments (its small or large tiers, or growth past the address \
                 space), whose addresses go with their memory"
            ))),
        }
    }

    /// Waits for the work queued so far on every stream that may touch the memory: the arenas' own,
    /// those recorded on live blocks, and those deferred frees wait for. An event on each, waited
    /// for: a context-wide sync would wait for other pools' work too, and a stream's sync for work
    /// other threads queue on it meanwhile.
    fn wait_for_users(&self) -> Result<()> {
        let mut streams = std::collections::BTreeSet::new();
        self.for_each_arena(|arena| {
            if arena.with_vm(|v| !v.reservations.is_empty()) {
                streams.insert(lanes::real(arena.stream));
            }
        });
        streams.extend(self.recorded.lock().values().flatten().copied());
        streams.extend(self.deferred.lock().iter().flat_map(|d| d.streams.iter().copied()));
        self.wait_for(streams)?;
        self.complete_ready_deferred_frees();
        Ok(())
    }

    /// Waits for the work queued so far on `streams`: an event recorded on each, waited for.
    fn wait_for(&self, streams: std::collections::BTreeSet<StreamId>) -> Result<()> {
        let events = self.record_events(&streams.into_iter().collect::<Vec<_>>())?;
        let waited = events.iter().try_for_each(|&event| self.device.wait_event(event));
        events.into_iter().for_each(|event| self.device.release_event(event));
        Ok(waited?)
    }

    /// The live blocks' bytes, copied into one host buffer (page-locked where the device can).
    fn back_up(&self) -> Result<Backup> {
        let mut blocks = Vec::new();
        let mut total = 0usize;
        for block in self.live_blocks() {
            let too_large = PoolError::InvalidSize { size: block.size, reason: "too large to back up" };
            let len = usize::try_from(block.size).map_err(|_| too_large.clone())?;
            blocks.push((block.addr, total, len));
            total = total.checked_add(len).ok_or(too_large)?;
        }
        let mut bytes = self.device.host_buffer(total)?;
        for &(addr, offset, len) in &blocks {
            self.device.copy_to_host(addr, &mut bytes.bytes_mut()[offset..offset + len])?;
        }
        Ok(Backup { bytes, blocks })
    }

    /// Unmaps every mapping of every arena, noting each in `unmapped`; returns the bytes given
    /// back and the first error (the mappings that failed stay mapped).
    fn unmap_everything(&self, unmapped: &mut Vec<(StreamId, Segment)>) -> (u64, Option<DeviceError>) {
        let Some(vm) = self.vm.as_ref() else { return (0, None) };
        let (mut bytes, mut first_error) = (0, None);
        self.for_each_arena(|arena| {
            // Under the tier's lock, as a growth or a give-back maps and unmaps.
            let _strategy = self.lock_tier(arena, vm.tier);
            arena.with_vm(|vm_arena| {
                for r in &mut vm_arena.reservations {
                    let mappings = r.all_mappings();
                    let (freed, kept, error) = self.unmap_ranges(r, mappings.clone(), arena.stream);
                    bytes += freed;
                    unmapped.extend(mappings.into_iter().filter(|m| !kept.contains(m)).map(|m| (arena.stream, m)));
                    if let Some(e) = error {
                        first_error.get_or_insert(e);
                    }
                }
            });
        });
        (bytes, first_error)
    }

    /// Runs `f` on the expandable tier's strategy of `stream`'s arena and on the arena's ranges,
    /// with the index of the one that holds `addr`, under the tier's lock as every map and unmap
    /// runs; None when no range holds it.
    fn in_reservation<R>(
        &self,
        vm: &Expandable,
        stream: StreamId,
        addr: u64,
        f: impl FnOnce(&mut dyn Strategy, &mut VmArena, usize) -> R,
    ) -> Option<R> {
        let arena = self.arena(stream);
        let mut strategy = self.lock_tier(arena, vm.tier);
        arena.with_vm(|vm_arena| {
            let i = vm_arena.reservations.iter().position(|r| r.contains(addr))?;
            Some(f(&mut **strategy, vm_arena, i))
        })
    }

    /// Whether the paused mapping `m` of `stream`'s arena holds part of a block (live, cached or
    /// waiting for a stream): what a resume without the cache maps again.
    fn holds_blocks(&self, vm: &Expandable, stream: StreamId, m: Segment) -> bool {
        let unused = |strategy: &mut dyn Strategy, v: &mut VmArena, i: usize| strategy.unused_ranges(v.reservations[i].base);
        let unused = self.in_reservation(vm, stream, m.base, unused).unwrap_or_default();
        !unused.iter().any(|u| u.base <= m.base && m.base + m.size <= u.base + u.size)
    }

    /// `mappings` with each run of adjacent ones in one reservation made one range: mapped again
    /// in as few pieces as a growth of its size (`map_range`), not piece by piece.
    fn runs(&self, mut mappings: Vec<(StreamId, Segment)>) -> Vec<(StreamId, Segment)> {
        mappings.sort_unstable_by_key(|&(stream, m)| (stream, m.base));
        let mut runs: Vec<(StreamId, Segment)> = Vec::with_capacity(mappings.len());
        for (stream, m) in mappings {
            if let Some((last_stream, last)) = runs.last_mut() {
                let reservation_of = |addr: u64| self.arena(stream).with_vm(|v| v.reservations.iter().position(|r| r.contains(addr)));
                if *last_stream == stream && last.base + last.size == m.base && reservation_of(last.base) == reservation_of(m.base) {
                    last.size += m.size;
                    continue;
                }
            }
            runs.push((stream, m));
        }
        runs
    }

    /// Maps the paused range `m` of `stream`'s arena again (within the cap).
    fn map_again(&self, vm: &Expandable, stream: StreamId, m: Segment) -> Result<()> {
        self.in_reservation(vm, stream, m.base, |_, v, i| self.map_range(&mut v.reservations[i], m, vm.unit, stream))
            .expect("a paused mapping's range stays reserved")
    }

    /// Undoes `map_again` (a resume that failed later on).
    fn unmap_again(&self, vm: &Expandable, stream: StreamId, m: Segment) {
        self.in_reservation(vm, stream, m.base, |_, v, i| {
            let r = &mut v.reservations[i];
            let mappings = r.mappings_within(m.base, m.base + m.size);
            let (_, kept, _) = self.unmap_ranges(r, mappings, stream);
            // A mapping the device would not take back is memory the pool holds; the next pause
            // or give-back tries again.
            debug_assert!(kept.is_empty(), "unmapping memory just mapped failed");
        })
        .expect("a paused mapping's range stays reserved");
    }

    /// Zero-fills what the resume mapped when scrubbing is on, then writes the backup of every
    /// block still live back to its address (a block freed while paused is not restored).
    fn restore(&self, state: &Paused, mapped: &[(StreamId, Segment)]) -> Result<()> {
        if self.config.scrub != Scrub::Off {
            for &(stream, m) in mapped {
                self.device.fill_zero(m.base, m.size, lanes::real(stream))?;
            }
            // The fills are queued on the arenas' streams; the copies below are not ordered after them.
            self.wait_for(mapped.iter().map(|&(stream, _)| stream).collect())?;
        }
        let Some(backup) = &state.backup else { return Ok(()) };
        for &(addr, offset, len) in &backup.blocks {
            if self.live_block(addr).is_some_and(|b| b.size == len as u64) {
                self.device.copy_to_device(addr, &backup.bytes.bytes()[offset..offset + len])?;
            }
        }
        Ok(())
    }

    /// Leaves the paused mapping `m`, which holds no block, with the device: a hole in its
    /// strategy, cut off the range's end if it is there, and the range unreserved once empty.
    fn leave_released(&self, vm: &Expandable, stream: StreamId, m: Segment) {
        self.in_reservation(vm, stream, m.base, |strategy, vm_arena, i| {
            let r = &mut vm_arena.reservations[i];
            if m.base < r.base + r.extent {
                let holed = strategy.unmap_free_ranges(r.base, &[m]);
                debug_assert_eq!(holed, vec![m], "a mapping that holds no block is free space");
            }
            r.extent -= strategy.cut_unmapped_tail(r.base);
            if r.extent == 0 && r.is_unmapped() && self.device.unreserve(r.base, r.size).is_ok() {
                vm_arena.reservations.remove(i);
            }
        });
    }
}
