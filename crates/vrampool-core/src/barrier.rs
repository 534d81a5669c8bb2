//! An asymmetric memory barrier: `light` for the fast path, which costs nothing at run time, and
//! `heavy` for the slow path, which makes every running thread of the process execute a full
//! barrier (Linux's `membarrier`, private expedited). A `light` on one thread and a `heavy` on
//! another then order a store before a load on each side, as two `fence(SeqCst)` would: each
//! side's load sees the other's store, or the other side's load sees its own (Dekker's pattern).
//!
//! `available` says whether `heavy` works here; callers must not rely on the pair where it does
//! not (a kernel before 4.14, or a sandbox that refuses the call). Under loom and Miri, and on
//! other systems, both are `fence(SeqCst)`.

use crate::sync::Ordering::SeqCst;

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
mod imp {
    use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};
    use std::sync::OnceLock;

    #[inline(always)]
    pub fn light() {
        // Only the compiler is kept from moving accesses across it; the CPU's reordering is
        // what `heavy` rules out, from the other side.
        std::sync::atomic::compiler_fence(super::SeqCst);
    }

    pub fn heavy() -> bool {
        available() && membarrier(MembarrierCommand::PrivateExpedited).is_ok()
    }

    pub fn available() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| {
            membarrier_query().contains_command(MembarrierCommand::PrivateExpedited)
                && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        })
    }
}

#[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
mod imp {
    #[cfg(loom)]
    use loom::sync::atomic::fence;
    #[cfg(not(loom))]
    use std::sync::atomic::fence;

    #[inline(always)]
    pub fn light() {
        fence(super::SeqCst);
    }

    pub fn heavy() -> bool {
        fence(super::SeqCst);
        true
    }

    pub fn available() -> bool {
        true
    }
}

/// The fast path's half of the pair.
#[inline(always)]
pub fn light() {
    imp::light();
}

/// The slow path's half of the pair; false when it could not be made (then nothing may rely on
/// it).
pub fn heavy() -> bool {
    imp::heavy()
}

/// Whether `heavy` works in this process.
pub fn available() -> bool {
    imp::available()
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn the_heavy_barrier_works_where_it_is_available() {
        assert!(!super::available() || super::heavy());
    }
}
