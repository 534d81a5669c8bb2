//! Atomics from std, or from loom when model checking (`RUSTFLAGS="--cfg loom"`).

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
