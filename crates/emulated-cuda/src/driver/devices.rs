//! Initialisation, versions and error strings, devices, primary and current contexts.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, OnceLock};

use super::put;
use crate::abi::{self, attribute, CuResult};
use crate::emulator;

// ---- initialisation, versions, errors ----

driver_fn!(
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(abi::INVALID_VALUE);
        }
        let e = emulator();
        if e.contexts.is_empty() {
            return Err(abi::NO_DEVICE);
        }
        e.initialized.store(true, Relaxed);
        Ok(())
    }
);

driver_fn!(
    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: out-parameter (see `put`).
        unsafe { put(version, emulator().config.driver_version) }
    }
);

/// `name` as a static NUL-terminated string, made once.
fn leak_c_string(name: &'static str) -> &'static [u8] {
    static MADE: OnceLock<Mutex<HashMap<&'static str, &'static [u8]>>> = OnceLock::new();
    let mut made = MADE.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    made.entry(name).or_insert_with(|| Box::leak(format!("{name}\0").into_bytes().into_boxed_slice()))
}

driver_fn!(
    fn cuGetErrorName(error: c_uint, text: *mut *const c_char) {
        let Some(name) = abi::code_name(error) else {
            // SAFETY: out-parameter; an unknown code gets null, as from the driver.
            unsafe { put(text, std::ptr::null())? };
            return Err(abi::INVALID_VALUE);
        };
        let static_name: &'static [u8] = leak_c_string(name);
        // SAFETY: out-parameter; the string is static and NUL-terminated.
        unsafe { put(text, static_name.as_ptr() as *const c_char) }
    }
);

driver_fn!(
    fn cuGetErrorString(error: c_uint, text: *mut *const c_char) {
        let Some(string) = abi::code_string(error) else {
            // SAFETY: out-parameter; an unknown code gets null, as from the driver.
            unsafe { put(text, std::ptr::null())? };
            return Err(abi::INVALID_VALUE);
        };
        // SAFETY: out-parameter; the string is static and NUL-terminated.
        unsafe { put(text, string.as_ptr() as *const c_char) }
    }
);

// ---- devices ----

driver_fn!(
    fn cuDeviceGetCount(count: *mut c_int) {
        let e = emulator();
        e.ready()?;
        // SAFETY: out-parameter.
        unsafe { put(count, e.contexts.len() as c_int) }
    }
);

driver_fn!(
    fn cuDeviceGet(device: *mut c_int, ordinal: c_int) {
        let d = emulator().device(ordinal)?;
        // SAFETY: out-parameter.
        unsafe { put(device, d) }
    }
);

driver_fn!(
    fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) {
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
    }
);

driver_fn!(
    fn cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int) {
        let e = emulator();
        let d = e.device(device)?;
        // SAFETY: out-parameter.
        unsafe { put(bytes, e.capacity[d as usize].load(Relaxed) as usize) }
    }
);

driver_fn!(
    fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, device: c_int) {
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
    }
);

fn uuid(device: i32) -> [u8; 16] {
    let mut id = *b"emulated-cuda-\0\0";
    id[15] = device as u8;
    id
}

driver_fn!(
    fn cuDeviceGetUuid(out: *mut [u8; 16], device: c_int) {
        let d = emulator().device(device)?;
        // SAFETY: out-parameter (a `CUuuid`, 16 bytes).
        unsafe { put(out, uuid(d)) }
    }
);

driver_fn!(
    fn cuDeviceGetUuid_v2(out: *mut [u8; 16], device: c_int) {
        let d = emulator().device(device)?;
        // SAFETY: out-parameter (a `CUuuid`, 16 bytes).
        unsafe { put(out, uuid(d)) }
    }
);

driver_fn!(
    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, device: c_int) {
        emulator().device(device)?;
        // SAFETY: out-parameters.
        unsafe {
            put(major, 9)?;
            put(minor, 0)
        }
    }
);

driver_fn!(
    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int) {
        let d = emulator().device(device)?;
        let text = format!("0000:{:02x}:00.0\0", d + 1);
        if bus_id.is_null() || (len as usize) < text.len() {
            return Err(abi::INVALID_VALUE);
        }
        // SAFETY: the caller's buffer holds `len >= text.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, bus_id, text.len()) };
        Ok(())
    }
);

driver_fn!(
    fn cuDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) {
        let e = emulator();
        e.device(device)?;
        e.device(peer)?;
        // SAFETY: out-parameter. Host memory is one address space: every device reaches every other.
        unsafe { put(can, i32::from(device != peer)) }
    }
);

// ---- primary contexts ----

driver_fn!(
    fn cuDevicePrimaryCtxRetain(ctx: *mut u64, device: c_int) {
        let e = emulator();
        let d = e.device(device)?;
        // SAFETY: out-parameter.
        unsafe { put(ctx, e.context_handle(d))? };
        e.contexts[d as usize].retains.fetch_add(1, Relaxed);
        Ok(())
    }
);

fn primary_release(device: c_int) -> Result<(), CuResult> {
    let e = emulator();
    let d = e.device(device)?;
    let retains = &e.contexts[d as usize].retains;
    retains.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).map(|_| ()).map_err(|_| abi::INVALID_CONTEXT)
}

driver_fn!(
    fn cuDevicePrimaryCtxRelease_v2(device: c_int) {
        primary_release(device)
    }
);
driver_fn!(
    fn cuDevicePrimaryCtxRelease(device: c_int) {
        primary_release(device)
    }
);

driver_fn!(
    fn cuDevicePrimaryCtxGetState(device: c_int, flags: *mut c_uint, active: *mut c_int) {
        let e = emulator();
        let ctx = &e.contexts[e.device(device)? as usize];
        // SAFETY: out-parameters.
        unsafe {
            put(flags, ctx.flags.load(Relaxed))?;
            put(active, i32::from(ctx.retains.load(Relaxed) > 0))
        }
    }
);

driver_fn!(
    fn cuDevicePrimaryCtxSetFlags_v2(device: c_int, flags: c_uint) {
        let e = emulator();
        e.contexts[e.device(device)? as usize].flags.store(flags, Relaxed);
        Ok(())
    }
);

driver_fn!(
    fn cuDevicePrimaryCtxReset_v2(device: c_int) {
        // Memory made in the context stays: a test driver keeps what a reset would destroy.
        emulator().device(device).map(|_| ())
    }
);

// ---- current context ----

driver_fn!(
    fn cuCtxGetCurrent(ctx: *mut u64) {
        let e = emulator();
        e.ready()?;
        let handle = e.current().map(|c| e.context_handle(c.device)).unwrap_or(0);
        // SAFETY: out-parameter.
        unsafe { put(ctx, handle) }
    }
);

driver_fn!(
    fn cuCtxSetCurrent(ctx: u64) {
        let e = emulator();
        e.ready()?;
        let device = if ctx == 0 { None } else { Some(e.context_of(ctx)?) };
        e.set_current(device);
        Ok(())
    }
);

driver_fn!(
    fn cuCtxPushCurrent_v2(ctx: u64) {
        let e = emulator();
        e.ready()?;
        let device = e.context_of(ctx)?;
        crate::CURRENT.with(|c| c.borrow_mut().push(device));
        Ok(())
    }
);

driver_fn!(
    fn cuCtxPopCurrent_v2(ctx: *mut u64) {
        let e = emulator();
        e.ready()?;
        let device = crate::CURRENT.with(|c| c.borrow_mut().pop()).ok_or(abi::INVALID_CONTEXT)?;
        if !ctx.is_null() {
            // SAFETY: out-parameter, checked non-null.
            unsafe { put(ctx, e.context_handle(device))? };
        }
        Ok(())
    }
);

driver_fn!(
    fn cuCtxGetDevice(device: *mut c_int) {
        let d = emulator().current()?.device;
        // SAFETY: out-parameter.
        unsafe { put(device, d) }
    }
);

driver_fn!(
    fn cuCtxGetApiVersion(ctx: u64, version: *mut c_uint) {
        let e = emulator();
        if ctx != 0 {
            e.context_of(ctx)?;
        } else {
            e.current()?;
        }
        // SAFETY: out-parameter.
        unsafe { put(version, 3020) }
    }
);

driver_fn!(
    fn cuCtxGetFlags(flags: *mut c_uint) {
        let f = emulator().current()?.flags.load(Relaxed);
        // SAFETY: out-parameter.
        unsafe { put(flags, f) }
    }
);

driver_fn!(
    fn cuCtxGetId(ctx: u64, id: *mut u64) {
        let e = emulator();
        let device = if ctx == 0 { e.current()?.device } else { e.context_of(ctx)? };
        // SAFETY: out-parameter.
        unsafe { put(id, device as u64 + 1) }
    }
);

driver_fn!(
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
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
    }
);

driver_fn!(
    fn cuCtxSynchronize() {
        let e = emulator();
        let ctx = e.current()?;
        for stream in ctx.all_streams() {
            e.host_waits(&stream)?;
        }
        ctx.sticky_error()
    }
);
