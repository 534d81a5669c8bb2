//! The library's own exports, found by name: which one answers a request for a driver function
//! (for `cuGetProcAddress`), and whether the driver has a function at all (for a fault plan).

use std::ffi::{c_int, c_void, CString};
use std::sync::OnceLock;

use crate::names;

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
pub fn resolve(symbol: &str, version: c_int) -> Option<*mut c_void> {
    if symbol == "cuGetProcAddress" {
        return own_symbol(if version >= 12000 { "cuGetProcAddress_v2" } else { "cuGetProcAddress" });
    }
    let forms: Vec<String> = (2..=9).rev().map(|v| format!("{symbol}_v{v}")).chain([symbol.to_string()]).collect();
    let stub = |name: &String| names::UNSUPPORTED.contains(&name.as_str());
    let implemented = forms.iter().filter(|f| !stub(f)).find_map(|f| own_symbol(f));
    implemented.or_else(|| forms.iter().find_map(|f| own_symbol(f)))
}

/// Whether the driver has the function `name`, in that form or another (`cuMemAlloc` for
/// `cuMemAlloc_v2`).
pub fn exports(name: &str) -> bool {
    resolve(name, c_int::MAX).is_some()
}
