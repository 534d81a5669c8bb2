//! Virtual memory: granularity, address reservations, physical allocations, mappings and access.

use std::ffi::c_int;
use std::sync::atomic::Ordering::Relaxed;

use super::{get, put};
use crate::abi::{self, CuResult, MemAccessDesc, MemAllocationProp};
use crate::emulator;

pub(super) fn vmm() -> Result<&'static crate::Emulator, CuResult> {
    let e = emulator();
    e.current()?;
    if e.config.vmm {
        Ok(e)
    } else {
        Err(abi::NOT_SUPPORTED)
    }
}

/// The device a `CUmemAllocationProp` names, if it is a valid pinned-device property.
fn prop_device(prop: *const MemAllocationProp) -> Result<i32, CuResult> {
    // SAFETY: in-parameter (see `get`).
    let prop = unsafe { get(prop)? };
    if prop.type_ != abi::MEM_ALLOCATION_TYPE_PINNED || prop.location.type_ != abi::MEM_LOCATION_TYPE_DEVICE {
        return Err(abi::INVALID_VALUE);
    }
    emulator().device(prop.location.id)
}

driver_fn!(
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const MemAllocationProp, option: c_int) {
        let e = vmm()?;
        prop_device(prop)?;
        if !(0..=1).contains(&option) {
            return Err(abi::INVALID_VALUE);
        }
        // SAFETY: out-parameter.
        unsafe { put(granularity, e.config.granularity as usize) }
    }
);

driver_fn!(
    fn cuMemAddressReserve(ptr: *mut u64, size: usize, alignment: usize, _addr: u64, flags: u64) {
        let e = vmm()?;
        if ptr.is_null() || flags != 0 {
            return Err(abi::INVALID_VALUE);
        }
        let base = e.memory.write().reserve(size as u64, alignment as u64, e.config.granularity)?;
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(ptr, base) }
    }
);

driver_fn!(
    fn cuMemAddressFree(ptr: u64, size: usize) {
        vmm()?.memory.write().address_free(ptr, size as u64)
    }
);

driver_fn!(
    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) {
        let e = vmm()?;
        let device = prop_device(prop)?;
        if handle.is_null() || flags != 0 {
            return Err(abi::INVALID_VALUE);
        }
        // SAFETY: in-parameter, read (and checked non-null) by `prop_device` just above.
        let shareable = match unsafe { get(prop)? }.requested_handle_types {
            abi::MEM_HANDLE_TYPE_NONE => false,
            abi::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR => true,
            // Win32 handles and fabric handles are not emulated.
            _ => return Err(abi::NOT_SUPPORTED),
        };
        let capacity = e.capacity[device as usize].load(Relaxed);
        let h = e.memory.write().create(device, size as u64, e.config.granularity, capacity, shareable)?;
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(handle, h) }
    }
);

driver_fn!(
    fn cuMemRelease(handle: u64) {
        vmm()?.memory.write().release(handle)
    }
);

driver_fn!(
    fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) {
        let e = vmm()?;
        if flags != 0 {
            return Err(abi::INVALID_VALUE);
        }
        e.memory.write().map(ptr, size as u64, offset as u64, handle, e.config.granularity)
    }
);

driver_fn!(
    fn cuMemUnmap(ptr: u64, size: usize) {
        let e = vmm()?;
        if !e.memory.read().unmappable(ptr, size as u64) {
            return Err(abi::INVALID_VALUE);
        }
        e.host_releases("cuMemUnmap", ptr, ptr + size as u64);
        e.memory.write().unmap(ptr, size as u64)
    }
);

driver_fn!(
    fn cuMemSetAccess(ptr: u64, size: usize, desc: *const MemAccessDesc, count: usize) {
        let e = vmm()?;
        if desc.is_null() || count == 0 {
            return Err(abi::INVALID_VALUE);
        }
        let mut flags = abi::MEM_ACCESS_FLAGS_PROT_NONE;
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors.
            let d = unsafe { get(desc.add(i))? };
            if d.location.type_ != abi::MEM_LOCATION_TYPE_DEVICE {
                return Err(abi::INVALID_VALUE);
            }
            e.device(d.location.id)?;
            // Host memory is one address space: the widest access any device is given applies.
            flags |= d.flags;
        }
        e.memory.write().set_access(ptr, size as u64, flags)
    }
);
