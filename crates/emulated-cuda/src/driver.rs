//! The driver functions the emulator implements, exported under their C names.
//!
//! Every pointer argument is trusted as the CUDA API requires of its callers (valid for its
//! C type), except that null out-parameters are refused with `CUDA_ERROR_INVALID_VALUE`;
//! handles and device addresses are all checked against the emulator's own records.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::abi::{self, attribute, pointer, CuResult, MemAccessDesc, MemAllocationProp};
use crate::calls;
use crate::emulator;
use crate::memory::Place;
use crate::streams::{Event, Stream, Work};

/// Exports `name` as a driver function: counted, fault-injectable, traced, panic-free.
macro_rules! driver_fn {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CuResult {
            calls::run(stringify!($name), || $body)
        }
    };
}

/// Writes an out-parameter.
///
/// # Safety
/// `ptr` is null (refused) or valid for a write of `T`, as the C API requires of callers.
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), CuResult> {
    if ptr.is_null() {
        return Err(abi::INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for a write of `T` by the caller's contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Reads an in-parameter struct.
///
/// # Safety
/// As for `put`, for a read.
unsafe fn get<T: Copy>(ptr: *const T) -> Result<T, CuResult> {
    if ptr.is_null() {
        return Err(abi::INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for a read of `T` by the caller's contract.
    Ok(unsafe { ptr.read_unaligned() })
}

// ---- initialisation, versions, errors ----

driver_fn!(fn cuInit(flags: c_uint) {
    if flags != 0 {
        return Err(abi::INVALID_VALUE);
    }
    let e = emulator();
    if e.contexts.is_empty() {
        return Err(abi::NO_DEVICE);
    }
    e.initialized.store(true, Relaxed);
    Ok(())
});

driver_fn!(fn cuDriverGetVersion(version: *mut c_int) {
    // SAFETY: out-parameter (see `put`).
    unsafe { put(version, emulator().config.driver_version) }
});

driver_fn!(fn cuGetErrorName(error: c_uint, text: *mut *const c_char) {
    let Some(name) = abi::code_name(error) else {
        // SAFETY: out-parameter; an unknown code gets null, as from the driver.
        unsafe { put(text, std::ptr::null())? };
        return Err(abi::INVALID_VALUE);
    };
    let static_name: &'static [u8] = crate::proc_address::leak_c_string(name);
    // SAFETY: out-parameter; the string is static and NUL-terminated.
    unsafe { put(text, static_name.as_ptr() as *const c_char) }
});

driver_fn!(fn cuGetErrorString(error: c_uint, text: *mut *const c_char) {
    let Some(string) = abi::code_string(error) else {
        // SAFETY: out-parameter; an unknown code gets null, as from the driver.
        unsafe { put(text, std::ptr::null())? };
        return Err(abi::INVALID_VALUE);
    };
    // SAFETY: out-parameter; the string is static and NUL-terminated.
    unsafe { put(text, string.as_ptr() as *const c_char) }
});

// ---- devices ----

driver_fn!(fn cuDeviceGetCount(count: *mut c_int) {
    let e = emulator();
    e.ready()?;
    // SAFETY: out-parameter.
    unsafe { put(count, e.contexts.len() as c_int) }
});

driver_fn!(fn cuDeviceGet(device: *mut c_int, ordinal: c_int) {
    let d = emulator().device(ordinal)?;
    // SAFETY: out-parameter.
    unsafe { put(device, d) }
});

driver_fn!(fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) {
    let d = emulator().device(device)?;
    if name.is_null() || len <= 0 {
        return Err(abi::INVALID_VALUE);
    }
    let text = format!("Emulated CUDA device {d} (vrampool test driver)");
    let n = text.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, name, n);
        name.add(n).write(0);
    }
    Ok(())
});

driver_fn!(fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) {
    let e = emulator();
    let d = e.device(device)?;
    // SAFETY: out-parameter.
    unsafe { put(bytes, e.capacity[d as usize].load(Relaxed) as usize) }
});

driver_fn!(fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, device: c_int) {
    let e = emulator();
    let d = e.device(device)?;
    let v = match attrib {
        attribute::MAX_THREADS_PER_BLOCK | attribute::MAX_BLOCK_DIM_X | attribute::MAX_BLOCK_DIM_Y => 1024,
        attribute::MAX_BLOCK_DIM_Z => 64,
        attribute::MAX_GRID_DIM_X => i32::MAX,
        attribute::MAX_GRID_DIM_Y | attribute::MAX_GRID_DIM_Z => 65535,
        attribute::MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        attribute::WARP_SIZE => 32,
        attribute::MULTIPROCESSOR_COUNT => 4,
        attribute::PCI_BUS_ID => d + 1,
        attribute::UNIFIED_ADDRESSING => 1,
        attribute::COMPUTE_CAPABILITY_MAJOR => 9,
        attribute::COMPUTE_CAPABILITY_MINOR => 0,
        attribute::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => i32::from(e.config.vmm),
        1..attribute::MAX => 0,
        _ => return Err(abi::INVALID_VALUE),
    };
    // SAFETY: out-parameter.
    unsafe { put(value, v) }
});

fn uuid(device: i32) -> [u8; 16] {
    let mut id = *b"emulated-cuda-\0\0";
    id[15] = device as u8;
    id
}

driver_fn!(fn cuDeviceGetUuid(out: *mut [u8; 16], device: c_int) {
    let d = emulator().device(device)?;
    // SAFETY: out-parameter (a `CUuuid`, 16 bytes).
    unsafe { put(out, uuid(d)) }
});

driver_fn!(fn cuDeviceGetUuid_v2(out: *mut [u8; 16], device: c_int) {
    let d = emulator().device(device)?;
    // SAFETY: out-parameter (a `CUuuid`, 16 bytes).
    unsafe { put(out, uuid(d)) }
});

driver_fn!(fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, device: c_int) {
    emulator().device(device)?;
    // SAFETY: out-parameters.
    unsafe {
        put(major, 9)?;
        put(minor, 0)
    }
});

driver_fn!(fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int) {
    let d = emulator().device(device)?;
    let text = format!("0000:{:02x}:00.0\0", d + 1);
    if bus_id.is_null() || (len as usize) < text.len() {
        return Err(abi::INVALID_VALUE);
    }
    // SAFETY: the caller's buffer holds `len >= text.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, bus_id, text.len()) };
    Ok(())
});

driver_fn!(fn cuDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) {
    let e = emulator();
    e.device(device)?;
    e.device(peer)?;
    // SAFETY: out-parameter. Host memory is one address space: every device reaches every other.
    unsafe { put(can, i32::from(device != peer)) }
});

// ---- primary contexts ----

driver_fn!(fn cuDevicePrimaryCtxRetain(ctx: *mut u64, device: c_int) {
    let e = emulator();
    let d = e.device(device)?;
    // SAFETY: out-parameter.
    unsafe { put(ctx, e.context_handle(d))? };
    e.contexts[d as usize].retains.fetch_add(1, Relaxed);
    Ok(())
});

fn primary_release(device: c_int) -> Result<(), CuResult> {
    let e = emulator();
    let d = e.device(device)?;
    let retains = &e.contexts[d as usize].retains;
    retains.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).map(|_| ()).map_err(|_| abi::INVALID_CONTEXT)
}

driver_fn!(fn cuDevicePrimaryCtxRelease_v2(device: c_int) { primary_release(device) });
driver_fn!(fn cuDevicePrimaryCtxRelease(device: c_int) { primary_release(device) });

driver_fn!(fn cuDevicePrimaryCtxGetState(device: c_int, flags: *mut c_uint, active: *mut c_int) {
    let e = emulator();
    let ctx = &e.contexts[e.device(device)? as usize];
    // SAFETY: out-parameters.
    unsafe {
        put(flags, ctx.flags.load(Relaxed))?;
        put(active, i32::from(ctx.retains.load(Relaxed) > 0))
    }
});

driver_fn!(fn cuDevicePrimaryCtxSetFlags_v2(device: c_int, flags: c_uint) {
    let e = emulator();
    e.contexts[e.device(device)? as usize].flags.store(flags, Relaxed);
    Ok(())
});

driver_fn!(fn cuDevicePrimaryCtxReset_v2(device: c_int) {
    // Memory made in the context stays: a test driver keeps what a reset would destroy.
    emulator().device(device).map(|_| ())
});

// ---- current context ----

driver_fn!(fn cuCtxGetCurrent(ctx: *mut u64) {
    let e = emulator();
    e.ready()?;
    let handle = e.current().map(|c| e.context_handle(c.device)).unwrap_or(0);
    // SAFETY: out-parameter.
    unsafe { put(ctx, handle) }
});

driver_fn!(fn cuCtxSetCurrent(ctx: u64) {
    let e = emulator();
    e.ready()?;
    let device = if ctx == 0 { None } else { Some(e.context_of(ctx)?) };
    e.set_current(device);
    Ok(())
});

driver_fn!(fn cuCtxPushCurrent_v2(ctx: u64) {
    let e = emulator();
    e.ready()?;
    let device = e.context_of(ctx)?;
    crate::CURRENT.with(|c| c.borrow_mut().push(device));
    Ok(())
});

driver_fn!(fn cuCtxPopCurrent_v2(ctx: *mut u64) {
    let e = emulator();
    e.ready()?;
    let device = crate::CURRENT.with(|c| c.borrow_mut().pop()).ok_or(abi::INVALID_CONTEXT)?;
    if !ctx.is_null() {
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(ctx, e.context_handle(device))? };
    }
    Ok(())
});

driver_fn!(fn cuCtxGetDevice(device: *mut c_int) {
    let d = emulator().current()?.device;
    // SAFETY: out-parameter.
    unsafe { put(device, d) }
});

driver_fn!(fn cuCtxGetApiVersion(ctx: u64, version: *mut c_uint) {
    let e = emulator();
    if ctx != 0 {
        e.context_of(ctx)?;
    } else {
        e.current()?;
    }
    // SAFETY: out-parameter.
    unsafe { put(version, 3020) }
});

driver_fn!(fn cuCtxGetFlags(flags: *mut c_uint) {
    let f = emulator().current()?.flags.load(Relaxed);
    // SAFETY: out-parameter.
    unsafe { put(flags, f) }
});

driver_fn!(fn cuCtxGetId(ctx: u64, id: *mut u64) {
    let e = emulator();
    let device = if ctx == 0 { e.current()?.device } else { e.context_of(ctx)? };
    // SAFETY: out-parameter.
    unsafe { put(id, device as u64 + 1) }
});

driver_fn!(fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
    emulator().current()?;
    // SAFETY: out-parameters (either may be null, as the API allows).
    unsafe {
        if !least.is_null() {
            put(least, 0)?;
        }
        if !greatest.is_null() {
            put(greatest, 0)?;
        }
    }
    Ok(())
});

driver_fn!(fn cuCtxSynchronize() {
    let e = emulator();
    let ctx = e.current()?;
    for stream in ctx.all_streams() {
        e.host_waits(&stream)?;
    }
    ctx.sticky_error()
});

// ---- memory ----

driver_fn!(fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) {
    let e = emulator();
    let device = e.current()?.device;
    if dptr.is_null() {
        return Err(abi::INVALID_VALUE);
    }
    let capacity = e.capacity[device as usize].load(Relaxed);
    let base = e.memory.write().alloc(device, bytes as u64, e.config.granularity, capacity)?;
    // SAFETY: out-parameter, checked non-null.
    unsafe { put(dptr, base) }
});

driver_fn!(fn cuMemFree_v2(dptr: u64) {
    let e = emulator();
    e.current()?;
    let (base, size) = e.memory.read().linear_at(dptr).ok_or(abi::INVALID_VALUE)?;
    e.host_releases("cuMemFree", base, base + size);
    e.memory.write().free(dptr)
});

driver_fn!(fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
    let e = emulator();
    let device = e.current()?.device;
    let capacity = e.capacity[device as usize].load(Relaxed);
    let used = e.memory.read().used(device);
    // SAFETY: out-parameters.
    unsafe {
        put(free, capacity.saturating_sub(used) as usize)?;
        put(total, capacity as usize)
    }
});

driver_fn!(fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, dptr: u64) {
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
});

driver_fn!(fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
    let e = emulator();
    e.current()?;
    let base = e.memory.write().alloc_host(bytes)?;
    // SAFETY: out-parameter.
    unsafe { put(pp, base as *mut c_void) }
});

driver_fn!(fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) {
    let e = emulator();
    e.current()?;
    let base = e.memory.write().alloc_host(bytes)?;
    // SAFETY: out-parameter.
    unsafe { put(pp, base as *mut c_void) }
});

driver_fn!(fn cuMemFreeHost(p: *mut c_void) {
    let e = emulator();
    e.current()?;
    e.memory.write().free_host(p as u64)
});

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

driver_fn!(fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) { copy(0, dst, src as u64, len, true) });
driver_fn!(fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, len: usize) { copy(0, dst as u64, src, len, true) });
driver_fn!(fn cuMemcpyDtoD_v2(dst: u64, src: u64, len: usize) { copy(0, dst, src, len, true) });
driver_fn!(fn cuMemcpy(dst: u64, src: u64, len: usize) { copy(0, dst, src, len, true) });
driver_fn!(fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, len: usize, stream: u64) { copy(stream, dst, src as u64, len, false) });
driver_fn!(fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, len: usize, stream: u64) { copy(stream, dst as u64, src, len, false) });
driver_fn!(fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, stream: u64) { copy(stream, dst, src, len, false) });
driver_fn!(fn cuMemcpyAsync(dst: u64, src: u64, len: usize, stream: u64) { copy(stream, dst, src, len, false) });

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

driver_fn!(fn cuMemsetD8_v2(dst: u64, value: u8, count: usize) { memset(0, dst, value as u32, 1, count, true) });
driver_fn!(fn cuMemsetD16_v2(dst: u64, value: u16, count: usize) { memset(0, dst, value as u32, 2, count, true) });
driver_fn!(fn cuMemsetD32_v2(dst: u64, value: u32, count: usize) { memset(0, dst, value, 4, count, true) });
driver_fn!(fn cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: u64) { memset(stream, dst, value as u32, 1, count, false) });
driver_fn!(fn cuMemsetD16Async(dst: u64, value: u16, count: usize, stream: u64) { memset(stream, dst, value as u32, 2, count, false) });
driver_fn!(fn cuMemsetD32Async(dst: u64, value: u32, count: usize, stream: u64) { memset(stream, dst, value, 4, count, false) });

// ---- virtual memory ----

fn vmm() -> Result<&'static crate::Emulator, CuResult> {
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

driver_fn!(fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const MemAllocationProp, option: c_int) {
    let e = vmm()?;
    prop_device(prop)?;
    if !(0..=1).contains(&option) {
        return Err(abi::INVALID_VALUE);
    }
    // SAFETY: out-parameter.
    unsafe { put(granularity, e.config.granularity as usize) }
});

driver_fn!(fn cuMemAddressReserve(ptr: *mut u64, size: usize, alignment: usize, _addr: u64, flags: u64) {
    let e = vmm()?;
    if ptr.is_null() || flags != 0 {
        return Err(abi::INVALID_VALUE);
    }
    let base = e.memory.write().reserve(size as u64, alignment as u64, e.config.granularity)?;
    // SAFETY: out-parameter, checked non-null.
    unsafe { put(ptr, base) }
});

driver_fn!(fn cuMemAddressFree(ptr: u64, size: usize) {
    vmm()?.memory.write().address_free(ptr, size as u64)
});

driver_fn!(fn cuMemCreate(handle: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) {
    let e = vmm()?;
    let device = prop_device(prop)?;
    if handle.is_null() || flags != 0 {
        return Err(abi::INVALID_VALUE);
    }
    let capacity = e.capacity[device as usize].load(Relaxed);
    let h = e.memory.write().create(device, size as u64, e.config.granularity, capacity)?;
    // SAFETY: out-parameter, checked non-null.
    unsafe { put(handle, h) }
});

driver_fn!(fn cuMemRelease(handle: u64) {
    vmm()?.memory.write().release(handle)
});

driver_fn!(fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) {
    let e = vmm()?;
    if flags != 0 {
        return Err(abi::INVALID_VALUE);
    }
    e.memory.write().map(ptr, size as u64, offset as u64, handle, e.config.granularity)
});

driver_fn!(fn cuMemUnmap(ptr: u64, size: usize) {
    let e = vmm()?;
    if !e.memory.read().unmappable(ptr, size as u64) {
        return Err(abi::INVALID_VALUE);
    }
    e.host_releases("cuMemUnmap", ptr, ptr + size as u64);
    e.memory.write().unmap(ptr, size as u64)
});

driver_fn!(fn cuMemSetAccess(ptr: u64, size: usize, desc: *const MemAccessDesc, count: usize) {
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
});

// ---- streams ----

fn stream_create(out: *mut u64, flags: c_uint) -> Result<(), CuResult> {
    let e = emulator();
    let ctx = e.current()?;
    if out.is_null() || flags & !abi::STREAM_NON_BLOCKING != 0 {
        return Err(abi::INVALID_VALUE);
    }
    let stream = Stream::new(ctx.device, flags, false, |id| format!("stream {id:#x}"));
    e.streams.lock().insert(stream.id, Arc::clone(&stream));
    ctx.streams.lock().push(Arc::clone(&stream));
    // SAFETY: out-parameter, checked non-null.
    unsafe { put(out, stream.id) }
}

driver_fn!(fn cuStreamCreate(out: *mut u64, flags: c_uint) { stream_create(out, flags) });
driver_fn!(fn cuStreamCreateWithPriority(out: *mut u64, flags: c_uint, _priority: c_int) { stream_create(out, flags) });

driver_fn!(fn cuStreamDestroy_v2(handle: u64) {
    let e = emulator();
    e.ready()?;
    let stream = e.streams.lock().remove(&handle).ok_or(abi::INVALID_HANDLE)?;
    e.contexts[stream.device as usize].streams.lock().retain(|s| !Arc::ptr_eq(s, &stream));
    // Queued work still runs; the worker ends after it, as the driver lets it.
    stream.destroy();
    Ok(())
});

driver_fn!(fn cuStreamSynchronize(handle: u64) {
    let e = emulator();
    let stream = e.stream(handle)?;
    if stream.legacy {
        // The legacy stream's work waits for every blocking stream: so does a sync of it.
        let ctx = &e.contexts[stream.device as usize];
        for s in ctx.all_streams().iter().filter(|s| s.blocking) {
            e.host_waits(s)?;
        }
    }
    e.host_waits(&stream)
});

driver_fn!(fn cuStreamQuery(handle: u64) {
    let e = emulator();
    let stream = e.stream(handle)?;
    e.contexts[stream.device as usize].sticky_error()?;
    if stream.is_idle() {
        e.races.host_learns(&stream.snapshot().1);
        Ok(())
    } else {
        Err(abi::NOT_READY)
    }
});

driver_fn!(fn cuStreamWaitEvent(handle: u64, event: u64, _flags: c_uint) {
    let e = emulator();
    let stream = e.stream(handle)?;
    let event = e.event(event)?;
    if let Some(r) = event.recorded() {
        crate::streams::enqueue(&stream, vec![(r.stream, r.upto, r.clock)], None, &[]);
    }
    Ok(())
});

driver_fn!(fn cuStreamGetFlags(handle: u64, flags: *mut c_uint) {
    let stream = emulator().stream(handle)?;
    // SAFETY: out-parameter.
    unsafe { put(flags, stream.flags) }
});

driver_fn!(fn cuStreamGetPriority(handle: u64, priority: *mut c_int) {
    emulator().stream(handle)?;
    // SAFETY: out-parameter.
    unsafe { put(priority, 0) }
});

driver_fn!(fn cuStreamGetCtx(handle: u64, ctx: *mut u64) {
    let e = emulator();
    let stream = e.stream(handle)?;
    // SAFETY: out-parameter.
    unsafe { put(ctx, e.context_handle(stream.device)) }
});

driver_fn!(fn cuStreamGetId(handle: u64, id: *mut u64) {
    let stream = emulator().stream(handle)?;
    // SAFETY: out-parameter.
    unsafe { put(id, stream.id) }
});

driver_fn!(fn cuStreamGetDevice(handle: u64, device: *mut c_int) {
    let stream = emulator().stream(handle)?;
    // SAFETY: out-parameter.
    unsafe { put(device, stream.device) }
});

// ---- events ----

driver_fn!(fn cuEventCreate(out: *mut u64, _flags: c_uint) {
    let e = emulator();
    e.current()?;
    if out.is_null() {
        return Err(abi::INVALID_VALUE);
    }
    let id = e.next_event.fetch_add(0x10, Relaxed);
    e.events.lock().insert(id, Arc::new(Event::default()));
    // SAFETY: out-parameter, checked non-null.
    unsafe { put(out, id) }
});

fn event_record(event: u64, stream: u64) -> Result<(), CuResult> {
    let e = emulator();
    let event = e.event(event)?;
    let stream = e.stream(stream)?;
    event.record(&stream);
    Ok(())
}

driver_fn!(fn cuEventRecord(event: u64, stream: u64) { event_record(event, stream) });
driver_fn!(fn cuEventRecordWithFlags(event: u64, stream: u64, _flags: c_uint) { event_record(event, stream) });

driver_fn!(fn cuEventQuery(event: u64) {
    let e = emulator();
    let Some(r) = e.event(event)?.recorded() else { return Ok(()) };
    e.contexts[r.stream.device as usize].sticky_error()?;
    if r.stream.done_upto(r.upto) {
        e.races.host_learns(&r.clock);
        Ok(())
    } else {
        Err(abi::NOT_READY)
    }
});

driver_fn!(fn cuEventSynchronize(event: u64) {
    let e = emulator();
    let Some(r) = e.event(event)?.recorded() else { return Ok(()) };
    r.stream.wait_for(r.upto);
    e.races.host_learns(&r.clock);
    e.contexts[r.stream.device as usize].sticky_error()
});

driver_fn!(fn cuEventDestroy_v2(event: u64) {
    let e = emulator();
    e.ready()?;
    e.events.lock().remove(&event).map(|_| ()).ok_or(abi::INVALID_HANDLE)
});

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

driver_fn!(fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, ptr: u64) {
    // SAFETY: as the C API requires, `data` holds the attribute's type.
    unsafe { pointer_attribute(data, attr, ptr) }
});

driver_fn!(fn cuPointerGetAttributes(count: c_uint, attrs: *const c_int, data: *const *mut c_void, ptr: u64) {
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
                    pointer::CONTEXT | pointer::DEVICE_POINTER | pointer::HOST_POINTER | pointer::RANGE_START_ADDR | pointer::RANGE_SIZE => put(slot as *mut u64, 0)?,
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
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Device 0's primary context, current on this thread.
    fn context() {
        // SAFETY (all calls here): out-parameters point to live locals.
        unsafe {
            assert_eq!(cuInit(0), abi::SUCCESS);
            let mut ctx = 0u64;
            assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), abi::SUCCESS);
            assert_eq!(cuCtxSetCurrent(ctx), abi::SUCCESS);
        }
    }

    #[test]
    fn memsets_of_every_width_and_pointer_attributes() {
        context();
        // SAFETY (all calls here): out-parameters and buffers are live locals of the right size.
        unsafe {
            let mut dptr = 0u64;
            assert_eq!(cuMemAlloc_v2(&mut dptr, 64), abi::SUCCESS);
            assert_eq!(cuMemsetD8_v2(dptr, 0x11, 64), abi::SUCCESS);
            assert_eq!(cuMemsetD16_v2(dptr + 8, 0x2233, 4), abi::SUCCESS);
            assert_eq!(cuMemsetD32_v2(dptr + 16, 0x4455_6677, 4), abi::SUCCESS);
            assert_eq!(cuMemsetD32_v2(dptr + 1, 0, 1), abi::INVALID_VALUE, "misaligned");
            let mut back = [0u8; 64];
            assert_eq!(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, dptr, 64), abi::SUCCESS);
            assert_eq!(&back[..8], &[0x11; 8]);
            assert_eq!(&back[8..16], &[0x33, 0x22, 0x33, 0x22, 0x33, 0x22, 0x33, 0x22]);
            assert_eq!(&back[16..20], &[0x77, 0x66, 0x55, 0x44]);
            assert_eq!(&back[32..], &[0x11; 32]);
            let (mut ordinal, mut start, mut size) = (-1i32, 0u64, 0usize);
            assert_eq!(cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut c_void, pointer::DEVICE_ORDINAL, dptr + 5), abi::SUCCESS);
            assert_eq!(cuPointerGetAttribute(&mut start as *mut u64 as *mut c_void, pointer::RANGE_START_ADDR, dptr + 5), abi::SUCCESS);
            assert_eq!(cuPointerGetAttribute(&mut size as *mut usize as *mut c_void, pointer::RANGE_SIZE, dptr + 5), abi::SUCCESS);
            assert_eq!((ordinal, start, size), (0, dptr, 64));
            let host = 0u8;
            assert_eq!(cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut c_void, pointer::DEVICE_ORDINAL, &host as *const u8 as u64), abi::INVALID_VALUE);
            assert_eq!(cuMemFree_v2(dptr), abi::SUCCESS);
            assert_eq!(cuMemFree_v2(dptr), abi::INVALID_VALUE, "double free");
        }
    }

    #[test]
    fn error_names_and_strings() {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: a live out-parameter; the strings handed out are static and NUL-terminated.
        unsafe {
            assert_eq!(cuGetErrorName(abi::NOT_SUPPORTED, &mut text), abi::SUCCESS);
            assert_eq!(std::ffi::CStr::from_ptr(text).to_str(), Ok("CUDA_ERROR_NOT_SUPPORTED"));
            assert_eq!(cuGetErrorString(abi::NOT_SUPPORTED, &mut text), abi::SUCCESS);
            assert_eq!(std::ffi::CStr::from_ptr(text).to_str(), Ok("operation not supported"));
            assert_eq!(cuGetErrorString(12345, &mut text), abi::INVALID_VALUE);
            assert!(text.is_null());
        }
    }
}
