//! Stream arguments: `vrampool.streams` reads every library's stream objects in Python and hands its reader to
//! the native layer at import (`set_stream_reader`), so that a buffer's `free(stream)` converts a stream as
//! `DevicePool.allocate` does, without the native layer importing the package back.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use vrampool_core::StreamId;

static READER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The stream a `CUstream` handle names: `CU_STREAM_LEGACY` (1) is 0, the legacy default stream.
#[pyfunction]
fn canonical_stream(handle: u64) -> u64 {
    StreamId::canonical(handle).0
}

/// Sets the function that turns a stream object into its handle (`vrampool.streams.stream_handle`); the
/// first call sets it, later ones (a reloaded module) keep it.
#[pyfunction]
fn set_stream_reader(py: Python<'_>, reader: Py<PyAny>) {
    let _ = READER.set(py, reader);
}

/// The handle of a stream argument, as the reader takes it (refusing bad ones with `TypeError` /
/// `ValueError`); None for none.
pub(crate) fn stream_arg(py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match stream {
        Some(s) if !s.is_none() => {
            let reader = READER.get(py).ok_or_else(|| PyRuntimeError::new_err("import vrampool to read streams"))?;
            Ok(Some(reader.call1(py, (s,))?.extract(py)?))
        }
        _ => Ok(None),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(canonical_stream, m)?)?;
    m.add_function(wrap_pyfunction!(set_stream_reader, m)?)?;
    Ok(())
}
