//! Memory other processes map (issue 50). A shared device makes every segment one physical
//! allocation with a POSIX file-descriptor handle, mapped in a reservation of its own; `export`
//! hands out a descriptor for the allocation under a block, and `import`, in the other process,
//! maps such a descriptor (`cuMemImportFromShareableHandle` + reserve + map + access). Where the
//! device has no virtual-memory management, or when asked (`new_shared_legacy`: the handles
//! Numba, CuPy and PyTorch open), segments stay `cuMemAlloc` allocations and `export` hands out
//! their legacy IPC handle (`cuIpcGetMemHandle`), which `import_legacy` opens.

use std::os::fd::{FromRawFd, OwnedFd};

use vrampool_core::device::DeviceResult;
use vrampool_core::{Device, DeviceError};

use super::{check_map, inside_one, map_allocation, CudaDevice, Segment};
use crate::{calls, driver};

/// How a device's segments are shared with other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Not at all (`CudaDevice::new`).
    None,
    /// Each segment is one physical allocation with a POSIX file-descriptor handle.
    FileDescriptor,
    /// Segments are `cuMemAlloc` allocations, shared by legacy IPC handles.
    Legacy,
}

/// What another process opens to reach an allocation.
#[derive(Debug)]
pub enum Handle {
    /// A file descriptor for the whole physical allocation (`Sharing::FileDescriptor`).
    Fd(OwnedFd),
    /// The allocation's `CUipcMemHandle` (`Sharing::Legacy`): plain bytes.
    Legacy([u8; 64]),
}

/// What another process needs to map the allocation under a block.
#[derive(Debug)]
pub struct Export {
    pub handle: Handle,
    /// Where the block starts inside the allocation.
    pub offset: u64,
    /// The allocation's size (what the importer maps).
    pub size: u64,
}

impl CudaDevice {
    /// Opens device `ordinal` as `new` does, with every segment shareable: by file descriptor
    /// where the device has virtual-memory management and the driver shareable handles, by
    /// legacy IPC handle elsewhere.
    pub fn new_shared(ordinal: i32) -> DeviceResult<Self> {
        let mut device = Self::new(ordinal)?;
        let functions = driver::SHARING.iter().all(|name| driver::has_symbol(name));
        device.sharing = if device.vm_granularity.is_some() && functions { Sharing::FileDescriptor } else { Sharing::Legacy };
        Ok(device)
    }

    /// Opens device `ordinal` as `new` does, its segments shared by legacy IPC handle.
    pub fn new_shared_legacy(ordinal: i32) -> DeviceResult<Self> {
        let mut device = Self::new(ordinal)?;
        device.sharing = Sharing::Legacy;
        Ok(device)
    }

    /// How the segments are shared.
    pub fn sharing(&self) -> Sharing {
        self.sharing
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

    /// A handle for the allocation under `[addr, addr + len)`, with the block's offset in it.
    /// Refused unless the device is shared and the range lies in one of its allocations.
    pub fn export(&self, addr: u64, len: u64) -> DeviceResult<Export> {
        match self.sharing {
            Sharing::None => Err(DeviceError::Unsupported("sharing memory made without ipc (open it with new_shared)")),
            Sharing::FileDescriptor => self.export_fd(addr, len),
            Sharing::Legacy => self.export_legacy(addr, len),
        }
    }

    fn export_fd(&self, addr: u64, len: u64) -> DeviceResult<Export> {
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
        Ok(Export { handle: Handle::Fd(fd), offset: addr - start, size: mapping.size })
    }

    fn export_legacy(&self, addr: u64, len: u64) -> DeviceResult<Export> {
        let (base, segment) = {
            let segments = self.segments.lock();
            let inside = inside_one(&segments, |s| s.size, addr, len);
            inside.then(|| segments.range(..=addr).next_back().map(|(&base, &segment)| (base, segment)).expect("inside one segment"))
        }
        .ok_or_else(|| DeviceError::Driver(format!("{addr:#x}+{len} is not inside one segment of this device")))?;
        let _current = self.enter()?;
        let handle = calls::ipc_get_mem_handle(segment.raw)?;
        // The importer opens the whole allocation, which starts where `cuMemAlloc` put it.
        Ok(Export { handle: Handle::Legacy(handle), offset: addr - segment.raw, size: base - segment.raw + segment.size })
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
    /// address range back. On an error the import stays open, as far as the driver got: a
    /// later call finishes the job.
    pub fn close_import(&self, base: u64) -> DeviceResult<()> {
        // Claimed (so closed once), the lock let go before the driver call and its error path.
        let legacy = self.vm.lock().legacy_imports.remove(&base);
        if let Some(size) = legacy {
            let closed = self.enter().and_then(|_current| {
                // SAFETY: opened by `import_legacy` (claimed above, so closed once); the caller
                // waited for the work that used it.
                unsafe { calls::ipc_close_mem_handle(base) }
            });
            if closed.is_err() {
                self.vm.lock().legacy_imports.insert(base, size);
            }
            return closed;
        }
        let size = self.vm.lock().imports.get(&base).copied().ok_or_else(|| DeviceError::Driver(format!("{base:#x} is not an import")))?;
        // A retry after a failed `cuMemAddressFree` finds the range unmapped already.
        if self.vm.lock().mappings.contains_key(&base) {
            self.unmap(base, size)?;
        }
        self.unreserve(base, size)?;
        self.vm.lock().imports.remove(&base);
        Ok(())
    }

    /// Opens another process's allocation by its legacy IPC handle; its base address here and
    /// its size, as the driver reports it (`cuMemGetAddressRange`). `close_import` closes it.
    pub fn import_legacy(&self, handle: [u8; 64]) -> DeviceResult<(u64, u64)> {
        let _current = self.enter()?;
        let base = calls::ipc_open_mem_handle(handle)?;
        match calls::mem_address_range(base) {
            Ok((_, size)) => {
                self.vm.lock().legacy_imports.insert(base, size);
                Ok((base, size))
            }
            Err(e) => {
                // SAFETY: opened just above and never handed out; closed once.
                let _ = unsafe { calls::ipc_close_mem_handle(base) };
                Err(e)
            }
        }
    }

    /// Imports still open.
    pub fn open_imports(&self) -> usize {
        let vm = self.vm.lock();
        vm.imports.len() + vm.legacy_imports.len()
    }
}
