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
mod streams;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    streams::register(m)?;
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
