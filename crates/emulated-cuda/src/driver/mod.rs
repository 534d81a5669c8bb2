//! The driver functions the emulator implements, exported under their C names.
//!
//! Every pointer argument is trusted as the CUDA API requires of its callers (valid for its
//! C type), except that null out-parameters are refused with `CUDA_ERROR_INVALID_VALUE`;
//! handles and device addresses are all checked against the emulator's own records.
#![allow(non_snake_case)]
//!
//! By concern: `devices` (initialisation, errors, devices, contexts), `memory` (allocations,
//! copies, memsets, pointer attributes), `virtual_memory` (reserve, create, map, access) and
//! `sharing` (shareable handles and IPC handles across processes), `streams` (streams and events).

use crate::abi::{self, CuResult};

/// Exports `name` as a driver function: counted, fault-injectable, traced, panic-free.
macro_rules! driver_fn {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CuResult {
            $crate::entry::run(stringify!($name), || $body)
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

mod devices;
mod memory;
mod sharing;
mod streams;
mod virtual_memory;

#[cfg(test)]
mod tests {
    use std::ffi::{c_char, c_void};

    use super::devices::*;
    use super::memory::*;
    use crate::abi::{self, pointer};

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
            assert_eq!(
                cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut c_void, pointer::DEVICE_ORDINAL, &host as *const u8 as u64),
                abi::INVALID_VALUE
            );
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
