//! Memory across processes: shareable handles of physical allocations (POSIX file descriptors)
//! and the legacy IPC handles of `cuMemAlloc` allocations.

use std::ffi::{c_int, c_uint, c_void};

use super::put;
use super::virtual_memory::vmm;
use crate::abi::{self, CuResult, IpcMemHandle};
use crate::emulator;

driver_fn!(
    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: u64, handle_type: u32, flags: u64) {
        let e = vmm()?;
        if shareable.is_null() || flags != 0 {
            return Err(abi::INVALID_VALUE);
        }
        if handle_type != abi::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(abi::NOT_SUPPORTED);
        }
        let fd = e.memory.read().export(handle)?;
        // SAFETY: for a POSIX file descriptor the out-parameter is an `int`; checked non-null.
        unsafe { put(shareable as *mut c_int, fd) }
    }
);

driver_fn!(
    fn cuMemImportFromShareableHandle(handle: *mut u64, os_handle: *mut c_void, handle_type: u32) {
        let e = vmm()?;
        let device = e.current()?.device;
        if handle.is_null() {
            return Err(abi::INVALID_VALUE);
        }
        if handle_type != abi::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(abi::NOT_SUPPORTED);
        }
        // A POSIX file descriptor is passed as the pointer's value.
        let fd = c_int::try_from(os_handle as usize).map_err(|_| abi::INVALID_VALUE)?;
        let h = e.memory.write().import(device, fd, e.config.granularity)?;
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(handle, h) }
    }
);

driver_fn!(
    fn cuIpcGetMemHandle(handle: *mut IpcMemHandle, dptr: u64) {
        let e = emulator();
        e.current()?;
        if handle.is_null() {
            return Err(abi::INVALID_VALUE);
        }
        let h = e.memory.write().ipc_get(dptr)?;
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(handle, h) }
    }
);

driver_fn!(
    fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcMemHandle, flags: c_uint) {
        let e = emulator();
        let device = e.current()?.device;
        if dptr.is_null() || flags != abi::IPC_MEM_LAZY_ENABLE_PEER_ACCESS {
            return Err(abi::INVALID_VALUE);
        }
        let base = e.memory.write().ipc_open(device, &handle)?;
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(dptr, base) }
    }
);

driver_fn!(
    fn cuIpcCloseMemHandle(dptr: u64) {
        let e = emulator();
        e.current()?;
        let size = e.memory.read().opened_at(dptr).ok_or(abi::INVALID_VALUE)?;
        e.host_releases("cuIpcCloseMemHandle", dptr, dptr + size);
        e.memory.write().ipc_close(dptr)
    }
);
