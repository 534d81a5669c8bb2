//! The C ABI that PyTorch's `CUDAPluggableAllocator` loads from this very extension module:
//! `extern "C"` shims over the process's [`Abi`], one `DeviceResource` per device.
//!
//! ```text
//! void* vrampool_malloc(size_t size, int device, cudaStream_t stream);        // never throws
//! void* vrampool_torch_malloc(size_t size, int device, cudaStream_t stream);  // PyTorch's: may throw
//! void  vrampool_free(void* ptr, size_t size, int device, cudaStream_t stream);
//! void  vrampool_init(int device_count);                 // set_init_fn
//! void  vrampool_reset(void);                            // set_reset_fn: torch.cuda.empty_cache()
//! void  vrampool_memory_fraction(double fraction, int device);   // set_memory_fraction_fn
//! void* vrampool_base_alloc(void* ptr, size_t* size);    // set_base_alloc_fn
//! void  vrampool_record_stream(void* ptr, cudaStream_t stream);  // set_record_stream_fn
//! void  vrampool_begin_allocate_to_pool(int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter);
//! void  vrampool_end_allocate_to_pool(int device, MempoolId_t id);
//! void  vrampool_release_pool(int device, MempoolId_t id);
//! int    vrampool_configure(const char* text);           // 0, or -1 with the reason in last_error
//! size_t vrampool_last_error(char* buffer, size_t capacity);
//! void  vrampool_planned_enable(int on);               // the planned arena: a mode of the allocator
//! void  vrampool_planned_step(uint64_t key);           // an iteration boundary; `key` names the next one
//! ```
//!
//! Nothing crosses the ABI as a panic: every entry runs under `catch_unwind`, and a failure is
//! recorded (`last_error`, and for out-of-memory `last_oom`) and answered with null or nothing.
//! PyTorch does not check the pointer its pluggable allocator returns
//! (`CUDAPluggableAllocator::malloc` and `allocate` of torch 2.11 and 2.15 store it as is), so a
//! null would become a tensor at address 0; `install()` therefore turns on `raise_on_failure`,
//! under which a failed `vrampool_torch_malloc` (the entry PyTorch alone is given;
//! `vrampool_malloc` never throws, so a C or ctypes caller is never terminated) throws
//! libstdc++'s `std::runtime_error` ("CUDA out of memory. ...") that PyTorch turns into a Python
//! `RuntimeError`. (Inside `torch.cuda.MemPool` PyTorch's caching allocator does check: a null is
//! its out-of-memory.) `vrampool_torch_malloc` itself is C (`csrc/malloc.c`, which says why): it
//! calls `vrampool_torch_malloc_or_message` here and throws after that has returned, so no
//! exception ever unwinds through Rust; every Rust entry returns.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use vrampool_core::failures::{Failure, FailureLog};
use vrampool_core::registry::RegistryError;
use vrampool_core::{AllocatorConfig, CachedFree, DeviceKind, DeviceRegistry, Limit, MemoryResource, PoolError, PoolId, SimMode, StreamId};

use crate::resource::{Backend, DeviceResource};

/// What the C ABI keeps for the process, since PyTorch's entries carry no context: a resource
/// per device, the failures it could not return, and the modes its calls set.
pub(crate) struct Abi {
    pub devices: DeviceRegistry<DeviceResource>,
    pub failures: FailureLog,
    /// Whether a failed `vrampool_torch_malloc` throws a C++ exception instead of returning null.
    pub raise_on_failure: AtomicBool,
    /// The planned arena's mode, and the key `vrampool_planned_step` named last: what a device
    /// made later starts with.
    planned_on: AtomicBool,
    planned_key: AtomicU64,
}

pub(crate) static ABI: Abi = Abi {
    devices: DeviceRegistry::new(),
    failures: FailureLog::new(),
    raise_on_failure: AtomicBool::new(false),
    planned_on: AtomicBool::new(false),
    planned_key: AtomicU64::new(vrampool_steady::DEFAULT_KEY),
};

impl Abi {
    /// `ordinal`'s resource, made from the configuration on first use.
    #[inline]
    pub fn device(&self, ordinal: c_int) -> Result<&DeviceResource, RegistryError> {
        self.devices.get_or_make(ordinal, |config, ordinal| self.make(config, ordinal))
    }

    /// Runs under the registry's lock, as `set_planned` and `planned_step` do.
    fn make(&self, config: &AllocatorConfig, ordinal: i32) -> Result<DeviceResource, PoolError> {
        let backend = match config.device {
            DeviceKind::Cuda => Backend::Cuda,
            DeviceKind::Sim => Backend::Sim { capacity: config.sim_capacity, mode: SimMode::HostBacked },
        };
        let resource = DeviceResource::open(backend, ordinal, config.pool.clone(), config.text.clone())?;
        // A steady pool picks each iteration's plan by itself, unless the caller turned the mode on and
        // names the keys; the others start with the key named last.
        if !resource.planned().is_steady() || self.planned_on.load(Relaxed) {
            resource.planned().step(self.planned_key.load(Relaxed));
        }
        resource.planned().set_on(self.planned_on.load(Relaxed));
        Ok(resource)
    }

    pub fn planned_on(&self) -> bool {
        self.planned_on.load(Relaxed)
    }

    /// Turns the planned arena's mode on or off on every device, those made later too.
    pub fn set_planned(&self, on: bool) {
        self.devices.with_entries(|devices| {
            self.planned_on.store(on, Relaxed);
            devices.iter().for_each(|(_, d)| d.planned().set_on(on));
        })
    }

    /// An iteration boundary on every device's planned arena.
    pub fn planned_step(&self, key: u64) {
        self.devices.with_entries(|devices| {
            self.planned_key.store(key, Relaxed);
            devices.iter().for_each(|(_, d)| d.planned().step(key));
        })
    }

    /// Gives every wholly free segment of every device back; the bytes, or the first error.
    pub fn trim_all(&self) -> Result<u64, String> {
        let mut bytes = 0;
        let mut first_error = None;
        for (ordinal, device) in self.devices.entries() {
            match device.trim() {
                Ok(b) => bytes += b,
                Err(e) => {
                    first_error.get_or_insert(format!("device {ordinal}: {e}"));
                }
            }
        }
        first_error.map_or(Ok(bytes), Err)
    }

    /// For tests: closes and unhooks every device (their memory stays reserved: blocks may be
    /// live), forgets the configuration, the failures and the modes.
    pub fn reset(&self) {
        for device in self.devices.unhook_all() {
            let _ = device.close();
        }
        self.failures.reset();
        self.planned_on.store(false, Relaxed);
        self.planned_key.store(vrampool_steady::DEFAULT_KEY, Relaxed);
        self.raise_on_failure.store(false, Relaxed);
    }

    fn refuse(&self, kind: Failure, message: String) {
        self.failures.record(kind, Some(message));
    }
}

/// Runs an entry's body; a panic becomes a recorded error and `fallback`.
pub(crate) fn guard<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            ABI.refuse(Failure::Panic, format!("vrampool_{what}: internal error (panic): {detail}"));
            fallback
        }
    }
}

// ---- allocation ----

/// Allocates: the block's address, or 0 with why not in `reason` (empty after a panic, which the
/// guard recorded). No message is built or moved unless the call fails (out of line).
#[inline(always)]
fn try_malloc(size: usize, device: c_int, stream: *mut c_void, reason: &mut String) -> u64 {
    guard("malloc", 0, || {
        let Some(resource) = ABI.devices.get(device) else { return malloc_on_new_device(size, device, stream, reason) };
        let stream = StreamId::canonical(stream as u64);
        match resource.allocate(size as u64, stream) {
            Ok(addr) => addr,
            Err(e) => malloc_refused(resource, e, size, device, stream, reason),
        }
    })
}

/// The first allocation on `device`: makes its resource, then allocates.
#[cold]
#[inline(never)]
fn malloc_on_new_device(size: usize, device: c_int, stream: *mut c_void, reason: &mut String) -> u64 {
    let resource = match ABI.device(device) {
        Ok(resource) => resource,
        Err(e) => {
            *reason = format!("vrampool_malloc: {e}");
            return 0;
        }
    };
    let stream = StreamId::canonical(stream as u64);
    resource.allocate(size as u64, stream).unwrap_or_else(|e| malloc_refused(resource, e, size, device, stream, reason))
}

/// Why the pool refused: the out-of-memory record (kept for `last_oom`) or the error's message.
#[cold]
#[inline(never)]
fn malloc_refused(resource: &DeviceResource, e: PoolError, size: usize, device: c_int, stream: StreamId, reason: &mut String) -> u64 {
    *reason = match resource.oom_record(&e, stream, size as u64) {
        Some(oom) => {
            let message = oom.message.clone();
            ABI.failures.record_oom(oom);
            message
        }
        None => format!("vrampool_malloc of {size} bytes on device {device}: {e}"),
    };
    0
}

/// The slow end of a failed allocation: counts and records it; under `raise_on_failure`, the
/// message of the exception to throw.
#[cold]
#[inline(never)]
fn malloc_failed(reason: String) -> Option<String> {
    let raise = ABI.raise_on_failure.load(Relaxed);
    if reason.is_empty() {
        // The guard caught a panic and recorded it already.
        ABI.failures.record(Failure::Malloc, None);
        return raise.then(|| "vrampool_malloc: internal error (see vrampool last_error)".to_string());
    }
    let text = raise.then(|| reason.clone());
    ABI.failures.record(Failure::Malloc, Some(reason));
    text
}

extern "C" {
    /// `csrc/malloc.c`: whether libstdc++ is loaded, so that a failed `vrampool_torch_malloc` can throw.
    pub(crate) fn vrampool_cxx_can_throw() -> c_int;
}

/// Writes `message` into `room` for C, NUL-terminated, without inner NULs, cut to fit.
fn to_c_message(message: &str, room: &mut [u8]) {
    let Some(last) = room.len().checked_sub(1) else { return };
    let mut len = 0;
    for b in message.bytes().filter(|&b| b != 0).take(last) {
        room[len] = b;
        len += 1;
    }
    room[len] = 0;
}

/// Allocates `size` bytes on `device` for use on `stream`. Null for 0 bytes, and on failure
/// (then `last_error`, and for out-of-memory `last_oom`, say why). Never throws: any caller may
/// use it.
#[no_mangle]
pub extern "C" fn vrampool_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    allocate_or_why(size, device, stream).unwrap_or_else(|reason| {
        malloc_failed(reason);
        null_mut()
    })
}

/// The block (null for 0 bytes), or why not (empty after a panic, which the guard recorded):
/// the cached lane first, then the guarded path.
#[inline(always)]
fn allocate_or_why(size: usize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, String> {
    if size == 0 {
        return Ok(null_mut());
    }
    if let Some(addr) = malloc_cached(size, device, stream) {
        return Ok(addr);
    }
    // `String::new()` allocates nothing.
    let mut reason = String::new();
    match try_malloc(size, device, stream, &mut reason) {
        0 => Err(reason),
        addr => Ok(addr as *mut c_void),
    }
}

/// A block from the cached lane (the thread's cache, or the steady arena's next step), where the
/// device's resource would take it from there. Outside the guard: that path calls nothing that can
/// panic (`MemoryResource::allocate_cached`), and the guard's frame is a third of the entry's cost.
#[inline(always)]
fn malloc_cached(size: usize, device: c_int, stream: *mut c_void) -> Option<*mut c_void> {
    let resource = ABI.devices.get(device)?;
    resource.allocate_cached(size as u64, StreamId::canonical(stream as u64)).map(|addr| addr as *mut c_void)
}

/// `vrampool_torch_malloc` (`csrc/malloc.c`, PyTorch's entry) without the throw: as
/// `vrampool_malloc`, and under `raise_on_failure` a failure also writes the message of the
/// exception that `vrampool_torch_malloc` then throws into `message` (`capacity` bytes).
#[no_mangle]
pub extern "C" fn vrampool_torch_malloc_or_message(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    message: *mut c_char,
    capacity: usize,
) -> *mut c_void {
    allocate_or_why(size, device, stream).unwrap_or_else(|reason| {
        if let Some(text) = malloc_failed(reason) {
            if !message.is_null() {
                // SAFETY: the C caller passes `message` with room for `capacity` bytes.
                let room = unsafe { std::slice::from_raw_parts_mut(message.cast::<u8>(), capacity) };
                to_c_message(&text, room);
            }
        }
        null_mut()
    })
}

/// Frees a block `vrampool_malloc` returned. Null is a no-op; `size` 0 means "not known"; a
/// pointer that is not a live block (double free, foreign pointer, wrong size) is refused and
/// recorded, never a crash.
#[no_mangle]
pub extern "C" fn vrampool_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let (addr, bytes, on) = (ptr as u64, (size != 0).then_some(size as u64), Some(StreamId::canonical(stream as u64)));
    // The cached path first, outside the guard, as in `malloc_cached`.
    let resource = ABI.devices.get(device);
    let cached = resource.map_or(CachedFree::Untouched, |r| r.free_cached(addr, bytes, on));
    if cached == CachedFree::Done {
        return;
    }
    guard("free", (), || {
        let Some(resource) = resource else {
            return free_refused(ptr, size, device, &format_args!("no vrampool pool on device {device}"));
        };
        let freed = match cached {
            CachedFree::Parked => resource.free_parked(addr, on),
            _ => resource.free(addr, bytes, on),
        };
        if let Err(e) = freed {
            free_refused(ptr, size, device, &e);
        }
    })
}

#[cold]
#[inline(never)]
fn free_refused(ptr: *mut c_void, size: usize, device: c_int, why: &dyn std::fmt::Display) {
    ABI.refuse(Failure::Free, format!("vrampool_free({ptr:p}, {size}, device {device}): refused: {why}"));
}

// ---- PyTorch's optional hooks ----

/// PyTorch's `init(device_count)`: reads the configuration, so that a bad `VRAMPOOL_CONF` is
/// reported before the first allocation. Pools are still made on first use.
#[no_mangle]
pub extern "C" fn vrampool_init(device_count: c_int) {
    guard("init", (), || {
        if let Err(e) = ABI.devices.config() {
            ABI.refuse(Failure::Other, format!("vrampool_init({device_count}): {e}"));
        }
    })
}

/// `torch.cuda.empty_cache()`: gives every wholly free segment of every pool back to the device.
#[no_mangle]
pub extern "C" fn vrampool_reset() {
    guard("reset", (), || {
        if let Err(e) = ABI.trim_all() {
            ABI.refuse(Failure::Other, format!("vrampool_reset: {e}"));
        }
    })
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`: caps what `device`'s pools
/// may reserve at `fraction` of the device's memory (0 allows nothing); out of [0, 1] is refused.
#[no_mangle]
pub extern "C" fn vrampool_memory_fraction(fraction: f64, device: c_int) {
    guard("memory_fraction", (), || {
        let result = if !(0.0..=1.0).contains(&fraction) {
            Err(format!("fraction must lie in [0, 1], got {fraction}"))
        } else {
            let limit = if fraction == 0.0 { Limit::Bytes(1) } else { Limit::Fraction(fraction) };
            ABI.device(device).map_err(|e| e.to_string()).and_then(|d| d.set_limit(Some(limit)).map_err(|e| e.to_string()))
        };
        if let Err(e) = result {
            ABI.refuse(Failure::Other, format!("vrampool_memory_fraction({fraction}, device {device}): {e}"));
        }
    })
}

/// PyTorch's `getBaseAllocation`: the start of the segment holding `ptr`, its size in `*size`;
/// null (and 0) when no pool holds `ptr`.
#[no_mangle]
pub extern "C" fn vrampool_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    guard("base_alloc", null_mut(), || {
        let addr = ptr as u64;
        let found = ABI.devices.entries().into_iter().find_map(|(_, device)| {
            device.snapshot().into_iter().map(|s| s.segment).find(|s| s.base <= addr && addr < s.base + s.size).map(|s| (s.base, s.size))
        });
        let (base, bytes) = found.unwrap_or_else(|| {
            ABI.refuse(Failure::Other, format!("vrampool_base_alloc({ptr:p}): not in any vrampool segment"));
            (0, 0)
        });
        if !size.is_null() {
            // SAFETY: the caller passes a pointer to a size_t (or null, skipped).
            unsafe { size.write(bytes as usize) };
        }
        base as *mut c_void
    })
}

/// `Tensor.record_stream(stream)`: the block at `ptr` is not reused, once freed, until the work
/// queued on `stream` before the free has completed. The call names no device: the block's is
/// the one that takes it.
#[no_mangle]
pub extern "C" fn vrampool_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guard("record_stream", (), || {
        let stream_id = StreamId::canonical(stream as u64);
        if !ABI.devices.entries().iter().any(|(_, d)| d.record_stream(ptr as u64, stream_id).is_ok()) {
            ABI.refuse(
                Failure::RecordStream,
                format!("vrampool_record_stream({ptr:p}, {stream:p}): refused: not a live block of any vrampool pool"),
            );
        }
    })
}

/// PyTorch's `beginAllocateToPool` (CUDA graph capture, private pools): allocations on `device`
/// go to the private pool `id` until `vrampool_end_allocate_to_pool`. The stream filter (a C++
/// `std::function`, passed by reference) cannot be called from here, so every allocation on the
/// device is routed meanwhile: safe (the pool's blocks are never reused outside it), at worst
/// wasteful for other streams' allocations during a capture.
#[no_mangle]
pub extern "C" fn vrampool_begin_allocate_to_pool(device: c_int, id: PoolId, _filter: *const c_void) {
    guard("begin_allocate_to_pool", (), || {
        if let Err(e) = ABI.device(device).map_err(|e| e.to_string()).and_then(|d| d.stack().begin(id).map_err(|e| e.to_string())) {
            ABI.refuse(Failure::Other, format!("vrampool_begin_allocate_to_pool(device {device}, ({}, {})): {e}", id.first, id.second));
        }
    })
}

/// PyTorch's `endAllocateToPool`: allocations stop going to the private pool `id`.
#[no_mangle]
pub extern "C" fn vrampool_end_allocate_to_pool(device: c_int, id: PoolId) {
    guard("end_allocate_to_pool", (), || {
        if !ABI.devices.get(device).is_some_and(|d| d.stack().end(id)) {
            ABI.refuse(
                Failure::Other,
                format!("vrampool_end_allocate_to_pool(device {device}, ({}, {})): no such open pool", id.first, id.second),
            );
        }
    })
}

/// PyTorch's `releasePool`: the private pool `id` gives its free memory back, and goes once its
/// last block is freed.
#[no_mangle]
pub extern "C" fn vrampool_release_pool(device: c_int, id: PoolId) {
    guard("release_pool", (), || {
        if !ABI.devices.get(device).is_some_and(|d| d.stack().release(id)) {
            ABI.refuse(Failure::Other, format!("vrampool_release_pool(device {device}, ({}, {})): no such pool", id.first, id.second));
        }
    })
}

// ---- vrampool's own entries ----

/// Sets the configuration (`VRAMPOOL_CONF`'s form; applied over it) before the first
/// allocation. 0 on success, -1 otherwise (see `vrampool_last_error`).
///
/// # Safety
/// `text` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn vrampool_configure(text: *const c_char) -> c_int {
    let text = if text.is_null() { String::new() } else { CStr::from_ptr(text).to_string_lossy().into_owned() };
    guard("configure", -1, || match ABI.devices.configure(&text) {
        Ok(_) => 0,
        Err(e) => {
            ABI.refuse(Failure::Other, format!("vrampool_configure: {e}"));
            -1
        }
    })
}

/// Copies the last error's message (NUL-terminated, cut to fit) into `buffer`; returns its full
/// length in bytes, 0 when there was none.
///
/// # Safety
/// `buffer` is null or points to `capacity` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrampool_last_error(buffer: *mut c_char, capacity: usize) -> usize {
    guard("last_error", 0, || {
        let message = ABI.failures.last_error().unwrap_or_default();
        if !buffer.is_null() && capacity > 0 {
            let n = message.len().min(capacity - 1);
            // SAFETY: the caller gives `capacity` writable bytes; n + 1 <= capacity.
            unsafe {
                ptr::copy_nonoverlapping(message.as_ptr(), buffer.cast::<u8>(), n);
                buffer.add(n).write(0);
            }
        }
        message.len()
    })
}

/// Turns the planned arena on (non-zero) or off for every device's allocations outside private
/// pools. On, each device's allocations are recorded per iteration (`vrampool_planned_step`)
/// and, once an iteration's sequence has been seen, served from one arena at planned offsets,
/// falling back to the pool on divergence. Off, an arena goes back once its buffers are freed.
#[no_mangle]
pub extern "C" fn vrampool_planned_enable(on: c_int) {
    guard("planned_enable", (), || ABI.set_planned(on != 0))
}

/// An iteration boundary on every device's planned arena; `key` is the signature of the next
/// iteration (e.g. a hash of the input shapes), whose plan is kept apart from other keys'.
#[no_mangle]
pub extern "C" fn vrampool_planned_step(key: u64) {
    guard("planned_step", (), || ABI.planned_step(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thrown_message_is_cut_to_fit_and_has_no_inner_nul() {
        let mut room = [0xffu8; 1024];
        to_c_message("out\0of memory", &mut room);
        assert_eq!(CStr::from_bytes_until_nul(&room).unwrap().to_str().unwrap(), "outof memory");
        to_c_message(&"x".repeat(5000), &mut room);
        assert_eq!(CStr::from_bytes_until_nul(&room).unwrap().to_bytes().len(), room.len() - 1);
        let mut tiny = [0xffu8; 1];
        to_c_message("oom", &mut tiny);
        assert_eq!(tiny, [0]);
        to_c_message("oom", &mut []);
    }

    #[test]
    fn a_guarded_panic_is_an_answer_and_a_record() {
        let panics = ABI.failures.count(Failure::Panic);
        assert_eq!(guard("unit", 7, || -> i32 { panic!("boom") }), 7);
        assert!(ABI.failures.last_error().unwrap().contains("vrampool_unit: internal error (panic): boom"));
        assert_eq!(ABI.failures.count(Failure::Panic), panics + 1);
        assert_eq!(guard("unit", 7, || 3), 3);
    }
}
