//! Atomics and `UnsafeCell` from std, or from loom when model checking (`RUSTFLAGS="--cfg loom"`).

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub use loom::cell::{MutPtr, UnsafeCell};

/// std's `UnsafeCell` behind loom's interface (`with_mut`, `get_mut`), so that loom can check
/// every access to the cell's value.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub fn get_mut(&self) -> MutPtr<T> {
        MutPtr(self.0.get())
    }
}

/// A pointer to an `UnsafeCell`'s value, as loom's `MutPtr` (which tracks the access while it
/// lives).
#[cfg(not(loom))]
pub struct MutPtr<T>(*mut T);

#[cfg(not(loom))]
impl<T> MutPtr<T> {
    /// # Safety
    ///
    /// No other reference to the value may be alive while the returned one is.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn deref(&self) -> &mut T {
        // SAFETY: the caller's promise.
        unsafe { &mut *self.0 }
    }
}

/// Spins once in a wait loop (loom must be told, or it would explore the loop forever).
#[inline]
pub fn spin_once() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}
