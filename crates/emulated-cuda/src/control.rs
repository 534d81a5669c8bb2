//! The test-only entry points (`emucuda_*`): not part of any CUDA driver, so a test that finds
//! `emucuda_is_emulated` knows it runs on the emulator. Call counts, faults, race reports and
//! capacity are process-wide.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::abi::{self, CuResult};
use crate::streams::Work;
use crate::{emulator, entry};

/// Copies `text` into the caller's buffer of `capacity` bytes (NUL-terminated, cut to fit) and
/// returns its full length, so a caller can ask again with a larger buffer.
///
/// # Safety
/// `buffer` is null or valid for `capacity` bytes.
unsafe fn give_text(text: &str, buffer: *mut c_char, capacity: usize) -> usize {
    if !buffer.is_null() && capacity > 0 {
        let n = text.len().min(capacity - 1);
        // SAFETY: the buffer holds `capacity > n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buffer, n);
            buffer.add(n).write(0);
        }
    }
    text.len()
}

/// # Safety
/// `name` is null or NUL-terminated.
unsafe fn name_of<'a>(name: *const c_char) -> Option<&'a str> {
    if name.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated, as the caller guarantees.
    unsafe { CStr::from_ptr(name) }.to_str().ok()
}

/// 1: this is the emulated driver.
#[no_mangle]
pub extern "C" fn emucuda_is_emulated() -> c_int {
    1
}

/// How many times `name` (without its `_vN` suffix) was called.
#[no_mangle]
pub unsafe extern "C" fn emucuda_call_count(name: *const c_char) -> u64 {
    // SAFETY: as `name_of` requires.
    unsafe { name_of(name) }.map_or(0, |n| emulator().calls.count_of(n))
}

/// Every call count, one `name count` line each.
#[no_mangle]
pub unsafe extern "C" fn emucuda_call_counts(buffer: *mut c_char, capacity: usize) -> usize {
    // SAFETY: as `give_text` requires.
    unsafe { give_text(&emulator().calls.report(), buffer, capacity) }
}

/// Forgets the call counts, planned faults, race count and reports (not the memory in use).
#[no_mangle]
pub extern "C" fn emucuda_reset() {
    let e = emulator();
    e.calls.reset();
    e.races.reset();
    e.faults.store(0, Relaxed);
}

/// Makes the `nth` call of `name` from now (1: the next) fail with `code` (a CUresult of CUDA
/// 13.0 other than success); `nth` 0 clears the faults planned for `name`.
#[no_mangle]
pub unsafe extern "C" fn emucuda_fail(name: *const c_char, nth: u64, code: c_uint) -> CuResult {
    // SAFETY: as `name_of` requires.
    let Some(name) = (unsafe { name_of(name) }) else { return abi::INVALID_VALUE };
    if nth != 0 && (code == abi::SUCCESS || abi::code_name(code).is_none()) {
        return abi::INVALID_VALUE;
    }
    emulator().calls.fail_in(name, nth, code);
    abi::SUCCESS
}

/// Stream-order races found so far.
#[no_mangle]
pub extern "C" fn emucuda_races() -> u64 {
    emulator().races.count()
}

/// Illegal addresses touched by queued work so far.
#[no_mangle]
pub extern "C" fn emucuda_faults() -> u64 {
    emulator().faults.load(Relaxed)
}

/// The most recent race and fault reports, one a line.
#[no_mangle]
pub unsafe extern "C" fn emucuda_reports(buffer: *mut c_char, capacity: usize) -> usize {
    let text = emulator().races.reports().join("\n");
    // SAFETY: as `give_text` requires.
    unsafe { give_text(&text, buffer, capacity) }
}

/// Strict mode on (1) or off (0): a race or fault then ends the process.
#[no_mangle]
pub extern "C" fn emucuda_set_strict(on: c_int) {
    emulator().races.set_strict(on != 0);
}

/// Sets the memory of `device` (what `cuMemGetInfo` and `cuDeviceTotalMem` say); memory in
/// use above it stays, and further allocations fail.
#[no_mangle]
pub extern "C" fn emucuda_set_memory(device: c_int, bytes: u64) -> CuResult {
    let e = emulator();
    match e.capacity.get(device.max(0) as usize).filter(|_| device >= 0 && bytes > 0) {
        Some(capacity) => {
            capacity.store(bytes, Relaxed);
            abi::SUCCESS
        }
        None => abi::INVALID_VALUE,
    }
}

/// Clears the sticky error of `device`'s context (after a test that faulted on purpose).
#[no_mangle]
pub extern "C" fn emucuda_clear_error(device: c_int) -> CuResult {
    match emulator().contexts.get(device.max(0) as usize) {
        Some(ctx) if device >= 0 => {
            ctx.sticky.store(abi::SUCCESS, Relaxed);
            abi::SUCCESS
        }
        _ => abi::INVALID_VALUE,
    }
}

/// The test-only kernel: queued on `stream`, it sleeps `delay_us` microseconds and then writes
/// `value` into every byte of `[dst, dst + len)`. Its pointer is not checked when it is queued
/// (a GPU kernel's is not either): touching memory it may not touch is an illegal address when
/// it runs, sticky on the context.
#[no_mangle]
pub extern "C" fn emucuda_launch_fill(dst: u64, len: u64, value: u8, delay_us: u32, stream: u64) -> CuResult {
    entry::run("emucuda_launch_fill", || {
        let e = emulator();
        e.current()?;
        let stream = e.stream(stream)?;
        let accesses = e.device_accesses(&[(dst, len, true)]);
        let delay = Duration::from_micros(delay_us as u64);
        e.queue(&stream, Work::Kernel { dst, len, value, delay }, &accesses);
        Ok(())
    })
}
