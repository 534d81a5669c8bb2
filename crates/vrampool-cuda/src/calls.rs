//! One small wrapper per driver call, each holding exactly one `unsafe` block.
//!
//! Every wrapper requires that `driver::load` succeeded (so the symbol exists and cudarc cannot
//! panic looking it up) and, for the calls that act on a context, that the device's context is
//! current on the calling thread (`CurrentContext::enter`). `CudaDevice` guarantees both: it
//! exists only after a successful load, and it enters its context at the top of every method.
//! Wrappers that take handles or device addresses the driver cannot fully check are `unsafe fn`
//! and say what the caller must guarantee.

use std::ffi::{c_char, c_void};
use std::ptr::null_mut;

use cudarc::driver::sys;
use vrampool_core::device::DeviceResult;

use crate::driver::{check, handle, ptr, query_result};

pub(crate) fn init() -> DeviceResult<()> {
    // SAFETY: takes no pointers; flags must be 0.
    check(unsafe { sys::cuInit(0) }, "cuInit")
}

pub(crate) fn driver_version() -> DeviceResult<i32> {
    let mut version = 0;
    // SAFETY: writes one int into `version`; valid before `cuInit`.
    check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
    Ok(version)
}

pub(crate) fn device_count() -> DeviceResult<i32> {
    let mut count = 0;
    // SAFETY: writes one int into `count`.
    check(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
    Ok(count)
}

pub(crate) fn device_get(ordinal: i32) -> DeviceResult<sys::CUdevice> {
    let mut device = 0;
    // SAFETY: writes one device handle into `device`; a bad ordinal is an error code, not UB.
    check(unsafe { sys::cuDeviceGet(&mut device, ordinal) }, "cuDeviceGet")?;
    Ok(device)
}

pub(crate) fn device_attribute(device: sys::CUdevice, attribute: sys::CUdevice_attribute) -> DeviceResult<i32> {
    let mut value = 0;
    // SAFETY: writes one int into `value`; `device` came from `cuDeviceGet`.
    check(unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) }, "cuDeviceGetAttribute")?;
    Ok(value)
}

pub(crate) fn device_name(device: sys::CUdevice) -> DeviceResult<String> {
    let mut name = [0 as c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL included, into the buffer.
    check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device) }, "cuDeviceGetName")?;
    let bytes: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

pub(crate) fn device_total_mem(device: sys::CUdevice) -> DeviceResult<u64> {
    let mut bytes = 0usize;
    // SAFETY: writes one size into `bytes`.
    check(unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, device) }, "cuDeviceTotalMem")?;
    Ok(bytes as u64)
}

/// Retains the device's primary context (the one the runtime API, PyTorch and CuPy use), so
/// pointers from this crate are valid in theirs.
pub(crate) fn primary_ctx_retain(device: sys::CUdevice) -> DeviceResult<u64> {
    let mut context: sys::CUcontext = null_mut();
    // SAFETY: writes one context handle into `context`.
    check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) }, "cuDevicePrimaryCtxRetain")?;
    Ok(handle(context))
}

/// # Safety
/// Balances exactly one successful `primary_ctx_retain` of the same device.
pub(crate) unsafe fn primary_ctx_release(device: sys::CUdevice) -> DeviceResult<()> {
    // SAFETY: the caller pairs it with its retain; the driver destroys the context at zero.
    check(unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) }, "cuDevicePrimaryCtxRelease")
}

pub(crate) fn ctx_synchronize() -> DeviceResult<()> {
    // SAFETY: waits for the current context's work; takes no pointers.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

pub(crate) fn mem_alloc(bytes: usize) -> DeviceResult<u64> {
    let mut address: sys::CUdeviceptr = 0;
    // SAFETY: writes one device address into `address`.
    check(unsafe { sys::cuMemAlloc_v2(&mut address, bytes) }, "cuMemAlloc")?;
    Ok(address)
}

/// # Safety
/// `address` came from `mem_alloc` and no work still queued or running uses it.
pub(crate) unsafe fn mem_free(address: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees; an address the driver does not know is an error code.
    check(unsafe { sys::cuMemFree_v2(address) }, "cuMemFree")
}

pub(crate) fn mem_get_info() -> DeviceResult<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes.
    check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "cuMemGetInfo")?;
    Ok((free as u64, total as u64))
}

/// # Safety
/// `[address, address + bytes)` is device memory the caller owns, and `stream` is 0, 1, 2 or a
/// live stream of the current context.
pub(crate) unsafe fn memset_zero_async(address: u64, bytes: usize, stream: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuMemsetD8Async(address, 0, bytes, ptr(stream)) }, "cuMemsetD8Async")
}

/// # Safety
/// `[address, address + source.len())` is device memory the caller owns.
pub(crate) unsafe fn copy_to_device(address: u64, source: &[u8]) -> DeviceResult<()> {
    // SAFETY: reads `source.len()` bytes of a live slice; the device range is the caller's.
    check(unsafe { sys::cuMemcpyHtoD_v2(address, source.as_ptr() as *const c_void, source.len()) }, "cuMemcpyHtoD")
}

/// # Safety
/// `[address, address + target.len())` is device memory the caller owns.
pub(crate) unsafe fn copy_to_host(target: &mut [u8], address: u64) -> DeviceResult<()> {
    // SAFETY: writes `target.len()` bytes into a live, exclusively borrowed slice; the call
    // returns only once the copy is done, so the slice is not written after the borrow ends.
    check(unsafe { sys::cuMemcpyDtoH_v2(target.as_mut_ptr() as *mut c_void, address, target.len()) }, "cuMemcpyDtoH")
}

/// `bytes` of page-locked host memory in the current context.
pub(crate) fn mem_host_alloc(bytes: usize) -> DeviceResult<*mut u8> {
    let mut host: *mut c_void = null_mut();
    // SAFETY: writes one pointer into `host`; flags 0 (page-locked, this context's).
    check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, 0) }, "cuMemHostAlloc")?;
    Ok(host.cast())
}

/// # Safety
/// `host` came from `mem_host_alloc` and is freed once.
pub(crate) unsafe fn mem_free_host(host: *mut u8) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuMemFreeHost(host.cast()) }, "cuMemFreeHost")
}

pub(crate) fn event_create() -> DeviceResult<u64> {
    let mut event: sys::CUevent = null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: writes one event handle into `event`. Timing off: these events only order work.
    check(unsafe { sys::cuEventCreate(&mut event, flags) }, "cuEventCreate")?;
    Ok(handle(event))
}

/// # Safety
/// `event` is a live event of the current context; `stream` is 0, 1, 2 or a live stream of it.
pub(crate) unsafe fn event_record(event: u64, stream: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuEventRecord(ptr(event), ptr(stream)) }, "cuEventRecord")
}

/// # Safety
/// `event` is a live event.
pub(crate) unsafe fn event_query(event: u64) -> DeviceResult<bool> {
    // SAFETY: as the caller guarantees.
    query_result(unsafe { sys::cuEventQuery(ptr(event)) })
}

/// # Safety
/// `event` is a live event.
pub(crate) unsafe fn event_synchronize(event: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuEventSynchronize(ptr(event)) }, "cuEventSynchronize")
}

/// # Safety
/// `event` is a live event that nobody uses afterwards.
pub(crate) unsafe fn event_destroy(event: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees (pending work that records it is fine for the driver).
    check(unsafe { sys::cuEventDestroy_v2(ptr(event)) }, "cuEventDestroy")
}

/// # Safety
/// `event` is a live event; `stream` is 0, 1, 2 or a live stream of the current context.
pub(crate) unsafe fn stream_wait_event(stream: u64, event: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees; flags must be 0.
    check(unsafe { sys::cuStreamWaitEvent(ptr(stream), ptr(event), 0) }, "cuStreamWaitEvent")
}

pub(crate) fn stream_create_non_blocking() -> DeviceResult<u64> {
    let mut stream: sys::CUstream = null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: writes one stream handle into `stream`.
    check(unsafe { sys::cuStreamCreate(&mut stream, flags) }, "cuStreamCreate")?;
    Ok(handle(stream))
}

/// # Safety
/// `stream` was made by `stream_create_non_blocking` and nobody uses it afterwards.
pub(crate) unsafe fn stream_destroy(stream: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuStreamDestroy_v2(ptr(stream)) }, "cuStreamDestroy")
}

/// # Safety
/// `stream` is 0, 1, 2 or a live stream of the current context.
pub(crate) unsafe fn stream_synchronize(stream: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuStreamSynchronize(ptr(stream)) }, "cuStreamSynchronize")
}

// ---- virtual memory (only called once `driver::VIRTUAL_MEMORY` was found) ----

fn device_location(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
}

/// Pinned device memory on `device`, no compression; exportable as a POSIX file descriptor when
/// `shareable`.
fn allocation_prop(device: sys::CUdevice, shareable: bool) -> sys::CUmemAllocationProp {
    let handle_types = match shareable {
        true => sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        false => sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
    };
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handle_types,
        location: device_location(device),
        win32HandleMetaData: null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 { compressionType: 0, gpuDirectRDMACapable: 0, usage: 0, reserved: [0; 4] },
    }
}

pub(crate) fn allocation_granularity(device: sys::CUdevice) -> DeviceResult<u64> {
    let prop = allocation_prop(device, false);
    let mut granularity = 0usize;
    let option = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: reads `prop`, a fully initialised local; writes one size.
    check(unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, option) }, "cuMemGetAllocationGranularity")?;
    Ok(granularity as u64)
}

pub(crate) fn address_reserve(bytes: usize, alignment: usize) -> DeviceResult<u64> {
    let mut address: sys::CUdeviceptr = 0;
    // SAFETY: writes one address; no fixed address asked for (0), flags 0.
    check(unsafe { sys::cuMemAddressReserve(&mut address, bytes, alignment, 0, 0) }, "cuMemAddressReserve")?;
    Ok(address)
}

/// # Safety
/// `[address, address + bytes)` is a whole reservation `address_reserve` made, holding no mapping.
pub(crate) unsafe fn address_free(address: u64, bytes: usize) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuMemAddressFree(address, bytes) }, "cuMemAddressFree")
}

/// Creates `bytes` of physical memory on `device` (exportable when `shareable`); the handle must
/// be given to `mem_release`.
pub(crate) fn mem_create(bytes: usize, device: sys::CUdevice, shareable: bool) -> DeviceResult<u64> {
    let prop = allocation_prop(device, shareable);
    let mut allocation: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: reads `prop`, a fully initialised local; writes one handle; flags 0.
    check(unsafe { sys::cuMemCreate(&mut allocation, bytes, &prop, 0) }, "cuMemCreate")?;
    Ok(allocation)
}

/// # Safety
/// `[address, address + bytes)` lies in a reservation of ours and holds no mapping; `allocation`
/// is a live handle of at least `bytes`.
pub(crate) unsafe fn mem_map(address: u64, bytes: usize, allocation: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees; offset 0 and flags 0 are the only values allowed.
    check(unsafe { sys::cuMemMap(address, bytes, 0, allocation, 0) }, "cuMemMap")
}

/// # Safety
/// `[address, address + bytes)` is mapped by us.
pub(crate) unsafe fn mem_set_access(address: u64, bytes: usize, device: sys::CUdevice) -> DeviceResult<()> {
    let access =
        sys::CUmemAccessDesc { location: device_location(device), flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    // SAFETY: as the caller guarantees; reads one descriptor from a local.
    check(unsafe { sys::cuMemSetAccess(address, bytes, &access, 1) }, "cuMemSetAccess")
}

/// # Safety
/// `[address, address + bytes)` is one range we mapped, and no queued work still uses it.
pub(crate) unsafe fn mem_unmap(address: u64, bytes: usize) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuMemUnmap(address, bytes) }, "cuMemUnmap")
}

/// # Safety
/// `allocation` came from `mem_create` and is released once.
pub(crate) unsafe fn mem_release(allocation: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees; the memory is freed once no mapping refers to it.
    check(unsafe { sys::cuMemRelease(allocation) }, "cuMemRelease")
}

// ---- sharing (only called once `driver::SHARING` was found) ----

/// A new POSIX file descriptor for `allocation` (made shareable); the caller owns it.
pub(crate) fn mem_export_fd(allocation: u64) -> DeviceResult<i32> {
    let mut fd: i32 = -1;
    let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: for this handle type the driver writes one `int` into `fd`; a handle it does not
    // know, or one made without this type, is an error code.
    check(
        unsafe { sys::cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, allocation, kind, 0) },
        "cuMemExportToShareableHandle",
    )?;
    Ok(fd)
}

/// The physical allocation behind `fd` (an export, possibly another process's); the handle must
/// be given to `mem_release`. The caller keeps `fd`.
pub(crate) fn mem_import_fd(fd: i32) -> DeviceResult<u64> {
    let mut allocation: sys::CUmemGenericAllocationHandle = 0;
    let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: writes one handle; for this type the descriptor is passed as the pointer's value,
    // which the driver checks (it never dereferences it).
    check(
        unsafe { sys::cuMemImportFromShareableHandle(&mut allocation, fd as usize as *mut c_void, kind) },
        "cuMemImportFromShareableHandle",
    )?;
    Ok(allocation)
}

// ---- legacy IPC (`cuMemAlloc` allocations; every Linux driver has it) ----

/// The legacy IPC handle of the `cuMemAlloc` allocation based at `raw`.
pub(crate) fn ipc_get_mem_handle(raw: u64) -> DeviceResult<[u8; 64]> {
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: writes one handle; an address that is no allocation of the current context (or one
    // made by `cuMemCreate`) is an error code.
    check(unsafe { sys::cuIpcGetMemHandle(&mut handle, raw) }, "cuIpcGetMemHandle")?;
    Ok(handle.reserved.map(|c| c as u8))
}

/// Maps another process's allocation by its legacy IPC handle, peer access enabled as needed;
/// its base address here, which `ipc_close_mem_handle` unmaps.
pub(crate) fn ipc_open_mem_handle(handle: [u8; 64]) -> DeviceResult<u64> {
    let mut address = 0;
    let handle = sys::CUipcMemHandle { reserved: handle.map(|b| b as c_char) };
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: writes one address; the handle is plain bytes that the driver checks (a made-up or
    // stale one, or one of this process, is an error code).
    check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut address, handle, flags) }, "cuIpcOpenMemHandle")?;
    Ok(address)
}

/// The base and size of the allocation the driver knows at `address` (`cuMemGetAddressRange`).
pub(crate) fn mem_address_range(address: u64) -> DeviceResult<(u64, u64)> {
    let (mut base, mut size) = (0, 0usize);
    // SAFETY: writes one address and one size; an address the driver does not know is an error code.
    check(unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, address) }, "cuMemGetAddressRange")?;
    Ok((base, size as u64))
}

/// # Safety
/// `base` came from `ipc_open_mem_handle` and is closed once, after the work that uses it.
pub(crate) unsafe fn ipc_close_mem_handle(base: u64) -> DeviceResult<()> {
    // SAFETY: as the caller guarantees.
    check(unsafe { sys::cuIpcCloseMemHandle(base) }, "cuIpcCloseMemHandle")
}
