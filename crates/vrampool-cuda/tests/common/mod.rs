//! What the device test binaries share: deciding at run time whether they can run, and the
//! emulated driver's test-only entry points.
//!
//! The binaries use libtest-mimic instead of the standard harness so that, without a CUDA
//! device (a GPU, or the emulated driver loaded by `scripts/emulated-cuda.sh`), every test is
//! reported as *ignored*, never as passed. With `VRAMPOOL_REQUIRE_GPU=1` (scripts/gpu-check.sh
//! sets it on a GPU machine) a missing device fails the device tests instead, and with
//! `VRAMPOOL_REQUIRE_EMULATED=1` (scripts/test.sh) a missing emulated driver fails its tests.
#![allow(dead_code)] // each binary uses its own part

use std::ffi::{c_char, c_int, c_uint, CString};
use std::sync::{Mutex, MutexGuard};

use libtest_mimic::{Arguments, Trial};
use vrampool_cuda::{has_symbol, sys, CudaDevice};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The tests read the device's free memory, which a test beside them would move: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `tests` (name, body) if `runnable` says so, else reports each as ignored and prints
/// why (`skipped: ...`, the line scripts/gpu-check.sh looks for), or fails the run when the
/// environment variable `require` is 1.
pub fn run(tests: Vec<(&'static str, fn())>, runnable: Result<(), String>, require: &str) -> ! {
    let args = Arguments::from_args();
    if let Err(why) = &runnable {
        if std::env::var(require).is_ok_and(|v| v == "1") {
            eprintln!("{require}=1 but {why}");
            std::process::exit(101);
        }
        println!("skipped: {why}");
    }
    let ignored = runnable.is_err();
    let trials = tests
        .into_iter()
        .map(|(name, body)| {
            Trial::test(name, move || {
                body();
                Ok(())
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}

/// Ok when device 0 opens (a GPU or the emulated driver).
pub fn device_present() -> Result<(), String> {
    CudaDevice::new(0).map(drop).map_err(|e| format!("no CUDA device ({e})"))
}

pub fn device() -> CudaDevice {
    let dev = CudaDevice::new(0).expect("device 0 opened when the run started");
    eprintln!("device: {dev:?}");
    dev
}

/// Whether the loaded libcuda is the emulated driver.
pub fn emulated() -> bool {
    has_symbol("emucuda_is_emulated")
}

/// Looks up one of the emulated driver's test-only functions.
fn emucuda<T: Copy>(name: &str) -> T {
    assert!(emulated(), "{name} needs the emulated driver");
    // SAFETY: the library is the emulated driver (checked above), which exports `name` with
    // the signature `T` its callers below spell out; the library stays loaded.
    unsafe { *sys::culib().get::<T>(name.as_bytes()).expect("emulated driver entry point") }
}

pub fn call_count(name: &str) -> u64 {
    let f: unsafe extern "C" fn(*const c_char) -> u64 = emucuda("emucuda_call_count");
    let name = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name.
    unsafe { f(name.as_ptr()) }
}

/// Every call count since the last `reset`.
pub fn call_counts() -> Vec<(String, u64)> {
    let f: unsafe extern "C" fn(*mut c_char, usize) -> usize = emucuda("emucuda_call_counts");
    text(f).lines().filter_map(|l| l.split_once(' ').map(|(n, c)| (n.to_string(), c.parse().unwrap()))).collect()
}

fn text(f: unsafe extern "C" fn(*mut c_char, usize) -> usize) -> String {
    // SAFETY: a null buffer asks for the length only.
    let len = unsafe { f(std::ptr::null_mut(), 0) };
    let mut buffer = vec![0u8; len + 1];
    // SAFETY: the buffer holds `len + 1` bytes.
    unsafe { f(buffer.as_mut_ptr() as *mut c_char, buffer.len()) };
    buffer.truncate(len);
    String::from_utf8(buffer).unwrap()
}

pub fn reset() {
    let f: extern "C" fn() = emucuda("emucuda_reset");
    f()
}

/// Makes the `nth` call of `name` from now fail with `code`.
pub fn fail(name: &str, nth: u64, code: sys::CUresult) {
    let f: unsafe extern "C" fn(*const c_char, u64, c_uint) -> c_uint = emucuda("emucuda_fail");
    let name = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name.
    assert_eq!(unsafe { f(name.as_ptr(), nth, code as c_uint) }, 0);
}

pub fn races() -> u64 {
    let f: extern "C" fn() -> u64 = emucuda("emucuda_races");
    f()
}

pub fn faults() -> u64 {
    let f: extern "C" fn() -> u64 = emucuda("emucuda_faults");
    f()
}

pub fn reports() -> String {
    let f: unsafe extern "C" fn(*mut c_char, usize) -> usize = emucuda("emucuda_reports");
    text(f)
}

pub fn set_strict(on: bool) {
    let f: extern "C" fn(c_int) = emucuda("emucuda_set_strict");
    f(c_int::from(on))
}

pub fn set_memory(device: i32, bytes: u64) {
    let f: extern "C" fn(c_int, u64) -> c_uint = emucuda("emucuda_set_memory");
    assert_eq!(f(device, bytes), 0);
}

pub fn clear_error(device: i32) {
    let f: extern "C" fn(c_int) -> c_uint = emucuda("emucuda_clear_error");
    assert_eq!(f(device), 0);
}

/// The emulated driver's test kernel: after `delay_us`, `value` into `[dst, dst + len)`.
pub fn launch_fill(dst: u64, len: u64, value: u8, delay_us: u32, stream: u64) {
    let f: extern "C" fn(u64, u64, u8, u32, u64) -> c_uint = emucuda("emucuda_launch_fill");
    assert_eq!(f(dst, len, value, delay_us, stream), 0, "emucuda_launch_fill");
}
