//! What the pool needs from a GPU: segments, optional virtual-memory growth, streams and events.
//!
//! `SimDevice` implements it on the host so that every algorithm is testable without a GPU; the
//! CUDA driver implementation lives in its own crate.

mod sim;

pub use sim::{SimDevice, SimMode};

use crate::error::DeviceError;

/// An opaque stream handle (a `CUstream` on CUDA). 0 is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// `CU_STREAM_LEGACY`, the handle CUDA also accepts for the legacy default stream.
    pub const LEGACY: u64 = 1;

    /// The stream a handle names: `CU_STREAM_LEGACY` (1) and 0 are the same stream, the legacy
    /// default one, so both map to `StreamId(0)`.
    pub fn canonical(handle: u64) -> StreamId {
        match handle {
            StreamId::LEGACY => StreamId(0),
            handle => StreamId(handle),
        }
    }
}

/// An opaque event handle, recorded on a stream by `Device::record_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Host memory that device copies read and write (a pause's backup): page-locked where the device
/// can give it, so that copies run at the bus's full speed.
pub trait HostBuffer: Send {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl HostBuffer for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// `len` bytes of ordinary (pageable) host memory; an error, not an abort, when there is none.
pub fn pageable_host_buffer(len: usize) -> DeviceResult<Box<dyn HostBuffer>> {
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).map_err(|_| DeviceError::Driver(format!("no host memory for {len} bytes")))?;
    bytes.resize(len, 0);
    Ok(Box::new(bytes))
}

pub trait Device: Send + Sync {
    /// Device ordinal (0-based); the simulated device reports the one it was made with.
    fn ordinal(&self) -> i32;

    /// Allocates a segment of `size` bytes (device memory, like `cuMemAlloc`), aligned to >= 512 B.
    fn alloc_segment(&self, size: u64) -> DeviceResult<u64>;

    /// Frees a segment that `alloc_segment` returned, with the size it was allocated with. It
    /// waits for no stream: the caller waits first (`synchronize_stream`) for the streams whose
    /// work may still touch the memory.
    fn free_segment(&self, base: u64, size: u64) -> DeviceResult<()>;

    /// Waits until the work queued so far on `stream` is done (`cuStreamSynchronize`). The pool
    /// calls it before memory that the stream's blocks used goes back to the device.
    fn synchronize_stream(&self, _stream: StreamId) -> DeviceResult<()> {
        Ok(())
    }

    fn mem_info(&self) -> DeviceResult<MemInfo>;

    /// The granularity of virtual-memory mapping, or None if the device cannot grow a reserved
    /// address range (then the `reserve` / `map` family is never called).
    fn vm_granularity(&self) -> Option<u64> {
        None
    }

    /// Reserves `size` bytes of address space (no memory behind it), like `cuMemAddressReserve`.
    fn reserve(&self, _size: u64) -> DeviceResult<u64> {
        Err(DeviceError::Unsupported("virtual-memory growth"))
    }

    /// Releases an address range `reserve` returned; it must hold no mapping.
    fn unreserve(&self, _base: u64, _size: u64) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("virtual-memory growth"))
    }

    /// Backs `[addr, addr + size)` (granularity multiples, inside a reservation) with physical
    /// memory and makes it accessible, like `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`.
    fn map(&self, _addr: u64, _size: u64) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("virtual-memory growth"))
    }

    /// Unmaps a range `map` mapped and gives its physical memory back; like `free_segment`, it
    /// waits for no stream.
    fn unmap(&self, _addr: u64, _size: u64) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("virtual-memory growth"))
    }

    /// Records an event on `stream` that completes when the work queued so far on it is done.
    fn record_event(&self, stream: StreamId) -> DeviceResult<EventId>;

    /// Whether the event has completed.
    fn event_done(&self, event: EventId) -> DeviceResult<bool>;

    /// Blocks the calling thread until `event` has completed (`cuEventSynchronize`).
    fn wait_event(&self, event: EventId) -> DeviceResult<()> {
        while !self.event_done(event)? {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Makes `stream` wait for `event`: work queued on `stream` afterwards runs after it.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()>;

    /// Gives an event back (to a cache, or to the driver).
    fn release_event(&self, event: EventId);

    /// Fills `[addr, addr + size)` with zeros, ordered on `stream` (for scrubbing).
    fn fill_zero(&self, addr: u64, size: u64, stream: StreamId) -> DeviceResult<()>;

    /// `len` bytes of host memory for copies to and from the device.
    fn host_buffer(&self, len: usize) -> DeviceResult<Box<dyn HostBuffer>> {
        pageable_host_buffer(len)
    }

    /// Copies device memory at `addr` into `target`, after all work queued before it (a pause's
    /// backup). Synchronous.
    fn copy_to_host(&self, _addr: u64, _target: &mut [u8]) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("copies to the host"))
    }

    /// Copies `source` into device memory at `addr` (a resume's restore). Synchronous.
    fn copy_to_device(&self, _addr: u64, _source: &[u8]) -> DeviceResult<()> {
        Err(DeviceError::Unsupported("copies from the host"))
    }
}

#[cfg(test)]
mod tests {
    use super::StreamId;

    #[test]
    fn the_legacy_handle_and_zero_are_one_stream() {
        assert_eq!(StreamId::canonical(1), StreamId(0));
        assert_eq!(StreamId::canonical(0), StreamId(0));
        assert_eq!(StreamId::canonical(2), StreamId(2));
        assert_eq!(StreamId::canonical(u64::MAX), StreamId(u64::MAX));
    }
}
