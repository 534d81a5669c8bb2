//! Python exceptions for the core's errors: `MemoryError` for OOM, `ValueError` for bad input.

use pyo3::create_exception;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use vrampool_core::PoolError;

create_exception!(vrampool, OutOfMemoryError, PyMemoryError, "The pool could not get the memory, even after giving back its cache.");
create_exception!(
    vrampool,
    InvalidFreeError,
    PyValueError,
    "A free of a pointer that is not a live block of this pool (double free, foreign pointer, wrong size)."
);
create_exception!(
    vrampool,
    InvalidSizeError,
    PyValueError,
    "A size of zero, or past one block's 128 TiB (more than the device or the limit holds is an OutOfMemoryError)."
);
create_exception!(vrampool, WrongDeviceError, PyValueError, "A call that names another device than the pool's.");
create_exception!(vrampool, PoolClosedError, PyRuntimeError, "A call on a pool that was closed.");
create_exception!(vrampool, DeviceError, PyRuntimeError, "The device (driver or simulator) failed.");
create_exception!(
    vrampool,
    PauseError,
    PyRuntimeError,
    "Memory that cannot be paused (no virtual-memory mapping, a pool shared with other processes, an unknown tag)."
);
create_exception!(
    vrampool,
    PausedError,
    PauseError,
    "An allocation in a paused tag, or a pause or resume that could not finish (the message says what state the memory is in)."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("InvalidFreeError", py.get_type::<InvalidFreeError>())?;
    m.add("InvalidSizeError", py.get_type::<InvalidSizeError>())?;
    m.add("WrongDeviceError", py.get_type::<WrongDeviceError>())?;
    m.add("PoolClosedError", py.get_type::<PoolClosedError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("PauseError", py.get_type::<PauseError>())?;
    m.add("PausedError", py.get_type::<PausedError>())?;
    Ok(())
}

/// The Python exception for a core error.
pub fn to_py(err: PoolError) -> PyErr {
    let msg = err.to_string();
    match err {
        PoolError::OutOfMemory(_) => OutOfMemoryError::new_err(msg),
        PoolError::InvalidFree { .. } => InvalidFreeError::new_err(msg),
        PoolError::InvalidSize { .. } => InvalidSizeError::new_err(msg),
        PoolError::WrongDevice { .. } => WrongDeviceError::new_err(msg),
        PoolError::Closed | PoolError::Forked => PoolClosedError::new_err(msg),
        PoolError::InvalidConfig(_) => PyValueError::new_err(msg),
        PoolError::Device(_) => DeviceError::new_err(msg),
        PoolError::Paused(_) => PausedError::new_err(msg),
        PoolError::CannotPause(_) => PauseError::new_err(msg),
    }
}
