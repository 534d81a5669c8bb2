//! Sharing pool memory with other processes (issue 50): the exporter's side of a buffer, and
//! `NativeImporter`, which maps other processes' exports. The descriptors, their passing and
//! the rules live in `python/vrampool/ipc.py`.

use std::os::fd::IntoRawFd;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use vrampool_core::{Device, PoolError};
use vrampool_cuda::{CudaDevice, Handle};

use crate::errors::{to_py, InvalidFreeError};
use crate::resource::DeviceResource;

/// `NativeBuffer.ipc_export` and `NativePool.ipc_export_range`: `(handle, offset, size)`, the
/// handle a new file descriptor (the caller's to close) or a legacy IPC handle's 64 bytes.
/// Refused for a freed buffer, a closed or forked pool, and a pool made without `ipc:true`.
pub fn export(py: Python<'_>, resource: &DeviceResource, ptr: u64, size: u64, freed: bool, what: &str) -> PyResult<(Py<PyAny>, u64, u64)> {
    let pool = resource.pool();
    pool.check_process().map_err(to_py)?;
    if pool.is_closed() {
        return Err(to_py(PoolError::Closed));
    }
    if freed {
        return Err(InvalidFreeError::new_err(format!("{what} was freed: a freed buffer cannot be shared")));
    }
    if !pool.config().ipc {
        return Err(PyValueError::new_err(format!(
            "{what} is from a pool made without ipc=True: its memory cannot be shared with another process \
             (make the pool with DevicePool(device, ipc=True), or VRAMPOOL_CONF=ipc:true)"
        )));
    }
    let export = resource.export(ptr, size).map_err(to_py)?;
    let handle = match export.handle {
        Handle::Fd(fd) => fd.into_raw_fd().into_pyobject(py)?.into_any().unbind(),
        Handle::Legacy(bytes) => PyBytes::new(py, &bytes).into_any().unbind(),
    };
    Ok((handle, export.offset, export.size))
}

/// Maps other processes' exports on one CUDA device of this process.
#[pyclass(module = "vrampool._native", frozen)]
pub struct NativeImporter {
    device: CudaDevice,
}

#[pymethods]
impl NativeImporter {
    #[new]
    fn new(py: Python<'_>, ordinal: i32) -> PyResult<Self> {
        let device = crate::exit::detach(py, || CudaDevice::new(ordinal)).map_err(|e| to_py(e.into()))?;
        Ok(Self { device })
    }

    /// Maps the `size` bytes behind `fd` (the caller keeps it); the base address.
    fn open(&self, fd: i32, size: u64) -> PyResult<u64> {
        self.device.import(fd, size).map_err(|e| to_py(e.into()))
    }

    /// Opens the allocation behind a legacy IPC handle's 64 bytes; its base address and its size
    /// as the driver reports it.
    fn open_legacy(&self, handle: &[u8]) -> PyResult<(u64, u64)> {
        let handle: [u8; 64] =
            handle.try_into().map_err(|_| PyValueError::new_err(format!("a legacy IPC handle is 64 bytes, not {}", handle.len())))?;
        self.device.import_legacy(handle).map_err(|e| to_py(e.into()))
    }

    /// Waits for the device's work (an unmap waits for none) and unmaps an `open` or `open_legacy`.
    fn close(&self, base: u64) -> PyResult<()> {
        self.device.synchronize().and_then(|()| self.device.close_import(base)).map_err(|e| to_py(e.into()))
    }

    fn write(&self, ptr: u64, data: &[u8]) -> PyResult<()> {
        self.device.copy_to_device(ptr, data).map_err(|e| to_py(e.into()))
    }

    fn read<'py>(&self, py: Python<'py>, ptr: u64, nbytes: usize) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0; nbytes];
        self.device.copy_to_host(ptr, &mut out).map_err(|e| to_py(e.into()))?;
        Ok(PyBytes::new(py, &out))
    }

    /// Mappings still open.
    #[getter]
    fn open_count(&self) -> usize {
        self.device.open_imports()
    }
}

/// Whether this process was forked from one that used vrampool (whose CUDA state it cannot use).
#[pyfunction]
fn forked() -> bool {
    vrampool_core::fork::generation() != 0
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeImporter>()?;
    m.add_function(wrap_pyfunction!(forked, m)?)?;
    Ok(())
}
