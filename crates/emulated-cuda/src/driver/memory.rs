//! Device and host allocations, copies and memsets, pointer attributes.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;

use super::put;
use crate::abi::{self, pointer, CuResult};
use crate::emulator;
use crate::memory::Place;
use crate::streams::Work;

// ---- memory ----

driver_fn!(
    fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) {
        let e = emulator();
        let device = e.current()?.device;
        if dptr.is_null() {
            return Err(abi::INVALID_VALUE);
        }
        let capacity = e.capacity[device as usize].load(Relaxed);
        let base = e.memory.write().alloc(device, bytes as u64, e.config.granularity, capacity)?;
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(dptr, base) }
    }
);

driver_fn!(
    fn cuMemFree_v2(dptr: u64) {
        let e = emulator();
        e.current()?;
        let (base, size) = e.memory.read().linear_at(dptr).ok_or(abi::INVALID_VALUE)?;
        e.host_releases("cuMemFree", base, base + size);
        e.memory.write().free(dptr)
    }
);

driver_fn!(
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let e = emulator();
        let device = e.current()?.device;
        let capacity = e.capacity[device as usize].load(Relaxed);
        let used = e.memory.read().used(device);
        // SAFETY: out-parameters.
        unsafe {
            put(free, capacity.saturating_sub(used) as usize)?;
            put(total, capacity as usize)
        }
    }
);

driver_fn!(
    fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, dptr: u64) {
        let e = emulator();
        e.current()?;
        let Place::Device { base: b, size: s, .. } = e.memory.read().place(dptr) else { return Err(abi::NOT_FOUND) };
        // SAFETY: out-parameters; either may be null, as the API allows.
        unsafe {
            if !base.is_null() {
                put(base, b)?;
            }
            if !size.is_null() {
                put(size, s as usize)?;
            }
        }
        Ok(())
    }
);

driver_fn!(
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        let e = emulator();
        e.current()?;
        let base = e.memory.write().alloc_host(bytes)?;
        // SAFETY: out-parameter.
        unsafe { put(pp, base as *mut c_void) }
    }
);

driver_fn!(
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) {
        let e = emulator();
        e.current()?;
        let base = e.memory.write().alloc_host(bytes)?;
        // SAFETY: out-parameter.
        unsafe { put(pp, base as *mut c_void) }
    }
);

driver_fn!(
    fn cuMemFreeHost(p: *mut c_void) {
        let e = emulator();
        e.current()?;
        e.memory.write().free_host(p as u64)
    }
);

// ---- copies and memsets ----

/// Queues a copy on `stream`; `sync`: the host then waits for it. As with the driver, an
/// asynchronous copy is synchronous where it involves pageable host memory (anything but
/// `cuMemAllocHost`'s): from it, the bytes are staged before the call returns; into it, the
/// call returns once the copy is done.
fn copy(stream: u64, dst: u64, src: u64, len: usize, sync: bool) -> Result<(), CuResult> {
    let e = emulator();
    e.current()?;
    let len = len as u64;
    if len == 0 {
        return Ok(());
    }
    e.check_device_range(dst, len, true, true)?;
    e.check_device_range(src, len, false, true)?;
    let stream = e.stream(if sync { abi::STREAM_LEGACY } else { stream })?;
    let accesses = e.device_accesses(&[(dst, len, true), (src, len, false)]);
    if accesses.is_empty() {
        return Err(abi::INVALID_VALUE); // host to host: not a device copy
    }
    let (src_pageable, dst_pageable) = {
        let memory = e.memory.read();
        let pageable = |addr: u64| matches!(memory.place(addr), Place::Host) && !memory.is_pinned(addr, len);
        (pageable(src), pageable(dst))
    };
    let work = if src_pageable {
        // SAFETY: the caller passes `len` readable bytes at `src` (a host buffer), read now.
        let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, len as usize) }.to_vec();
        Work::CopyStaged { dst, bytes }
    } else {
        Work::Copy { dst, src, len }
    };
    e.queue(&stream, work, &accesses);
    if sync || dst_pageable {
        e.host_waits(&stream)?;
    }
    Ok(())
}

driver_fn!(
    fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) {
        copy(0, dst, src as u64, len, true)
    }
);
driver_fn!(
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, len: usize) {
        copy(0, dst as u64, src, len, true)
    }
);
driver_fn!(
    fn cuMemcpyDtoD_v2(dst: u64, src: u64, len: usize) {
        copy(0, dst, src, len, true)
    }
);
driver_fn!(
    fn cuMemcpy(dst: u64, src: u64, len: usize) {
        copy(0, dst, src, len, true)
    }
);
driver_fn!(
    fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, len: usize, stream: u64) {
        copy(stream, dst, src as u64, len, false)
    }
);
driver_fn!(
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, len: usize, stream: u64) {
        copy(stream, dst as u64, src, len, false)
    }
);
driver_fn!(
    fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, stream: u64) {
        copy(stream, dst, src, len, false)
    }
);
driver_fn!(
    fn cuMemcpyAsync(dst: u64, src: u64, len: usize, stream: u64) {
        copy(stream, dst, src, len, false)
    }
);

fn memset(stream: u64, dst: u64, value: u32, width: u8, count: usize, sync: bool) -> Result<(), CuResult> {
    let e = emulator();
    e.current()?;
    let len = (count as u64).checked_mul(width as u64).ok_or(abi::INVALID_VALUE)?;
    if len == 0 {
        return Ok(());
    }
    if dst % width as u64 != 0 {
        return Err(abi::INVALID_VALUE);
    }
    e.check_device_range(dst, len, true, false)?;
    let stream = e.stream(if sync { abi::STREAM_LEGACY } else { stream })?;
    let accesses = e.device_accesses(&[(dst, len, true)]);
    e.queue(&stream, Work::Fill { dst, count: count as u64, value, width }, &accesses);
    if sync {
        e.host_waits(&stream)?;
    }
    Ok(())
}

driver_fn!(
    fn cuMemsetD8_v2(dst: u64, value: u8, count: usize) {
        memset(0, dst, value as u32, 1, count, true)
    }
);
driver_fn!(
    fn cuMemsetD16_v2(dst: u64, value: u16, count: usize) {
        memset(0, dst, value as u32, 2, count, true)
    }
);
driver_fn!(
    fn cuMemsetD32_v2(dst: u64, value: u32, count: usize) {
        memset(0, dst, value, 4, count, true)
    }
);
driver_fn!(
    fn cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: u64) {
        memset(stream, dst, value as u32, 1, count, false)
    }
);
driver_fn!(
    fn cuMemsetD16Async(dst: u64, value: u16, count: usize, stream: u64) {
        memset(stream, dst, value as u32, 2, count, false)
    }
);
driver_fn!(
    fn cuMemsetD32Async(dst: u64, value: u32, count: usize, stream: u64) {
        memset(stream, dst, value, 4, count, false)
    }
);

// ---- pointers ----

/// Writes one pointer attribute of `ptr` into `data`.
///
/// # Safety
/// `data` is valid for a write of the attribute's C type.
unsafe fn pointer_attribute(data: *mut c_void, attr: c_int, ptr: u64) -> Result<(), CuResult> {
    let e = emulator();
    e.ready()?;
    let (device, base, size) = match e.memory.read().place(ptr) {
        Place::Device { device, base, size } => (device, base, size),
        _ => return Err(abi::INVALID_VALUE),
    };
    // SAFETY (each arm): `data` holds the attribute's C type, as the caller guarantees.
    unsafe {
        match attr {
            pointer::CONTEXT => put(data as *mut u64, e.context_handle(device)),
            pointer::MEMORY_TYPE => put(data as *mut c_uint, pointer::MEMORY_TYPE_DEVICE),
            pointer::DEVICE_POINTER => put(data as *mut u64, ptr),
            pointer::HOST_POINTER => put(data as *mut u64, 0),
            pointer::DEVICE_ORDINAL => put(data as *mut c_int, device),
            pointer::RANGE_START_ADDR => put(data as *mut u64, base),
            pointer::RANGE_SIZE => put(data as *mut usize, size as usize),
            pointer::MAPPED => put(data as *mut u8, 1),
            pointer::IS_MANAGED => put(data as *mut u8, 0),
            _ => Err(abi::NOT_SUPPORTED),
        }
    }
}

driver_fn!(
    fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, ptr: u64) {
        // SAFETY: as the C API requires, `data` holds the attribute's type.
        unsafe { pointer_attribute(data, attr, ptr) }
    }
);

driver_fn!(
    fn cuPointerGetAttributes(count: c_uint, attrs: *const c_int, data: *const *mut c_void, ptr: u64) {
        if attrs.is_null() || data.is_null() {
            return Err(abi::INVALID_VALUE);
        }
        let host = !matches!(emulator().memory.read().place(ptr), Place::Device { .. });
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` attributes and `count` data pointers.
            let (attr, slot) = unsafe { (attrs.add(i).read(), data.add(i).read()) };
            if host {
                // Memory the driver does not know: what the driver reports for it.
                // SAFETY: `slot` holds the attribute's type; zero is "none" for every one we write.
                unsafe {
                    match attr {
                        pointer::MEMORY_TYPE => put(slot as *mut c_uint, 0)?,
                        // CU_DEVICE_INVALID
                        pointer::DEVICE_ORDINAL => put(slot as *mut c_int, -2)?,
                        pointer::CONTEXT
                        | pointer::DEVICE_POINTER
                        | pointer::HOST_POINTER
                        | pointer::RANGE_START_ADDR
                        | pointer::RANGE_SIZE => put(slot as *mut u64, 0)?,
                        pointer::MAPPED | pointer::IS_MANAGED => put(slot as *mut u8, 0)?,
                        _ => {}
                    }
                }
                continue;
            }
            // SAFETY: as above.
            match unsafe { pointer_attribute(slot, attr, ptr) } {
                Ok(()) | Err(abi::NOT_SUPPORTED) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }
);
