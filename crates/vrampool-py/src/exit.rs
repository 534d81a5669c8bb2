//! Native calls that release the GIL, made safe at interpreter exit.
//!
//! Before 3.14, CPython ends a thread that takes the GIL back while the interpreter finalizes
//! (a daemon thread) with `pthread_exit`: a forced unwind through the Rust frames of the call
//! that released it. The wheel links its own unwinder (zig's libunwind), not the one
//! `pthread_exit` starts (libgcc's), and the process dies of SIGSEGV. So [`detach`] never takes
//! the GIL back once the exit began: an `atexit` hook, which CPython runs before it starts to
//! finalize, marks the exit and waits (without the GIL) for the threads already taking it back;
//! a call that ends after the mark parks its thread for good, as CPython 3.14 parks such
//! threads, and a call that starts after it keeps the GIL.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use pyo3::prelude::*;

static EXITING: AtomicBool = AtomicBool::new(false);
/// Threads between the end of a detached call and the GIL taken back. Sequentially consistent
/// with `EXITING` (each side writes its own, then reads the other's): either the thread sees
/// the mark and parks, or the hook sees the thread and waits for it.
static RETURNING: AtomicUsize = AtomicUsize::new(0);

/// `py.detach(f)`, except at interpreter exit (see the module documentation).
pub(crate) fn detach<T: Send, F: Send + FnOnce() -> T>(py: Python<'_>, f: F) -> T {
    if EXITING.load(SeqCst) {
        return f();
    }
    let out = py.detach(|| {
        let out = f();
        RETURNING.fetch_add(1, SeqCst);
        if EXITING.load(SeqCst) {
            RETURNING.fetch_sub(1, SeqCst);
            loop {
                std::thread::park();
            }
        }
        out
    });
    RETURNING.fetch_sub(1, SeqCst);
    out
}

/// The `atexit` hook: marks the exit, then waits for the threads taking the GIL back.
#[pyfunction]
fn mark_exit(py: Python<'_>) {
    EXITING.store(true, SeqCst);
    py.detach(|| {
        while RETURNING.load(SeqCst) > 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    });
}

/// A forked child has none of its parent's other threads, so none of them is taking the GIL back.
#[pyfunction]
fn forget_returning() {
    RETURNING.store(0, SeqCst);
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    py.import("atexit")?.call_method1("register", (wrap_pyfunction!(mark_exit, m)?,))?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("after_in_child", wrap_pyfunction!(forget_returning, m)?)?;
    py.import("os")?.call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}
