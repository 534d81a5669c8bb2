//! A simulated device: capacity-limited segments on the host, streams and events that tests
//! drive by hand, and fault injection.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use super::{Device, DeviceResult, EventId, MemInfo, StreamId};
use crate::error::DeviceError;
use crate::sizes::MIB;

/// Where a simulated segment's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimMode {
    /// Real host memory: addresses are host pointers, so tests can write into blocks and catch
    /// overlap or corruption.
    HostBacked,
    /// Addresses only, nothing touched: for replaying huge traces fast.
    AddressOnly,
}

/// Alignment of every segment and reservation, as `cuMemAlloc` gives at least 256 B and the
/// virtual-memory API gives its granularity.
const SEGMENT_ALIGN: u64 = 2 * MIB;
/// Address-only segments start here so that they look like device addresses and are never null.
const ADDRESS_ONLY_BASE: u64 = 0x7000_0000_0000;

/// A host allocation made with `std::alloc`, freed on drop.
struct HostMemory {
    /// The first byte of the range handed out: `raw` rounded up to `SEGMENT_ALIGN`.
    ptr: *mut u8,
    raw: *mut u8,
    layout: Layout,
}

// SAFETY: the memory is owned by this value alone; the simulated device hands out its address
// as an integer and only touches the bytes under its own lock.
unsafe impl Send for HostMemory {}

impl HostMemory {
    fn new(size: u64) -> DeviceResult<Self> {
        // The system allocator zeroes lazily (calloc on fresh pages) only at its natural alignment;
        // asking for 2 MiB alignment would make it write every byte. So take `size` plus one
        // alignment unit at the natural alignment and align the pointer by hand: a large
        // reservation then costs nothing until its pages are touched.
        let layout = size
            .checked_add(SEGMENT_ALIGN)
            .and_then(|total| usize::try_from(total).ok())
            .and_then(|total| Layout::from_size_align(total, 16).ok())
            .ok_or(DeviceError::OutOfMemory)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        if raw.is_null() {
            return Err(DeviceError::OutOfMemory);
        }
        let offset = (raw as u64).next_multiple_of(SEGMENT_ALIGN) - raw as u64;
        // `offset < SEGMENT_ALIGN`, so `[ptr, ptr + size)` lies inside the allocation.
        Ok(Self { ptr: raw.wrapping_add(offset as usize), raw, layout })
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `alloc_zeroed` with this very layout and is freed only here.
        unsafe { std::alloc::dealloc(self.raw, self.layout) }
    }
}

#[derive(Default)]
struct Faults {
    /// Fail the segment allocation whose 1-based call number equals this.
    alloc_at: Option<u64>,
    free_at: Option<u64>,
    sync_at: Option<u64>,
    map_at: Option<u64>,
    unmap_at: Option<u64>,
    record_at: Option<u64>,
}

/// Counters the tests read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCounters {
    pub alloc_calls: u64,
    pub free_calls: u64,
    pub map_calls: u64,
    pub unmap_calls: u64,
    pub record_calls: u64,
    pub live_segments: u64,
    /// Bytes of physical memory in use: live segments plus mapped ranges.
    pub used: u64,
    pub zero_fills: u64,
    /// `synchronize_stream` calls.
    pub stream_syncs: u64,
}

struct Range {
    size: u64,
    host: Option<HostMemory>,
}

#[derive(Default)]
struct State {
    next_address: u64,
    segments: BTreeMap<u64, Range>,
    reservations: BTreeMap<u64, Range>,
    /// Mapped ranges inside reservations: start -> size.
    mappings: BTreeMap<u64, u64>,
    events: HashMap<u64, (StreamId, bool)>,
    next_event: u64,
    /// (stream, event) pairs passed to `stream_wait_event`.
    waits: Vec<(StreamId, EventId)>,
    /// Streams `synchronize_stream` waited for, until `take_synced_streams`.
    synced: Vec<StreamId>,
    auto_complete: bool,
    faults: Faults,
    counters: SimCounters,
}

/// A simulated GPU. Thread-safe; every call takes one short lock (it is never on the pool's fast
/// path: the pool calls the device only to grow, shrink and order streams).
pub struct SimDevice {
    ordinal: i32,
    capacity: u64,
    mode: SimMode,
    vm_granularity: Option<u64>,
    state: Mutex<State>,
}

impl SimDevice {
    /// A device of `capacity` bytes. Events complete as soon as they are recorded unless
    /// `set_auto_complete(false)` is called.
    pub fn new(capacity: u64, mode: SimMode) -> Self {
        Self {
            ordinal: 0,
            capacity,
            mode,
            vm_granularity: Some(2 * MIB),
            state: Mutex::new(State { next_address: ADDRESS_ONLY_BASE, auto_complete: true, ..State::default() }),
        }
    }

    pub fn with_ordinal(mut self, ordinal: i32) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// A device without virtual-memory growth (plain segments only).
    pub fn without_vm(mut self) -> Self {
        self.vm_granularity = None;
        self
    }

    pub fn mode(&self) -> SimMode {
        self.mode
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn counters(&self) -> SimCounters {
        self.state.lock().counters
    }

    /// Makes the `n`-th segment allocation from now (1 = the next) fail with an injected fault.
    pub fn fail_alloc_in(&self, n: u64) {
        let mut state = self.state.lock();
        state.faults.alloc_at = Some(state.counters.alloc_calls + n);
    }

    /// Makes the `n`-th segment free from now fail with an injected fault (the segment stays).
    pub fn fail_free_in(&self, n: u64) {
        let mut state = self.state.lock();
        state.faults.free_at = Some(state.counters.free_calls + n);
    }

    /// The streams `synchronize_stream` waited for since the last call (for a test's model of which
    /// streams have passed their work).
    pub fn take_synced_streams(&self) -> Vec<StreamId> {
        std::mem::take(&mut self.state.lock().synced)
    }

    /// Makes the `n`-th stream sync from now fail with an injected fault.
    pub fn fail_sync_in(&self, n: u64) {
        let mut state = self.state.lock();
        state.faults.sync_at = Some(state.counters.stream_syncs + n);
    }

    /// Makes the `n`-th map from now fail with an injected fault.
    pub fn fail_map_in(&self, n: u64) {
        let mut state = self.state.lock();
        state.faults.map_at = Some(state.counters.map_calls + n);
    }

    /// Makes the `n`-th unmap from now fail with an injected fault (the range stays mapped).
    pub fn fail_unmap_in(&self, n: u64) {
        let mut state = self.state.lock();
        state.faults.unmap_at = Some(state.counters.unmap_calls + n);
    }

    /// Makes the `n`-th event recording from now fail with an injected fault.
    pub fn fail_record_in(&self, n: u64) {
        let mut state = self.state.lock();
        state.faults.record_at = Some(state.counters.record_calls + n);
    }

    /// Whether events complete as soon as they are recorded (the default) or only when
    /// `complete_stream` / `complete_all` says so.
    pub fn set_auto_complete(&self, on: bool) {
        self.state.lock().auto_complete = on;
    }

    /// Completes every event recorded so far on `stream`.
    pub fn complete_stream(&self, stream: StreamId) {
        for (s, done) in self.state.lock().events.values_mut() {
            if *s == stream {
                *done = true;
            }
        }
    }

    pub fn complete_all(&self) {
        for (_, done) in self.state.lock().events.values_mut() {
            *done = true;
        }
    }

    /// Whether `stream` was made to wait for `event`.
    pub fn waited(&self, stream: StreamId, event: EventId) -> bool {
        self.state.lock().waits.contains(&(stream, event))
    }

    /// Address ranges reserved and not yet released.
    pub fn reservations(&self) -> usize {
        self.state.lock().reservations.len()
    }

    /// Events recorded and not yet released.
    pub fn live_events(&self) -> usize {
        self.state.lock().events.len()
    }

    /// Copies `bytes` into device memory at `addr` (host-backed mode; the range must lie inside
    /// one live segment or mapping).
    pub fn write(&self, addr: u64, bytes: &[u8]) -> DeviceResult<()> {
        let state = self.state.lock();
        let ptr = host_ptr(&state, addr, bytes.len() as u64)?;
        // SAFETY: `host_ptr` checked that the whole range lies inside host memory we own, and
        // we hold the state lock, so the memory cannot be freed meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Ok(())
    }

    /// Reads `len` bytes of device memory at `addr` (host-backed mode).
    pub fn read(&self, addr: u64, len: u64) -> DeviceResult<Vec<u8>> {
        let state = self.state.lock();
        let ptr = host_ptr(&state, addr, len)?;
        let mut out = vec![0u8; len as usize];
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), out.len()) };
        Ok(out)
    }

    fn take_address(&self, state: &mut State, size: u64) -> DeviceResult<(u64, Option<HostMemory>)> {
        match self.mode {
            SimMode::HostBacked => {
                let host = HostMemory::new(size)?;
                Ok((host.ptr as u64, Some(host)))
            }
            SimMode::AddressOnly => {
                let base = state.next_address;
                let span = size.checked_next_multiple_of(SEGMENT_ALIGN).ok_or(DeviceError::OutOfMemory)?;
                state.next_address = base.checked_add(span).ok_or(DeviceError::OutOfMemory)?;
                Ok((base, None))
            }
        }
    }

    fn charge(&self, state: &mut State, size: u64) -> DeviceResult<()> {
        match state.counters.used.checked_add(size) {
            Some(used) if used <= self.capacity => {
                state.counters.used = used;
                Ok(())
            }
            _ => Err(DeviceError::OutOfMemory),
        }
    }
}

/// The host pointer behind `[addr, addr + len)` if it lies inside one live host-backed range.
fn host_ptr(state: &State, addr: u64, len: u64) -> DeviceResult<*mut u8> {
    let inside = |ranges: &BTreeMap<u64, Range>| {
        let (&base, range) = ranges.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        let host = range.host.as_ref()?;
        (end <= base + range.size).then(|| host.ptr.wrapping_add((addr - base) as usize))
    };
    // Adjacent mappings make one contiguous range, as they do on a GPU.
    let mapped = |addr: u64| {
        let end = addr.saturating_add(len);
        let Some((&start, &size)) = state.mappings.range(..=addr).next_back() else { return false };
        let mut covered = start + size;
        for (&next, &size) in state.mappings.range(covered..) {
            if covered >= end || next != covered {
                break;
            }
            covered += size;
        }
        covered >= end
    };
    inside(&state.segments)
        .or_else(|| inside(&state.reservations).filter(|_| mapped(addr)))
        .ok_or_else(|| DeviceError::Driver(format!("{addr:#x}+{len} is not inside live host-backed memory")))
}

impl Device for SimDevice {
    fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn alloc_segment(&self, size: u64) -> DeviceResult<u64> {
        let mut state = self.state.lock();
        state.counters.alloc_calls += 1;
        if state.faults.alloc_at == Some(state.counters.alloc_calls) {
            return Err(DeviceError::InjectedFault("segment allocation"));
        }
        if size == 0 {
            return Err(DeviceError::Driver("segment of 0 bytes".into()));
        }
        self.charge(&mut state, size)?;
        match self.take_address(&mut state, size) {
            Ok((base, host)) => {
                state.segments.insert(base, Range { size, host });
                state.counters.live_segments += 1;
                Ok(base)
            }
            Err(e) => {
                state.counters.used -= size;
                Err(e)
            }
        }
    }

    fn synchronize_stream(&self, stream: StreamId) -> DeviceResult<()> {
        let mut state = self.state.lock();
        state.counters.stream_syncs += 1;
        if state.faults.sync_at == Some(state.counters.stream_syncs) {
            return Err(DeviceError::InjectedFault("stream sync"));
        }
        state.synced.push(stream);
        drop(state);
        self.complete_stream(stream);
        Ok(())
    }

    fn free_segment(&self, base: u64, size: u64) -> DeviceResult<()> {
        let mut state = self.state.lock();
        state.counters.free_calls += 1;
        if state.faults.free_at == Some(state.counters.free_calls) {
            return Err(DeviceError::InjectedFault("free"));
        }
        match state.segments.get(&base) {
            Some(range) if range.size == size => {}
            _ => return Err(DeviceError::Driver(format!("free of unknown segment {base:#x} ({size} B)"))),
        }
        state.segments.remove(&base);
        state.counters.live_segments -= 1;
        state.counters.used -= size;
        Ok(())
    }

    fn mem_info(&self) -> DeviceResult<MemInfo> {
        let used = self.state.lock().counters.used;
        Ok(MemInfo { free: self.capacity - used, total: self.capacity })
    }

    fn vm_granularity(&self) -> Option<u64> {
        self.vm_granularity
    }

    fn reserve(&self, size: u64) -> DeviceResult<u64> {
        let granularity = self.vm_granularity.ok_or(DeviceError::Unsupported("virtual-memory growth"))?;
        if size == 0 || size % granularity != 0 {
            return Err(DeviceError::Driver(format!("reservation of {size} B is not a granularity multiple")));
        }
        let mut state = self.state.lock();
        let (base, host) = self.take_address(&mut state, size)?;
        state.reservations.insert(base, Range { size, host });
        Ok(base)
    }

    fn unreserve(&self, base: u64, size: u64) -> DeviceResult<()> {
        let mut state = self.state.lock();
        match state.reservations.get(&base) {
            Some(range) if range.size == size => {}
            _ => return Err(DeviceError::Driver(format!("unknown reservation {base:#x}"))),
        }
        if state.mappings.range(base..base + size).next().is_some() {
            return Err(DeviceError::Driver(format!("reservation {base:#x} still has mappings")));
        }
        state.reservations.remove(&base);
        Ok(())
    }

    fn map(&self, addr: u64, size: u64) -> DeviceResult<()> {
        let granularity = self.vm_granularity.ok_or(DeviceError::Unsupported("virtual-memory growth"))?;
        let mut state = self.state.lock();
        state.counters.map_calls += 1;
        if state.faults.map_at == Some(state.counters.map_calls) {
            return Err(DeviceError::InjectedFault("map"));
        }
        let end = addr.checked_add(size).ok_or_else(|| DeviceError::Driver("map range overflows".into()))?;
        let in_reservation = state.reservations.range(..=addr).next_back().is_some_and(|(&base, range)| end <= base + range.size);
        let overlaps = state.mappings.range(..end).next_back().is_some_and(|(&start, &len)| start + len > addr);
        if size == 0 || addr % granularity != 0 || size % granularity != 0 || !in_reservation || overlaps {
            return Err(DeviceError::Driver(format!("bad map of {addr:#x}+{size}")));
        }
        self.charge(&mut state, size)?;
        state.mappings.insert(addr, size);
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> DeviceResult<()> {
        let mut state = self.state.lock();
        state.counters.unmap_calls += 1;
        if state.faults.unmap_at == Some(state.counters.unmap_calls) {
            return Err(DeviceError::InjectedFault("unmap"));
        }
        if state.mappings.get(&addr) != Some(&size) {
            return Err(DeviceError::Driver(format!("unmap of {addr:#x}+{size} that was not mapped")));
        }
        state.mappings.remove(&addr);
        state.counters.used -= size;
        Ok(())
    }

    fn record_event(&self, stream: StreamId) -> DeviceResult<EventId> {
        let mut state = self.state.lock();
        state.counters.record_calls += 1;
        if state.faults.record_at == Some(state.counters.record_calls) {
            return Err(DeviceError::InjectedFault("event record"));
        }
        state.next_event += 1;
        let id = state.next_event;
        let done = state.auto_complete;
        state.events.insert(id, (stream, done));
        Ok(EventId(id))
    }

    fn event_done(&self, event: EventId) -> DeviceResult<bool> {
        match self.state.lock().events.get(&event.0) {
            Some(&(_, done)) => Ok(done),
            None => Err(DeviceError::Driver(format!("unknown event {}", event.0))),
        }
    }

    /// The event's stream runs its work to the end (as `synchronize_stream` does), and so the event completes.
    fn wait_event(&self, event: EventId) -> DeviceResult<()> {
        let stream = match self.state.lock().events.get(&event.0) {
            Some(&(stream, _)) => stream,
            None => return Err(DeviceError::Driver(format!("unknown event {}", event.0))),
        };
        self.complete_stream(stream);
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        let mut state = self.state.lock();
        if !state.events.contains_key(&event.0) {
            return Err(DeviceError::Driver(format!("unknown event {}", event.0)));
        }
        state.waits.push((stream, event));
        Ok(())
    }

    fn release_event(&self, event: EventId) {
        self.state.lock().events.remove(&event.0);
    }

    fn fill_zero(&self, addr: u64, size: u64, _stream: StreamId) -> DeviceResult<()> {
        let mut state = self.state.lock();
        state.counters.zero_fills += 1;
        if self.mode == SimMode::HostBacked {
            let ptr = host_ptr(&state, addr, size)?;
            // SAFETY: `host_ptr` checked the range lies in host memory we own; we hold the lock.
            unsafe { std::ptr::write_bytes(ptr, 0, size as usize) };
        }
        Ok(())
    }

    fn copy_to_host(&self, addr: u64, target: &mut [u8]) -> DeviceResult<()> {
        if self.mode == SimMode::HostBacked {
            target.copy_from_slice(&self.read(addr, target.len() as u64)?);
        }
        Ok(())
    }

    fn copy_to_device(&self, addr: u64, source: &[u8]) -> DeviceResult<()> {
        match self.mode {
            SimMode::HostBacked => self.write(addr, source),
            SimMode::AddressOnly => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_enforced_and_returned() {
        let dev = SimDevice::new(4 * MIB, SimMode::AddressOnly);
        let a = dev.alloc_segment(2 * MIB).unwrap();
        let b = dev.alloc_segment(2 * MIB).unwrap();
        assert_eq!(dev.alloc_segment(512), Err(DeviceError::OutOfMemory));
        assert_ne!(a, b);
        dev.free_segment(a, 2 * MIB).unwrap();
        assert_eq!(dev.mem_info().unwrap().free, 2 * MIB);
        assert!(dev.free_segment(a, 2 * MIB).is_err(), "double free of a segment is refused");
    }

    #[test]
    fn host_backed_memory_reads_back_what_was_written() {
        let dev = SimDevice::new(8 * MIB, SimMode::HostBacked);
        let seg = dev.alloc_segment(MIB).unwrap();
        assert_eq!(seg % 512, 0);
        dev.write(seg + 100, b"vrampool").unwrap();
        assert_eq!(dev.read(seg + 100, 8).unwrap(), b"vrampool");
        assert!(dev.write(seg + MIB - 4, b"overflow").is_err(), "writes past the segment are refused");
        dev.fill_zero(seg, MIB, StreamId(0)).unwrap();
        assert_eq!(dev.read(seg + 100, 8).unwrap(), vec![0; 8]);
    }

    #[test]
    fn injected_faults_fail_exactly_the_nth_call() {
        let dev = SimDevice::new(64 * MIB, SimMode::AddressOnly);
        dev.fail_alloc_in(2);
        assert!(dev.alloc_segment(MIB).is_ok());
        assert_eq!(dev.alloc_segment(MIB), Err(DeviceError::InjectedFault("segment allocation")));
        assert!(dev.alloc_segment(MIB).is_ok());
        let base = dev.reserve(16 * MIB).unwrap();
        dev.fail_map_in(1);
        assert_eq!(dev.map(base, 2 * MIB), Err(DeviceError::InjectedFault("map")));
        dev.map(base, 2 * MIB).unwrap();
        dev.fail_record_in(2);
        assert!(dev.record_event(StreamId(1)).is_ok());
        assert_eq!(dev.record_event(StreamId(1)), Err(DeviceError::InjectedFault("event record")));
        assert!(dev.record_event(StreamId(1)).is_ok());
        assert_eq!(dev.live_events(), 2, "a failed recording leaves no event behind");
    }

    #[test]
    fn mappings_are_checked_and_charged() {
        let dev = SimDevice::new(4 * MIB, SimMode::HostBacked);
        let base = dev.reserve(64 * MIB).unwrap();
        dev.map(base, 2 * MIB).unwrap();
        assert!(dev.map(base, 2 * MIB).is_err(), "overlapping map refused");
        assert!(dev.map(base + MIB, 2 * MIB).is_err(), "unaligned map refused");
        dev.map(base + 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(dev.map(base + 4 * MIB, 2 * MIB), Err(DeviceError::OutOfMemory));
        dev.write(base + 2 * MIB - 2, b"span").unwrap();
        assert!(dev.unreserve(base, 64 * MIB).is_err(), "reservation with mappings is kept");
        dev.unmap(base, 2 * MIB).unwrap();
        dev.unmap(base + 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(dev.counters().used, 0);
        dev.unreserve(base, 64 * MIB).unwrap();
    }

    #[test]
    fn events_complete_when_the_test_says() {
        let dev = SimDevice::new(MIB, SimMode::AddressOnly);
        dev.set_auto_complete(false);
        let (s1, s2) = (StreamId(1), StreamId(2));
        let e1 = dev.record_event(s1).unwrap();
        let e2 = dev.record_event(s2).unwrap();
        assert!(!dev.event_done(e1).unwrap());
        dev.complete_stream(s1);
        assert!(dev.event_done(e1).unwrap());
        assert!(!dev.event_done(e2).unwrap());
        dev.stream_wait_event(s1, e2).unwrap();
        assert!(dev.waited(s1, e2));
        dev.release_event(e1);
        assert!(dev.event_done(e1).is_err());
    }
}
