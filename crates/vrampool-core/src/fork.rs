//! Pools across `fork()`: the child gets a copy of the parent's memory with one thread, so a
//! lock another thread held at the fork stays held for good, and the caches of threads that no
//! longer exist stay claimed in the middle of a call. A pool made before a fork therefore
//! refuses every call in the child (`PoolError::Forked`), as PyTorch marks CUDA unusable in a
//! forked child, and a pool made in the child works as usual.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How many forks lie between the first pool's process and this one.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Which process generation this is; watching for forks from the first call on.
pub fn generation() -> u64 {
    #[cfg(unix)]
    {
        static WATCH: std::sync::Once = std::sync::Once::new();
        // SAFETY: `in_child` is async-signal-safe (an atomic add and two thread-local stores),
        // as a handler that runs in a forked child must be.
        WATCH.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
    }
    FORKS.load(Relaxed)
}

/// Whether this process is no longer the one whose generation is `generation`.
#[inline]
pub fn forked_since(generation: u64) -> bool {
    FORKS.load(Relaxed) != generation
}

#[cfg(unix)]
extern "C" fn in_child() {
    FORKS.fetch_add(1, Relaxed);
    crate::thread_cache::forget_after_fork();
}
