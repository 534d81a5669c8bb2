//! `NativePlannedPool`: the planned arena (`vrampool_steady::PlannedPool`) over a `NativePool`'s
//! resource, for `vrampool.PlannedPool`. Pointers cross as ints.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vrampool_core::sizes::MIN_BLOCK;
use vrampool_core::StreamId;
use vrampool_steady::PlannedPool;

use crate::errors::to_py;
use crate::pool::NativePool;
use crate::resource::DeviceResource;

/// The planned arena over a `NativePool`: `allocate` / `free` by pointer, `step(key)` between
/// iterations, `stats()`.
#[pyclass(module = "vrampool._native", frozen)]
pub struct NativePlannedPool {
    inner: PlannedPool<Arc<DeviceResource>>,
}

#[pymethods]
impl NativePlannedPool {
    /// Over `pool`; arena offsets are multiples of `alignment` (a power of two, at least 512),
    /// and each plan may search for `budget_ms` milliseconds.
    #[new]
    #[pyo3(signature = (pool, alignment = MIN_BLOCK, budget_ms = 10))]
    fn new(pool: Py<NativePool>, alignment: u64, budget_ms: u64) -> PyResult<Self> {
        if !alignment.is_power_of_two() || alignment < MIN_BLOCK {
            return Err(PyValueError::new_err(format!("alignment must be a power of two of at least {MIN_BLOCK}, got {alignment}")));
        }
        let inner = PlannedPool::with_budget(pool.get().resource(), Duration::from_millis(budget_ms)).with_alignment(alignment);
        Ok(Self { inner })
    }

    #[pyo3(signature = (nbytes, stream = 0))]
    fn allocate(&self, nbytes: u64, stream: u64) -> PyResult<u64> {
        // With the GIL held, as `NativePool`'s short calls are (see `NativePool::allocate`).
        self.inner.allocate(nbytes, StreamId(stream)).map_err(to_py)
    }

    #[pyo3(signature = (ptr, size = None, stream = None))]
    fn free(&self, ptr: u64, size: Option<u64>, stream: Option<u64>) -> PyResult<()> {
        self.inner.free(ptr, size, stream.map(StreamId)).map_err(to_py)
    }

    fn record_stream(&self, ptr: u64, stream: u64) -> PyResult<()> {
        self.inner.record_stream(ptr, StreamId(stream)).map_err(to_py)
    }

    /// Detached: a step may plan the iteration just recorded, for up to the budget.
    fn step(&self, py: Python<'_>, key: u64) -> PyResult<()> {
        let inner = &self.inner;
        crate::exit::detach(py, || inner.step(key)).map_err(to_py)
    }

    fn owns(&self, ptr: u64) -> bool {
        self.inner.owns(ptr)
    }

    /// Gives the arena back to the pool unless arena buffers are live; returns the bytes.
    fn release_idle_arena(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = &self.inner;
        crate::exit::detach(py, || inner.release_idle_arena()).map_err(to_py)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::figures::planned_stats_dict(py, &self.inner.stats().map_err(to_py)?)
    }
}
