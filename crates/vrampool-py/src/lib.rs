//! `vrampool._native`: the Python face of the core, kept thin. Python-level conveniences
//! (stream objects, DLPack, summaries) live in `python/vrampool/`.

mod ahead;
mod c_abi;
mod c_abi_py;
mod config;
mod errors;
mod exit;
mod figures;
mod ipc;
mod plan;
mod planned;
mod pool;
mod replay;
mod resource;

use pyo3::prelude::*;
use vrampool_core::StreamId;

/// The stream a `CUstream` handle names: `CU_STREAM_LEGACY` (1) is 0, the legacy default stream.
#[pyfunction]
fn canonical_stream(handle: u64) -> u64 {
    StreamId::canonical(handle).0
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(canonical_stream, m)?)?;
    errors::register(m)?;
    exit::register(m)?;
    ipc::register(m)?;
    c_abi_py::register(m)?;
    config::register(m)?;
    plan::register(m)?;
    ahead::register(m)?;
    replay::register(m)?;
    m.add_class::<pool::NativePool>()?;
    m.add_class::<pool::NativeBuffer>()?;
    m.add_class::<planned::NativePlannedPool>()?;
    Ok(())
}
