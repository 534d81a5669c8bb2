//! The layer right above cudarc's raw bindings: finding libcuda without panicking, turning a
//! `CUresult` into a `DeviceError`, and making a context current for the length of a call.
//!
//! cudarc loads libcuda lazily and panics when it is missing, and panics again when a symbol is
//! missing. Both are checked here once, up front, so that no later driver call can panic: every
//! function `CudaDevice` calls is in `REQUIRED` (or in `VIRTUAL_MEMORY`, checked before that
//! family is enabled).

use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::sys::{self, cudaError_enum as Code, CUresult};
use vrampool_core::device::DeviceResult;
use vrampool_core::DeviceError;

/// Driver functions `CudaDevice` needs; `load` refuses a libcuda that lacks one.
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemGetAddressRange_v2",
    "cuMemsetD8Async",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
];

/// The virtual-memory family (CUDA 10.2+). Without it the device simply reports no granularity.
pub(crate) const VIRTUAL_MEMORY: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemRelease",
];

/// Sharing segments with other processes (POSIX file descriptors); needed by `ipc` pools only.
pub(crate) const SHARING: &[&str] = &["cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"];

/// The outcome of the one attempt to load libcuda, kept for the life of the process (dlopen of a
/// library that was missing does not start working later without a restart anyway).
static LOADED: OnceLock<Result<(), String>> = OnceLock::new();

/// Loads libcuda and checks that it has every function this crate calls. Never panics.
pub fn load() -> DeviceResult<()> {
    LOADED
        .get_or_init(|| {
            // `load_uncached` is written not to panic; the guard is for a cudarc that would.
            std::panic::catch_unwind(load_uncached).unwrap_or_else(|_| Err("CUDA driver not found: loading libcuda panicked".to_string()))
        })
        .clone()
        .map_err(DeviceError::Driver)
}

fn load_uncached() -> Result<(), String> {
    // SAFETY: dlopen()s each candidate name and closes it again. Loading libcuda runs its
    // initialisers, which is what every CUDA program does; nothing else is touched.
    if !unsafe { sys::is_culib_present() } {
        let tried = cudarc::get_lib_name_candidates("cuda").len() + cudarc::get_lib_name_candidates("nvcuda").len();
        return Err(format!(
            "CUDA driver not found: no libcuda could be loaded (tried libcuda.so, libcuda.so.1 and {} \
             other names); is the NVIDIA driver installed and its library on the loader path?",
            tried.saturating_sub(2),
        ));
    }
    match REQUIRED.iter().find(|name| !symbol_present(name)) {
        Some(missing) => Err(format!("CUDA driver too old: libcuda has no `{missing}`")),
        None => Ok(()),
    }
}

/// Whether the loaded libcuda exports `name`. Only to be called once `is_culib_present` said yes.
fn symbol_present(name: &str) -> bool {
    // SAFETY: `culib` panics only when no candidate library loads, and the caller checked that
    // one does. Looking a symbol up neither calls it nor keeps it beyond this expression.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()).is_ok() }
}

/// Whether libcuda loads and exports `name` (for callers that use optional driver functions,
/// like the benchmark's `cuMemAllocAsync`). Never panics; false without a driver.
pub fn has_symbol(name: &str) -> bool {
    load().is_ok() && symbol_present(name)
}

/// `Ok` for `CUDA_SUCCESS`, else the error `error_from` makes.
pub fn check(result: CUresult, call: &str) -> DeviceResult<()> {
    match result {
        Code::CUDA_SUCCESS => Ok(()),
        other => Err(error_from(other, call)),
    }
}

/// The pool's error for a failed driver call: `OutOfMemory` for `CUDA_ERROR_OUT_OF_MEMORY` (the
/// pool frees its cache and retries on that one), else `Driver` naming the call, the code and,
/// where the driver is loaded, its description.
pub fn error_from(result: CUresult, call: &str) -> DeviceError {
    if result == Code::CUDA_ERROR_OUT_OF_MEMORY {
        return DeviceError::OutOfMemory;
    }
    let code = result as u32;
    match describe(result) {
        Some(text) => DeviceError::Driver(format!("{call} failed: {result:?} ({code}): {text}")),
        None => DeviceError::Driver(format!("{call} failed: {result:?} ({code})")),
    }
}

/// The driver's own description of `result`, if the driver is loaded and knows it.
fn describe(result: CUresult) -> Option<String> {
    if !matches!(LOADED.get(), Some(Ok(()))) {
        return None;
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver is loaded and exports the function (checked in `load`); it writes one
    // pointer to a static, NUL-terminated string (or leaves it null for an unknown code).
    let status = unsafe { sys::cuGetErrorString(result, &mut text) };
    if status != Code::CUDA_SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: non-null and pointing to the driver's static NUL-terminated description.
    Some(unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned())
}

/// `cuEventQuery`'s answer: `CUDA_ERROR_NOT_READY` is "not yet", not a failure.
pub(crate) fn query_result(result: CUresult) -> DeviceResult<bool> {
    match result {
        Code::CUDA_SUCCESS => Ok(true),
        Code::CUDA_ERROR_NOT_READY => Ok(false),
        other => Err(error_from(other, "cuEventQuery")),
    }
}

/// A driver handle kept as the integer it is. Storing handles as integers keeps `CudaDevice`
/// `Send + Sync` without an `unsafe impl`: the driver API is thread-safe and its handles are
/// valid in every thread of the process, so nothing here is tied to the thread that made it.
pub(crate) fn handle<T>(ptr: *mut T) -> u64 {
    ptr as usize as u64
}

/// The inverse of `handle` (also used for stream handles that callers pass in: 0 is the legacy
/// default stream, 1 `CU_STREAM_LEGACY`, 2 `CU_STREAM_PER_THREAD`).
pub(crate) fn ptr<T>(handle: u64) -> *mut T {
    handle as usize as *mut T
}

/// Makes a context current on the calling thread for the length of a driver call and puts the
/// caller's own context back afterwards, the way PyTorch's device guards do, so a thread that
/// works on another device is left as it was. A thread with no current context keeps ours: that
/// saves a call on the next entry and disturbs nobody.
pub(crate) struct CurrentContext {
    previous: Option<u64>,
}

impl CurrentContext {
    pub(crate) fn enter(context: u64) -> DeviceResult<Self> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle into `current`; the driver was loaded and initialised before
        // any `CudaDevice` (and so any context) existed.
        check(unsafe { sys::cuCtxGetCurrent(&mut current) }, "cuCtxGetCurrent")?;
        if handle(current) == context {
            return Ok(Self { previous: None });
        }
        // SAFETY: `context` is a primary context its `CudaDevice` retained and still holds.
        check(unsafe { sys::cuCtxSetCurrent(ptr(context)) }, "cuCtxSetCurrent")?;
        Ok(Self { previous: (!current.is_null()).then(|| handle(current)) })
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: restores the handle the driver gave us for this thread a moment ago. A
            // failure (that context destroyed meanwhile) leaves ours current, which is harmless.
            let _ = unsafe { sys::cuCtxSetCurrent(ptr(previous)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_maps_to_the_pool_error() {
        assert_eq!(error_from(Code::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc"), DeviceError::OutOfMemory);
        assert_eq!(check(Code::CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate"), Err(DeviceError::OutOfMemory));
        assert_eq!(check(Code::CUDA_SUCCESS, "cuMemFree"), Ok(()));
    }

    #[test]
    fn other_errors_name_the_call_and_the_code() {
        match error_from(Code::CUDA_ERROR_INVALID_VALUE, "cuMemFree") {
            DeviceError::Driver(text) => {
                assert!(text.starts_with("cuMemFree failed: CUDA_ERROR_INVALID_VALUE (1)"), "{text}");
            }
            other => panic!("expected a driver error, got {other:?}"),
        }
    }

    #[test]
    fn not_ready_is_an_answer_not_an_error() {
        assert_eq!(query_result(Code::CUDA_SUCCESS), Ok(true));
        assert_eq!(query_result(Code::CUDA_ERROR_NOT_READY), Ok(false));
        assert!(matches!(query_result(Code::CUDA_ERROR_INVALID_HANDLE), Err(DeviceError::Driver(_))));
    }

    #[test]
    fn handles_round_trip_through_integers() {
        let raw: *mut u8 = ptr(0x7f00_dead_b000);
        assert_eq!(handle(raw), 0x7f00_dead_b000);
        assert!(ptr::<u8>(0).is_null());
    }

    #[test]
    fn loading_never_panics_and_agrees_with_symbol_lookups() {
        match load() {
            Ok(()) => assert!(has_symbol("cuMemAlloc_v2")),
            Err(DeviceError::Driver(text)) => {
                assert!(text.starts_with("CUDA driver"), "{text}");
                assert!(!has_symbol("cuMemAlloc_v2"));
            }
            Err(other) => panic!("unexpected error {other:?}"),
        }
        assert!(!has_symbol("cuNoSuchFunction"));
    }
}
