//! `CudaDevice`: the pool's `Device` over the CUDA driver API, in the device's primary context.

use std::collections::{BTreeMap, HashSet};

use cudarc::driver::sys;
use parking_lot::Mutex;
use vrampool_core::device::DeviceResult;
use vrampool_core::{Device, DeviceError, EventId, MemInfo, StreamId};

use crate::calls;
use crate::driver::{self, CurrentContext};

mod pinned;
mod sharing;

pub use sharing::{Export, Handle, Sharing};

/// Every segment's base is a multiple of this, as the `Device` trait promises. `cuMemAlloc` only
/// promises 256 B (in practice it gives far more); `alloc_segment` pads in the rare other case.
const SEGMENT_ALIGN: u64 = 512;
/// Released events kept for reuse: creating one is a driver call, recording a cached one is not.
const EVENT_CACHE: usize = 256;

/// A segment from `cuMemAlloc`: what the driver returned (what `cuMemFree` takes) and its size.
#[derive(Debug, Clone, Copy)]
struct Segment {
    raw: u64,
    size: u64,
}

/// A range `map` backed: its size and the physical allocation behind it.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    allocation: u64,
}

#[derive(Default)]
struct VirtualMemory {
    /// Reserved address ranges: base -> size.
    reservations: BTreeMap<u64, u64>,
    /// Mapped ranges inside reservations: start -> mapping.
    mappings: BTreeMap<u64, Mapping>,
    /// Physical allocations no longer mapped whose `cuMemRelease` failed: tried again at the
    /// next unmap and at drop, so that a failed release does not leak the memory.
    unreleased: Vec<u64>,
    /// Other processes' allocations mapped by `import`: base -> size (each also a reservation
    /// and a mapping above).
    imports: BTreeMap<u64, u64>,
    /// Other processes' `cuMemAlloc` allocations opened by `import_legacy`: base -> size.
    legacy_imports: BTreeMap<u64, u64>,
}

#[derive(Default)]
struct Events {
    /// Released events, ready to be recorded again.
    cache: Vec<u64>,
    /// Events handed out by `record_event` and not yet released. Ids from elsewhere are refused,
    /// so a stale or made-up id is an error instead of a bad handle given to the driver.
    live: HashSet<u64>,
}

/// A CUDA device as the pool sees it. Thread-safe: each method makes the device's primary
/// context current on the calling thread for the length of the call (and puts the caller's own
/// back), and the bookkeeping sits behind short locks that no hot path of the pool takes.
///
/// Memory is device memory in the primary context, so addresses interoperate with PyTorch, CuPy,
/// Numba and anything else on the runtime API. Streams are raw `CUstream` handle values
/// (0: legacy default stream, 1: `CU_STREAM_LEGACY`, 2: `CU_STREAM_PER_THREAD`); a handle that is
/// none of those nor a live stream of this device's context cannot be checked here and is the
/// caller's error (as it is for the driver).
///
/// Dropping the device synchronises it and gives back whatever it still holds (segments,
/// mappings, reservations, events, streams it made), then releases the primary context.
pub struct CudaDevice {
    ordinal: i32,
    device: sys::CUdevice,
    /// The retained primary context, as its handle value (driver handles are kept as integers:
    /// valid in every thread, so the device is `Send + Sync` without an `unsafe impl`).
    context: u64,
    name: String,
    total: u64,
    vm_granularity: Option<u64>,
    /// How segments are shared with other processes (`new_shared`): with `FileDescriptor`, every
    /// segment is one shareable physical allocation, mapped in a reservation of its own rather
    /// than from `cuMemAlloc`.
    sharing: Sharing,
    /// Live segments: the base handed out -> the segment.
    segments: Mutex<BTreeMap<u64, Segment>>,
    vm: Mutex<VirtualMemory>,
    events: Mutex<Events>,
    /// Streams `create_stream` made and `destroy_stream` has not yet destroyed.
    streams: Mutex<HashSet<u64>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("total", &self.total)
            .field("vm_granularity", &self.vm_granularity)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens device `ordinal` (as CUDA numbers them, after `CUDA_VISIBLE_DEVICES`) and retains
    /// its primary context. Fails with `DeviceError::Driver` when there is no driver ("CUDA
    /// driver not found: ..."), no device, or no device of that ordinal; never panics.
    pub fn new(ordinal: i32) -> DeviceResult<Self> {
        driver::load()?;
        calls::init()?;
        let count = calls::device_count()?;
        if !(0..count).contains(&ordinal) {
            return Err(DeviceError::Driver(format!(
                "no CUDA device {ordinal}: {count} device(s) visible (CUDA_VISIBLE_DEVICES={})",
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into()),
            )));
        }
        let device = calls::device_get(ordinal)?;
        let context = calls::primary_ctx_retain(device)?;
        // From here on `Drop` releases the context, also if a query below fails.
        let mut this = Self {
            ordinal,
            device,
            context,
            name: String::new(),
            total: 0,
            vm_granularity: None,
            sharing: Sharing::None,
            segments: Mutex::default(),
            vm: Mutex::default(),
            events: Mutex::default(),
            streams: Mutex::default(),
        };
        let _current = this.enter()?;
        this.name = calls::device_name(device)?;
        this.total = calls::device_total_mem(device)?;
        this.vm_granularity = this.query_vm_granularity();
        Ok(this)
    }

    /// Number of CUDA devices visible to this process; an error when there is no driver.
    pub fn count() -> DeviceResult<i32> {
        driver::load()?;
        calls::init()?;
        calls::device_count()
    }

    /// The driver's CUDA version as `1000 * major + 10 * minor` (13000 for CUDA 13.0).
    pub fn driver_version() -> DeviceResult<i32> {
        driver::load()?;
        calls::driver_version()
    }

    /// The minimum granularity of pinned device memory, if the device supports virtual-memory
    /// management (and the driver has the functions).
    fn query_vm_granularity(&self) -> Option<u64> {
        let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
        let supported = calls::device_attribute(self.device, attribute).ok()? == 1;
        let functions = driver::VIRTUAL_MEMORY.iter().all(|name| driver::has_symbol(name));
        if !(supported && functions) {
            return None;
        }
        calls::allocation_granularity(self.device).ok().filter(|&g| g > 0 && g.is_power_of_two())
    }

    fn enter(&self) -> DeviceResult<CurrentContext> {
        CurrentContext::enter(self.context)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Total device memory in bytes.
    pub fn total_memory(&self) -> u64 {
        self.total
    }

    /// The `CUdevice` handle.
    pub fn cu_device(&self) -> sys::CUdevice {
        self.device
    }

    /// The primary context's handle value (a `CUcontext`).
    pub fn context_handle(&self) -> u64 {
        self.context
    }

    /// Makes the device's primary context current on the calling thread and leaves it so, for
    /// callers that go on to call the driver themselves (tests, benchmarks).
    pub fn bind_to_thread(&self) -> DeviceResult<()> {
        // Forgetting the guard skips putting the thread's previous context back.
        std::mem::forget(self.enter()?);
        Ok(())
    }

    /// Waits for all work on the device's context.
    pub fn synchronize(&self) -> DeviceResult<()> {
        let _current = self.enter()?;
        calls::ctx_synchronize()
    }

    /// Number of live segments (`alloc_segment` minus `free_segment`).
    pub fn live_segments(&self) -> usize {
        self.segments.lock().len()
    }

    /// Bytes currently mapped through `map`.
    pub fn mapped_bytes(&self) -> u64 {
        self.vm.lock().mappings.values().map(|m| m.size).sum()
    }

    /// A new non-blocking stream in the device's context; `destroy_stream` (or dropping the
    /// device) destroys it.
    pub fn create_stream(&self) -> DeviceResult<StreamId> {
        let _current = self.enter()?;
        let stream = calls::stream_create_non_blocking()?;
        self.streams.lock().insert(stream);
        Ok(StreamId(stream))
    }

    /// Destroys a stream `create_stream` made (others are refused).
    pub fn destroy_stream(&self, stream: StreamId) -> DeviceResult<()> {
        if !self.streams.lock().remove(&stream.0) {
            return Err(DeviceError::Driver(format!("stream {:#x} was not made by this device", stream.0)));
        }
        let _current = self.enter()?;
        // SAFETY: we made the stream and just took it out of the set, so it is destroyed once.
        unsafe { calls::stream_destroy(stream.0) }
    }

    /// Waits for the work queued on `stream`.
    pub fn synchronize_stream(&self, stream: StreamId) -> DeviceResult<()> {
        let _current = self.enter()?;
        // SAFETY: the stream handle is the caller's (see the type's documentation).
        unsafe { calls::stream_synchronize(stream.0) }
    }

    /// Fails unless `[address, address + len)` lies inside one live segment or is wholly mapped.
    fn check_owned(&self, address: u64, len: u64) -> DeviceResult<()> {
        if inside_one(&self.segments.lock(), |s| s.size, address, len) {
            return Ok(());
        }
        let vm = self.vm.lock();
        if covered(&vm.mappings, |m| m.size, address, len) || inside_one(&vm.legacy_imports, |&size| size, address, len) {
            return Ok(());
        }
        Err(DeviceError::Driver(format!("{address:#x}+{len} is not inside memory this device holds")))
    }

    fn reserved_granularity(&self) -> DeviceResult<u64> {
        self.vm_granularity.ok_or(DeviceError::Unsupported("virtual-memory growth"))
    }
}

impl Device for CudaDevice {
    fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn alloc_segment(&self, size: u64) -> DeviceResult<u64> {
        if self.sharing == Sharing::FileDescriptor {
            return self.alloc_shared_segment(size);
        }
        if size == 0 {
            return Err(DeviceError::Driver("segment of 0 bytes".into()));
        }
        let bytes = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
        let _current = self.enter()?;
        let mut raw = calls::mem_alloc(bytes)?;
        if raw % SEGMENT_ALIGN != 0 {
            // SAFETY: `raw` came from `cuMemAlloc` just now and was never handed out.
            unsafe { calls::mem_free(raw)? };
            let padded = bytes.checked_add(SEGMENT_ALIGN as usize - 1).ok_or(DeviceError::OutOfMemory)?;
            raw = calls::mem_alloc(padded)?;
        }
        let base = aligned_base(raw, SEGMENT_ALIGN);
        self.segments.lock().insert(base, Segment { raw, size });
        Ok(base)
    }

    fn synchronize_stream(&self, stream: StreamId) -> DeviceResult<()> {
        // A stream destroyed since the pool used it has no work left, but its handle is no
        // longer valid: the context's sync then stands in for it.
        CudaDevice::synchronize_stream(self, stream).or_else(|_| self.synchronize())
    }

    fn free_segment(&self, base: u64, size: u64) -> DeviceResult<()> {
        // Claim the segment first so that two frees of it cannot both reach the driver.
        let segment = {
            let mut segments = self.segments.lock();
            match segments.get(&base) {
                Some(segment) if segment.size == size => segments.remove(&base),
                _ => None,
            }
        }
        .ok_or_else(|| DeviceError::Driver(format!("free of unknown segment {base:#x} ({size} B)")))?;
        if self.sharing == Sharing::FileDescriptor {
            return self.free_shared_segment(base, segment);
        }
        let result = self.enter().and_then(|_current| {
            // SAFETY: the segment is ours, claimed above (so freed once); the caller waited for the
            // streams that used it (`Device::synchronize_stream`).
            unsafe { calls::mem_free(segment.raw) }
        });
        if result.is_err() {
            self.segments.lock().insert(base, segment);
        }
        result
    }

    fn mem_info(&self) -> DeviceResult<MemInfo> {
        let _current = self.enter()?;
        let (free, total) = calls::mem_get_info()?;
        Ok(MemInfo { free, total })
    }

    fn vm_granularity(&self) -> Option<u64> {
        self.vm_granularity
    }

    fn reserve(&self, size: u64) -> DeviceResult<u64> {
        let granularity = self.reserved_granularity()?;
        if size == 0 || size % granularity != 0 {
            return Err(DeviceError::Driver(format!("reservation of {size} B is not a multiple of the granularity ({granularity} B)")));
        }
        let bytes = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory)?;
        let _current = self.enter()?;
        let base = calls::address_reserve(bytes, granularity as usize)?;
        self.vm.lock().reservations.insert(base, size);
        Ok(base)
    }

    fn unreserve(&self, base: u64, size: u64) -> DeviceResult<()> {
        let mut vm = self.vm.lock();
        if vm.reservations.get(&base) != Some(&size) {
            return Err(DeviceError::Driver(format!("unreserve of unknown reservation {base:#x} ({size} B)")));
        }
        if vm.mappings.range(base..base + size).next().is_some() {
            return Err(DeviceError::Driver(format!("reservation {base:#x} still has mappings")));
        }
        let _current = self.enter()?;
        // SAFETY: a whole reservation of ours (checked above) with no mapping left in it; we
        // hold the lock, so nobody maps into it meanwhile.
        unsafe { calls::address_free(base, size as usize)? };
        vm.reservations.remove(&base);
        Ok(())
    }

    fn map(&self, addr: u64, size: u64) -> DeviceResult<()> {
        let granularity = self.reserved_granularity()?;
        // The lock is held across the driver calls so that a concurrent map of the same range
        // cannot pass the check too. Mapping is the pool's growth path: rare and slow anyway.
        let mut vm = self.vm.lock();
        check_map(&vm, granularity, addr, size).map_err(DeviceError::Driver)?;
        let bytes = size as usize; // fits: it lies inside a reservation the driver made
        let _current = self.enter()?;
        let allocation = calls::mem_create(bytes, self.device, self.sharing == Sharing::FileDescriptor)?;
        // SAFETY: checked under the lock we hold, which `map_allocation` keeps.
        unsafe { map_allocation(&mut vm, addr, size, allocation, self.device) }
    }

    fn unmap(&self, addr: u64, size: u64) -> DeviceResult<()> {
        let mapping = {
            let mut vm = self.vm.lock();
            match vm.mappings.get(&addr) {
                Some(m) if m.size == size => vm.mappings.remove(&addr),
                _ => None,
            }
        }
        .ok_or_else(|| DeviceError::Driver(format!("unmap of {addr:#x}+{size} that was not mapped")))?;
        let bytes = size as usize;
        let result = self.enter().and_then(|_current| {
            // SAFETY: one whole range we mapped, claimed above (so unmapped once); the caller
            // waited for the streams whose work touched it (`Device::synchronize_stream`).
            unsafe { calls::mem_unmap(addr, bytes) }
        });
        let mut vm = self.vm.lock();
        if let Err(e) = result {
            vm.mappings.insert(addr, mapping);
            return Err(e);
        }
        // The range is unmapped, whatever the releases below say: a failed one is kept and
        // tried again, and the pool sees the unmap it asked for.
        for allocation in std::mem::take(&mut vm.unreleased).into_iter().chain([mapping.allocation]) {
            release_or_keep(&mut vm, allocation);
        }
        Ok(())
    }

    fn record_event(&self, stream: StreamId) -> DeviceResult<EventId> {
        let _current = self.enter()?;
        let cached = self.events.lock().cache.pop();
        let event = match cached {
            Some(event) => event,
            None => calls::event_create()?,
        };
        // SAFETY: `event` is a live event of our context that no one else holds (fresh, or taken
        // out of the cache); the stream handle is the caller's (see the type's documentation).
        if let Err(e) = unsafe { calls::event_record(event, stream.0) } {
            self.events.lock().cache.push(event);
            return Err(e);
        }
        self.events.lock().live.insert(event);
        Ok(EventId(event))
    }

    fn event_done(&self, event: EventId) -> DeviceResult<bool> {
        // The lock is held across the query so that a concurrent release cannot destroy the
        // event under it; `cuEventQuery` is a quick, non-blocking call.
        let events = self.events.lock();
        if !events.live.contains(&event.0) {
            return Err(DeviceError::Driver(format!("unknown event {:#x}", event.0)));
        }
        let _current = self.enter()?;
        // SAFETY: a live event of ours, kept alive by the lock we hold.
        unsafe { calls::event_query(event.0) }
    }

    fn wait_event(&self, event: EventId) -> DeviceResult<()> {
        if !self.events.lock().live.contains(&event.0) {
            return Err(DeviceError::Driver(format!("unknown event {:#x}", event.0)));
        }
        let _current = self.enter()?;
        // SAFETY: a live event of ours; only its recorder releases it, and the caller waiting on it
        // is that recorder. The lock is not held meanwhile: the wait may be long.
        unsafe { calls::event_synchronize(event.0) }
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        let events = self.events.lock();
        if !events.live.contains(&event.0) {
            return Err(DeviceError::Driver(format!("unknown event {:#x}", event.0)));
        }
        let _current = self.enter()?;
        // SAFETY: a live event of ours, kept alive by the lock; the stream handle is the caller's.
        unsafe { calls::stream_wait_event(stream.0, event.0) }
    }

    fn release_event(&self, event: EventId) {
        let mut events = self.events.lock();
        if !events.live.remove(&event.0) {
            return;
        }
        if events.cache.len() < EVENT_CACHE {
            events.cache.push(event.0);
            return;
        }
        if let Ok(_current) = self.enter() {
            // SAFETY: a live event of ours, just taken out of the live set under the lock, so no
            // one can query it any more; the driver lets pending work finish recording it.
            let _ = unsafe { calls::event_destroy(event.0) };
        }
    }

    fn fill_zero(&self, addr: u64, size: u64, stream: StreamId) -> DeviceResult<()> {
        if size == 0 {
            return Ok(());
        }
        self.check_owned(addr, size)?;
        let _current = self.enter()?;
        // SAFETY: `check_owned` found the range in memory this device holds; the stream handle is
        // the caller's (see the type's documentation).
        unsafe { calls::memset_zero_async(addr, size as usize, stream.0) }
    }

    fn host_buffer(&self, len: usize) -> DeviceResult<Box<dyn vrampool_core::HostBuffer>> {
        pinned::host_buffer(self.context_handle(), len)
    }

    /// Copies `source` to device memory at `address`, which must lie inside one live segment or
    /// in mapped memory of this device. Synchronous.
    fn copy_to_device(&self, address: u64, source: &[u8]) -> DeviceResult<()> {
        self.check_owned(address, source.len() as u64)?;
        let _current = self.enter()?;
        // SAFETY: `check_owned` found the range in memory this device allocated and holds.
        unsafe { calls::copy_to_device(address, source) }
    }

    /// Copies device memory at `address` (inside one live segment or mapped memory of this
    /// device) into `target`. Synchronous.
    fn copy_to_host(&self, address: u64, target: &mut [u8]) -> DeviceResult<()> {
        self.check_owned(address, target.len() as u64)?;
        let _current = self.enter()?;
        // SAFETY: as in `copy_to_device`.
        unsafe { calls::copy_to_host(target, address) }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Errors are ignored: at process exit the driver may already be shutting down, and a drop
        // has nobody to report to. Everything is released in reverse order of dependence.
        let current = self.enter();
        if current.is_ok() {
            let _ = calls::ctx_synchronize();
            let vm = std::mem::take(self.vm.get_mut());
            for base in vm.legacy_imports.into_keys() {
                // SAFETY: opened by `import_legacy`, the context idle; closed once.
                let _ = unsafe { calls::ipc_close_mem_handle(base) };
            }
            for (addr, mapping) in vm.mappings {
                // SAFETY: our mapping, the context idle; each unmapped and released once.
                let _ = unsafe { calls::mem_unmap(addr, mapping.size as usize) };
                let _ = unsafe { calls::mem_release(mapping.allocation) };
            }
            for allocation in vm.unreleased {
                // SAFETY: unmapped physical memory whose release failed before; released once.
                let _ = unsafe { calls::mem_release(allocation) };
            }
            for (base, size) in vm.reservations {
                // SAFETY: our reservation, its mappings all gone; freed once.
                let _ = unsafe { calls::address_free(base, size as usize) };
            }
            // A shared device's segments were mappings, given back with them above.
            let mapped = self.sharing == Sharing::FileDescriptor;
            for (_, segment) in std::mem::take(self.segments.get_mut()).into_iter().filter(|_| !mapped) {
                // SAFETY: our segment, the context idle; freed once.
                let _ = unsafe { calls::mem_free(segment.raw) };
            }
            let events = std::mem::take(self.events.get_mut());
            for event in events.cache.into_iter().chain(events.live) {
                // SAFETY: our events; nobody can use them once the device is gone.
                let _ = unsafe { calls::event_destroy(event) };
            }
            for stream in std::mem::take(self.streams.get_mut()) {
                // SAFETY: streams we made, idle, destroyed once.
                let _ = unsafe { calls::stream_destroy(stream) };
            }
        }
        drop(current);
        // SAFETY: balances the retain in `new`, once.
        let _ = unsafe { calls::primary_ctx_release(self.device) };
    }
}

/// Maps `allocation` (at least `size` bytes; released on failure) at `addr` with read-write
/// access for `device`, and records the mapping.
///
/// # Safety
/// `[addr, addr + size)` lies in one reservation of `vm`'s and overlaps no mapping
/// (`check_map`), the caller holding `vm`'s lock since that check; the device's context is
/// current.
unsafe fn map_allocation(vm: &mut VirtualMemory, addr: u64, size: u64, allocation: u64, device: sys::CUdevice) -> DeviceResult<()> {
    // Fits: it lies inside a reservation the driver made.
    let bytes = size as usize;
    // SAFETY: as the caller guarantees.
    if let Err(e) = unsafe { calls::mem_map(addr, bytes, allocation) } {
        // Created (or imported) by the caller, mapped nowhere.
        release_or_keep(vm, allocation);
        return Err(e);
    }
    // SAFETY: the range was mapped just above.
    if let Err(e) = unsafe { calls::mem_set_access(addr, bytes, device) } {
        // SAFETY: undoes the map above (nothing can have used the range: it had no access).
        if unsafe { calls::mem_unmap(addr, bytes) }.is_ok() {
            release_or_keep(vm, allocation);
        } else {
            // Still mapped: the record keeps it, so a later unmap (or the drop) frees it.
            vm.mappings.insert(addr, Mapping { size, allocation });
        }
        return Err(e);
    }
    vm.mappings.insert(addr, Mapping { size, allocation });
    Ok(())
}

/// Releases `allocation`, which no mapping uses any more; on a failure keeps it in
/// `vm.unreleased` to be released later.
fn release_or_keep(vm: &mut VirtualMemory, allocation: u64) {
    // SAFETY: the callers pass physical allocations of ours that are mapped nowhere and that
    // no record other than this call holds, so each is released once.
    if unsafe { calls::mem_release(allocation) }.is_err() {
        vm.unreleased.push(allocation);
    }
}

/// `raw` rounded up to `align` (a power of two); `raw` is a device address far below `u64::MAX`.
fn aligned_base(raw: u64, align: u64) -> u64 {
    (raw + align - 1) & !(align - 1)
}

/// Whether `[addr, addr + len)` lies inside one range of `ranges` (start -> value).
fn inside_one<V>(ranges: &BTreeMap<u64, V>, size_of: impl Fn(&V) -> u64, addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else { return false };
    ranges.range(..=addr).next_back().is_some_and(|(&start, v)| end <= start.saturating_add(size_of(v)))
}

/// Whether every byte of `[addr, addr + len)` lies in some range of `ranges`, which may be
/// adjacent (a block of an expandable segment can span two `map` calls).
fn covered<V>(ranges: &BTreeMap<u64, V>, size_of: impl Fn(&V) -> u64, addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else { return false };
    let mut at = addr;
    loop {
        match ranges.range(..=at).next_back() {
            Some((&start, v)) if start.saturating_add(size_of(v)) > at => {
                at = start.saturating_add(size_of(v));
                if at >= end {
                    return true;
                }
            }
            _ => return false,
        }
    }
}

/// Why mapping `[addr, addr + size)` is refused, if it is.
fn check_map(vm: &VirtualMemory, granularity: u64, addr: u64, size: u64) -> Result<(), String> {
    let Some(end) = addr.checked_add(size) else { return Err(format!("map of {addr:#x}+{size} overflows")) };
    if size == 0 || addr % granularity != 0 || size % granularity != 0 {
        return Err(format!("map of {addr:#x}+{size} is not in multiples of the granularity ({granularity} B)"));
    }
    if !inside_one(&vm.reservations, |&s| s, addr, size) {
        return Err(format!("map of {addr:#x}+{size} is not inside one reservation"));
    }
    if vm.mappings.range(..end).next_back().is_some_and(|(&start, m)| start + m.size > addr) {
        return Err(format!("map of {addr:#x}+{size} overlaps a mapping"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn the_device_is_send_and_sync() {
        assert_send_sync::<CudaDevice>();
    }

    #[test]
    fn without_a_driver_new_is_a_clear_error_not_a_panic() {
        let result = std::panic::catch_unwind(|| CudaDevice::new(0));
        let result = result.expect("CudaDevice::new must not panic");
        if driver::load().is_err() {
            match result {
                Err(DeviceError::Driver(text)) => assert!(text.contains("CUDA driver not found"), "{text}"),
                other => panic!("expected a driver error, got {other:?}"),
            }
            assert!(matches!(CudaDevice::count(), Err(DeviceError::Driver(_))));
            assert!(matches!(CudaDevice::driver_version(), Err(DeviceError::Driver(_))));
        } else {
            // A machine with a driver: a device, or a driver error (no device visible).
            assert!(matches!(result, Ok(_) | Err(DeviceError::Driver(_))), "{result:?}");
        }
    }

    #[test]
    fn bad_ordinals_are_errors() {
        for ordinal in [-1, i32::MAX] {
            match std::panic::catch_unwind(|| CudaDevice::new(ordinal)).expect("no panic") {
                Err(DeviceError::Driver(_)) => {}
                other => panic!("ordinal {ordinal}: expected a driver error, got {other:?}"),
            }
        }
    }

    #[test]
    fn bases_are_aligned_up() {
        assert_eq!(aligned_base(0x1000, 512), 0x1000);
        assert_eq!(aligned_base(0x1100, 512), 0x1200);
        assert_eq!(aligned_base(0x11ff, 512), 0x1200);
    }

    #[test]
    fn ranges_inside_one_segment() {
        let segments: BTreeMap<u64, u64> = [(0x1000, 0x1000), (0x2000, 0x1000)].into();
        assert!(inside_one(&segments, |&s| s, 0x1000, 0x1000));
        assert!(inside_one(&segments, |&s| s, 0x1800, 0x100));
        assert!(!inside_one(&segments, |&s| s, 0x1800, 0x1000), "adjacent segments are not one");
        assert!(!inside_one(&segments, |&s| s, 0x800, 0x10));
        assert!(!inside_one(&segments, |&s| s, 0x3000, 1));
        assert!(!inside_one(&segments, |&s| s, u64::MAX, 2), "overflow refused");
    }

    #[test]
    fn ranges_covered_by_adjacent_mappings() {
        let mappings: BTreeMap<u64, u64> = [(0, G), (G, G), (4 * G, G)].into();
        assert!(covered(&mappings, |&s| s, G / 2, G), "spans two adjacent mappings");
        assert!(covered(&mappings, |&s| s, 0, 2 * G));
        assert!(!covered(&mappings, |&s| s, G, 2 * G), "hole at 2G");
        assert!(!covered(&mappings, |&s| s, 3 * G, 10));
        assert!(covered(&mappings, |&s| s, 4 * G, G));
        assert!(!covered(&mappings, |&s| s, 4 * G, G + 1));
        assert!(!covered(&mappings, |&s| s, u64::MAX - 1, 4));
    }

    #[test]
    fn maps_are_checked_before_the_driver_sees_them() {
        let mut vm = VirtualMemory::default();
        vm.reservations.insert(16 * G, 8 * G);
        vm.mappings.insert(18 * G, Mapping { size: 2 * G, allocation: 1 });
        assert!(check_map(&vm, G, 16 * G, 2 * G).is_ok());
        assert!(check_map(&vm, G, 20 * G, 4 * G).is_ok());
        assert!(check_map(&vm, G, 17 * G, 2 * G).unwrap_err().contains("overlaps"));
        assert!(check_map(&vm, G, 19 * G, G).unwrap_err().contains("overlaps"));
        assert!(check_map(&vm, G, 22 * G, 4 * G).unwrap_err().contains("reservation"));
        assert!(check_map(&vm, G, 0, G).unwrap_err().contains("reservation"));
        assert!(check_map(&vm, G, 16 * G + 512, G).unwrap_err().contains("granularity"));
        assert!(check_map(&vm, G, 16 * G, 0).unwrap_err().contains("granularity"));
        assert!(check_map(&vm, G, u64::MAX - G + 1, 2 * G).unwrap_err().contains("overflows"));
    }
}
