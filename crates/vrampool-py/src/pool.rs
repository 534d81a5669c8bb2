//! `NativePool` and `NativeBuffer`: a core `Pool` and the blocks it hands to Python.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use vrampool_core::{BlockState, Device, Pool, PoolConfig, SimDevice, SimMode, StreamId};

use crate::errors::to_py;

/// A pool and, when it runs on the simulated device, that device (for tests and demos).
pub struct Shared {
    pool: Pool,
    sim: Option<Arc<SimDevice>>,
}

#[pyclass(module = "vrampool._native", frozen)]
pub struct NativePool {
    shared: Arc<Shared>,
}

#[pymethods]
impl NativePool {
    /// A pool on the simulated device of `capacity` bytes. `conf` is the text form of the
    /// configuration (`strategy:hybrid,limit:0.9`); `host_backed` picks real host memory
    /// (pointers can be written) over addresses only.
    #[new]
    #[pyo3(signature = (capacity, conf = "", host_backed = true, ordinal = 0))]
    fn new(capacity: u64, conf: &str, host_backed: bool, ordinal: i32) -> PyResult<Self> {
        let config = config_from(conf)?;
        if capacity == 0 {
            return Err(PyValueError::new_err("capacity must be positive"));
        }
        let mode = if host_backed { SimMode::HostBacked } else { SimMode::AddressOnly };
        let sim = Arc::new(SimDevice::new(capacity, mode).with_ordinal(ordinal));
        let pool = Pool::new(sim.clone() as Arc<dyn Device>, config).map_err(to_py)?;
        Ok(Self { shared: Arc::new(Shared { pool, sim: Some(sim) }) })
    }

    /// A pool on CUDA device `ordinal` (its primary context). Raises `DeviceError` when there is
    /// no driver or no such device.
    #[staticmethod]
    #[pyo3(signature = (ordinal, conf = ""))]
    fn cuda(py: Python<'_>, ordinal: i32, conf: &str) -> PyResult<Self> {
        let config = config_from(conf)?;
        let device = py.detach(|| vrampool_cuda::CudaDevice::new(ordinal)).map_err(|e| to_py(e.into()))?;
        let pool = Pool::new(Arc::new(device) as Arc<dyn Device>, config).map_err(to_py)?;
        Ok(Self { shared: Arc::new(Shared { pool, sim: None }) })
    }

    #[pyo3(signature = (nbytes, stream = 0))]
    fn allocate(&self, py: Python<'_>, nbytes: u64, stream: u64) -> PyResult<NativeBuffer> {
        let shared = &self.shared;
        let ptr = py.detach(|| shared.pool.allocate(nbytes, StreamId(stream))).map_err(to_py)?;
        Ok(NativeBuffer {
            shared: Arc::clone(shared),
            ptr,
            size: nbytes,
            stream,
            freed: AtomicBool::new(false),
        })
    }

    /// Frees a block by address (the buffer form is `NativeBuffer.free`).
    #[pyo3(signature = (ptr, size = None, stream = None))]
    fn free_ptr(&self, py: Python<'_>, ptr: u64, size: Option<u64>, stream: Option<u64>) -> PyResult<()> {
        let pool = &self.shared.pool;
        py.detach(|| pool.free(ptr, size, stream.map(StreamId))).map_err(to_py)
    }

    fn record_stream(&self, ptr: u64, stream: u64) -> PyResult<()> {
        self.shared.pool.record_stream(ptr, StreamId(stream)).map_err(to_py)
    }

    fn trim(&self, py: Python<'_>) -> PyResult<u64> {
        let pool = &self.shared.pool;
        py.detach(|| pool.trim()).map_err(to_py)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, value) in self.shared.pool.stats().to_pairs() {
            if value.fract() == 0.0 && !key.starts_with("fragmentation") && key != "reserved_per_allocated" {
                dict.set_item(key, value as u64)?;
            } else {
                dict.set_item(key, value)?;
            }
        }
        Ok(dict)
    }

    fn reset_peak_stats(&self) {
        self.shared.pool.reset_peak_stats();
    }

    /// Segments as dicts: stream, strategy, base, size, blocks (addr, size, state, requested).
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for seg in self.shared.pool.snapshot() {
            let blocks = PyList::empty(py);
            for (addr, size, state) in seg.blocks {
                let block = PyDict::new(py);
                block.set_item("addr", addr)?;
                block.set_item("size", size)?;
                let (name, requested) = match state {
                    BlockState::Active { requested } => ("active", requested),
                    BlockState::PendingFree => ("pending_free", 0),
                    BlockState::Cached => ("cached", 0),
                    BlockState::Free => ("free", 0),
                };
                block.set_item("state", name)?;
                block.set_item("requested", requested)?;
                blocks.append(block)?;
            }
            let d = PyDict::new(py);
            d.set_item("stream", seg.stream.0)?;
            d.set_item("strategy", seg.strategy)?;
            d.set_item("base", seg.base)?;
            d.set_item("size", seg.size)?;
            d.set_item("blocks", blocks)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// Live blocks as (addr, size, requested, stream) tuples.
    fn live_blocks(&self) -> Vec<(u64, u64, u64, u64)> {
        self.shared.pool.live_blocks().iter().map(|b| (b.addr, b.size, b.requested, b.stream.0)).collect()
    }

    /// Closes the pool; returns the blocks still live, as `live_blocks` does.
    fn close(&self) -> Vec<(u64, u64, u64, u64)> {
        self.shared.pool.close().iter().map(|b| (b.addr, b.size, b.requested, b.stream.0)).collect()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.shared.pool.is_closed()
    }

    #[getter]
    fn device(&self) -> i32 {
        self.shared.pool.device().ordinal()
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.shared.pool.capacity()
    }

    #[getter]
    fn strategy(&self) -> &'static str {
        self.shared.pool.config().strategy.name()
    }

    // ---- the simulated device, for tests and demos ----

    fn sim_write(&self, ptr: u64, data: &[u8]) -> PyResult<()> {
        self.sim()?.write(ptr, data).map_err(|e| to_py(e.into()))
    }

    fn sim_read<'py>(&self, py: Python<'py>, ptr: u64, nbytes: u64) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.sim()?.read(ptr, nbytes).map_err(|e| to_py(e.into()))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Makes the `n`-th device segment allocation from now fail.
    fn sim_fail_alloc_in(&self, n: u64) -> PyResult<()> {
        self.sim()?.fail_alloc_in(n);
        Ok(())
    }

    fn sim_set_auto_complete(&self, on: bool) -> PyResult<()> {
        self.sim()?.set_auto_complete(on);
        Ok(())
    }

    fn sim_complete_stream(&self, stream: u64) -> PyResult<()> {
        self.sim()?.complete_stream(StreamId(stream));
        Ok(())
    }

    /// The simulated device's counters: alloc_calls, free_calls, live_segments, used.
    fn sim_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.sim()?.counters();
        let d = PyDict::new(py);
        for (k, v) in [("alloc_calls", c.alloc_calls), ("free_calls", c.free_calls), ("live_segments", c.live_segments), ("used", c.used)] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

/// A configuration from its text form; keys the core does not know are errors here.
fn config_from(conf: &str) -> PyResult<PoolConfig> {
    let mut config = PoolConfig::default();
    let others = config.apply_text(conf).map_err(to_py)?;
    match others.first() {
        Some((key, _)) => Err(PyValueError::new_err(format!("unknown configuration key `{key}`"))),
        None => Ok(config),
    }
}

impl NativePool {
    fn sim(&self) -> PyResult<&SimDevice> {
        self.shared.sim.as_deref().ok_or_else(|| PyValueError::new_err("this pool is not on the simulated device"))
    }
}

/// A block of device memory, freed exactly once: by `free()`, or when collected.
#[pyclass(module = "vrampool._native", frozen, subclass)]
pub struct NativeBuffer {
    shared: Arc<Shared>,
    #[pyo3(get)]
    ptr: u64,
    #[pyo3(get)]
    size: u64,
    #[pyo3(get)]
    stream: u64,
    freed: AtomicBool,
}

#[pymethods]
impl NativeBuffer {
    /// Gives the block back to its pool; later calls do nothing. `stream`, when given, is the
    /// stream that used the block last.
    #[pyo3(signature = (stream = None))]
    fn free(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (pool, ptr, size) = (&self.shared.pool, self.ptr, self.size);
        py.detach(|| pool.free(ptr, Some(size), stream.map(StreamId))).map_err(to_py)
    }

    #[getter]
    fn freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    #[getter]
    fn device(&self) -> i32 {
        self.shared.pool.device().ordinal()
    }

    /// Whether `pool` is the pool this buffer came from.
    fn belongs_to(&self, pool: &NativePool) -> bool {
        Arc::ptr_eq(&self.shared, &pool.shared)
    }

    fn __repr__(&self) -> String {
        format!("DeviceBuffer(ptr={:#x}, size={}, device={}, stream={})", self.ptr, self.size, self.device(), self.stream)
    }
}

impl Drop for NativeBuffer {
    fn drop(&mut self) {
        if !self.freed.swap(true, Ordering::AcqRel) {
            // A closed pool refuses the free; its segments go back when the pool is dropped.
            let _ = self.shared.pool.free(self.ptr, Some(self.size), None);
        }
    }
}
