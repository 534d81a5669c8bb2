//! `cuGetProcAddress`: the way `cuda.bindings` (and so `cuda.core` and Numba) find every driver
//! function. It hands out the emulator's own exports: the implemented functions and the
//! `CUDA_ERROR_NOT_SUPPORTED` stubs of the rest.
#![allow(non_snake_case)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

use crate::abi::{self, CuResult};
use crate::calls;

/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` and `CU_GET_PROC_ADDRESS_SUCCESS`.
const SYMBOL_FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;

/// The address of the export `name` of this library, if it has one.
fn own_symbol(name: &str) -> Option<*mut c_void> {
    static OWN: OnceLock<usize> = OnceLock::new();
    let handle = *OWN.get_or_init(|| {
        let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
        // SAFETY: `dladdr` fills `info` for an address inside a loaded object (this function's
        // own library); `dlopen` with RTLD_NOLOAD only looks that library up again.
        unsafe {
            if libc::dladdr(own_symbol as *const c_void, info.as_mut_ptr()) == 0 {
                return 0;
            }
            libc::dlopen(info.assume_init().dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) as usize
        }
    });
    if handle == 0 {
        return None;
    }
    let name = CString::new(name).ok()?;
    // SAFETY: a symbol lookup in a library that stays loaded (we are running from it).
    let ptr = unsafe { libc::dlsym(handle as *mut c_void, name.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

/// The export that answers a request for `symbol` at `version`: the newest implemented form
/// (`symbol_vN` or `symbol`), else the newest stub. The forms of one function that the emulator
/// implements share a signature, or take a prefix of the newer form's arguments (as
/// `cuCtxGetDevice` does of `cuCtxGetDevice_v2`'s: it answers for the current context), except
/// `cuGetProcAddress` itself, whose `_v2` (CUDA 12.0) takes one more argument.
fn resolve(symbol: &str, version: c_int) -> Option<*mut c_void> {
    if symbol == "cuGetProcAddress" {
        return own_symbol(if version >= 12000 { "cuGetProcAddress_v2" } else { "cuGetProcAddress" });
    }
    let forms: Vec<String> = (2..=9).rev().map(|v| format!("{symbol}_v{v}")).chain([symbol.to_string()]).collect();
    let stub = |name: &String| crate::unsupported::NAMES.contains(&name.as_str());
    let implemented = forms.iter().filter(|f| !stub(f)).find_map(|f| own_symbol(f));
    implemented.or_else(|| forms.iter().find_map(|f| own_symbol(f)))
}

/// Whether the driver has the function `name`, in that form or another (`cuMemAlloc` for
/// `cuMemAlloc_v2`).
pub fn exports(name: &str) -> bool {
    resolve(name, c_int::MAX).is_some()
}

fn lookup(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) -> Result<(), CuResult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(abi::INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated name, as the API requires.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().map_err(|_| abi::INVALID_VALUE)?;
    let found = if name.starts_with("cu") { resolve(name, version) } else { None };
    if found.is_none() && crate::emulator().config.trace {
        eprintln!("emulated CUDA driver: cuGetProcAddress: no {name}");
    }
    // SAFETY: `pfn` is the caller's out-parameter, checked non-null.
    unsafe { pfn.write(found.unwrap_or(std::ptr::null_mut())) };
    found.map(|_| ()).ok_or(abi::NOT_FOUND)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, _flags: u64) -> CuResult {
    calls::run("cuGetProcAddress", || lookup(symbol, pfn, version))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CuResult {
    calls::run("cuGetProcAddress_v2", || {
        let result = lookup(symbol, pfn, version);
        if !status.is_null() {
            // SAFETY: the caller's optional out-parameter, checked non-null.
            unsafe { status.write(if result.is_ok() { SYMBOL_FOUND } else { SYMBOL_NOT_FOUND }) };
        }
        result
    })
}

/// `name` as a static NUL-terminated string, made once.
pub fn leak_c_string(name: &'static str) -> &'static [u8] {
    static MADE: OnceLock<Mutex<HashMap<&'static str, &'static [u8]>>> = OnceLock::new();
    let mut made = MADE.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    made.entry(name).or_insert_with(|| Box::leak(format!("{name}\0").into_bytes().into_boxed_slice()))
}
