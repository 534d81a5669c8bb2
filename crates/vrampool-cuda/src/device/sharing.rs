//! Memory other processes map (issue 50). A shared device makes every segment one physical
//! allocation with a POSIX file-descriptor handle, mapped in a reservation of its own; `export`
//! hands out a descriptor for the allocation under a block, and `import`, in the other process,
//! maps such a descriptor (`cuMemImportFromShareableHandle` + reserve + map + access).

use std::os::fd::{FromRawFd, OwnedFd};

use vrampool_core::device::DeviceResult;
use vrampool_core::{Device, DeviceError};

use super::{check_map, inside_one, map_allocation, CudaDevice, Segment};
use crate::{calls, driver};

/// What another process needs to map the allocation under a block.
#[derive(Debug)]
pub struct Export {
    /// A file descriptor for the whole physical allocation.
    pub fd: OwnedFd,
    /// Where the block starts inside the allocation.
    pub offset: u64,
    /// The allocation's size (what the importer maps).
    pub size: u64,
}

impl CudaDevice {
    /// Opens device `ordinal` as `new` does, with every segment shareable. Fails with
    /// `DeviceError::Unsupported` where the device has no virtual-memory management or the
    /// driver no shareable handles.
    pub fn new_shared(ordinal: i32) -> DeviceResult<Self> {
        let mut device = Self::new(ordinal)?;
        let functions = driver::SHARING.iter().all(|name| driver::has_symbol(name));
        if device.vm_granularity.is_none() || !functions {
            return Err(DeviceError::Unsupported("sharing memory with other processes (it needs virtual-memory management)"));
        }
        device.shared = true;
        Ok(device)
    }

    /// Whether every segment is shareable (`new_shared`).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// A segment of at least `size` bytes: one shareable allocation of whole granules, mapped in
    /// a reservation of its own.
    pub(super) fn alloc_shared_segment(&self, size: u64) -> DeviceResult<u64> {
        let granularity = self.reserved_granularity()?;
        let rounded = size.checked_next_multiple_of(granularity).ok_or(DeviceError::OutOfMemory)?;
        let base = self.reserve(rounded)?;
        if let Err(e) = self.map(base, rounded) {
            // Nothing is mapped there: the reservation goes back at once.
            let _ = self.unreserve(base, rounded);
            return Err(e);
        }
        self.segments.lock().insert(base, Segment { raw: base, size });
        Ok(base)
    }

    /// Gives back a segment `alloc_shared_segment` made, already claimed from `segments`.
    pub(super) fn free_shared_segment(&self, base: u64, segment: Segment) -> DeviceResult<()> {
        let rounded = segment.size.next_multiple_of(self.reserved_granularity()?);
        if let Err(e) = self.unmap(base, rounded) {
            self.segments.lock().insert(base, segment);
            return Err(e);
        }
        // Unmapped: the segment is gone for the pool even if its address range stays reserved.
        self.unreserve(base, rounded)
    }

    /// A file descriptor for the allocation under `[addr, addr + len)`, with the block's offset in
    /// it. Refused unless the device is shared and the range lies in one of its allocations.
    pub fn export(&self, addr: u64, len: u64) -> DeviceResult<Export> {
        if !self.shared {
            return Err(DeviceError::Unsupported("sharing memory made without ipc (open it with new_shared)"));
        }
        let vm = self.vm.lock();
        if !inside_one(&vm.mappings, |m| m.size, addr, len) {
            return Err(DeviceError::Driver(format!("{addr:#x}+{len} is not inside one allocation of this device")));
        }
        let (&start, mapping) = vm.mappings.range(..=addr).next_back().expect("inside one mapping");
        if vm.imports.contains_key(&start) {
            return Err(DeviceError::Driver(format!("{addr:#x} is another process's memory, imported here")));
        }
        let _current = self.enter()?;
        let fd = calls::mem_export_fd(mapping.allocation)?;
        // SAFETY: the driver just made `fd` for us and nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Export { fd, offset: addr - start, size: mapping.size })
    }

    /// Maps the `size` bytes of another process's export `fd` (the caller keeps `fd`), readable
    /// and writable; the base address. `close_import` gives it back.
    pub fn import(&self, fd: i32, size: u64) -> DeviceResult<u64> {
        let base = self.reserve(size)?;
        let mapped = {
            let mut vm = self.vm.lock();
            let granularity = self.reserved_granularity()?;
            check_map(&vm, granularity, base, size).map_err(DeviceError::Driver)?;
            self.enter().and_then(|_current| {
                let allocation = calls::mem_import_fd(fd)?;
                // SAFETY: checked under the lock we hold; the driver refuses a `size` larger
                // than the imported allocation.
                unsafe { map_allocation(&mut vm, base, size, allocation, self.device) }
            })
        };
        match mapped {
            Ok(()) => {
                self.vm.lock().imports.insert(base, size);
                Ok(base)
            }
            Err(e) => {
                let _ = self.unreserve(base, size);
                Err(e)
            }
        }
    }

    /// Unmaps an `import` (after the work that used it: the caller waits for it) and gives its
    /// address range back.
    pub fn close_import(&self, base: u64) -> DeviceResult<()> {
        let size = self.vm.lock().imports.remove(&base).ok_or_else(|| DeviceError::Driver(format!("{base:#x} is not an import")))?;
        if let Err(e) = self.unmap(base, size) {
            self.vm.lock().imports.insert(base, size);
            return Err(e);
        }
        self.unreserve(base, size)
    }

    /// Imports still open.
    pub fn open_imports(&self) -> usize {
        self.vm.lock().imports.len()
    }
}
