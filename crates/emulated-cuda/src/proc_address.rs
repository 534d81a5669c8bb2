//! `cuGetProcAddress`: the way `cuda.bindings` (and so `cuda.core` and Numba) find every driver
//! function. It hands out the emulator's own exports (found by `symbols`): the implemented
//! functions and the `CUDA_ERROR_NOT_SUPPORTED` stubs of the rest.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::abi::{self, CuResult};
use crate::{entry, symbols};

/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` and `CU_GET_PROC_ADDRESS_SUCCESS`.
const SYMBOL_FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;

fn lookup(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int) -> Result<(), CuResult> {
    if symbol.is_null() || pfn.is_null() {
        return Err(abi::INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated name, as the API requires.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().map_err(|_| abi::INVALID_VALUE)?;
    let found = if name.starts_with("cu") { symbols::resolve(name, version) } else { None };
    if found.is_none() && crate::emulator().config.trace {
        eprintln!("emulated CUDA driver: cuGetProcAddress: no {name}");
    }
    // SAFETY: `pfn` is the caller's out-parameter, checked non-null.
    unsafe { pfn.write(found.unwrap_or(std::ptr::null_mut())) };
    found.map(|_| ()).ok_or(abi::NOT_FOUND)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, _flags: u64) -> CuResult {
    entry::run("cuGetProcAddress", || lookup(symbol, pfn, version))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CuResult {
    entry::run("cuGetProcAddress_v2", || {
        let result = lookup(symbol, pfn, version);
        if !status.is_null() {
            // SAFETY: the caller's optional out-parameter, checked non-null.
            unsafe { status.write(if result.is_ok() { SYMBOL_FOUND } else { SYMBOL_NOT_FOUND }) };
        }
        result
    })
}
