//! Page-locked host memory (`cuMemHostAlloc`) for a pause's backup: copies between it and the
//! device run at the bus's full speed, where pageable memory is staged through the driver's own
//! buffers.

use vrampool_core::device::{pageable_host_buffer, DeviceResult, HostBuffer};

use crate::calls;
use crate::driver::CurrentContext;

/// `len` bytes of page-locked memory in `context`, or pageable memory where the driver cannot
/// lock that much (the backup still works, more slowly).
pub(super) fn host_buffer(context: u64, len: usize) -> DeviceResult<Box<dyn HostBuffer>> {
    if len == 0 {
        return pageable_host_buffer(0);
    }
    let locked = CurrentContext::enter(context).and_then(|_current| calls::mem_host_alloc(len));
    match locked {
        Ok(ptr) => Ok(Box::new(Pinned { ptr, len, context })),
        Err(_) => pageable_host_buffer(len),
    }
}

/// Memory from `cuMemHostAlloc`, owned: freed once, when dropped.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    context: u64,
}

// SAFETY: the buffer is owned and reached only through `&self` / `&mut self`; the driver lets any
// thread use and free page-locked memory.
unsafe impl Send for Pinned {}

impl HostBuffer for Pinned {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes the driver gave us and that live until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The pool drops a backup before its device (`PoolCore`'s drop), so the context is held.
        if let Ok(_current) = CurrentContext::enter(self.context) {
            // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed here only.
            let _ = unsafe { calls::mem_free_host(self.ptr) };
        }
    }
}
