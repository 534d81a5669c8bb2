//! `NativePlannedPool`: the planned arena (`vrampool_plan::PlannedPool`) over a `NativePool`, for
//! `vrampool.PlannedPool`. Pointers cross as ints.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use vrampool_core::sizes::MIN_BLOCK;
use vrampool_core::{DeviceError, PoolError, StreamId};
use vrampool_plan::{Backing, PlannedPool, PlannedStats};

use crate::errors::to_py;
use crate::pool::NativePool;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A `NativePool` reached through its Python methods (its core pool is private to it). It keeps the
/// `NativeBuffer` of each block it holds, since a collected buffer frees its block.
struct PoolObject {
    pool: Py<NativePool>,
    buffers: Mutex<HashMap<u64, Py<PyAny>>>,
    alignment: u64,
    /// The Python exception behind the last failed call, raised as it is rather than as its text.
    error: Mutex<Option<PyErr>>,
}

impl PoolObject {
    fn call<T>(&self, body: impl FnOnce(Python<'_>) -> PyResult<T>) -> Result<T, PoolError> {
        Python::attach(body).map_err(|e| {
            let message = e.to_string();
            *lock(&self.error) = Some(e);
            PoolError::Device(DeviceError::Driver(message))
        })
    }

    /// The Python exception for a failed planned-pool call: the pool's own when it raised one.
    fn to_py(&self, err: PoolError) -> PyErr {
        match (&err, lock(&self.error).take()) {
            (PoolError::Device(_), Some(raised)) => raised,
            _ => to_py(err),
        }
    }
}

impl Backing for PoolObject {
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        self.call(|py| {
            let buffer = self.pool.bind(py).call_method1("allocate", (size, stream.0))?;
            let ptr: u64 = buffer.getattr("ptr")?.extract()?;
            lock(&self.buffers).insert(ptr, buffer.unbind());
            Ok(ptr)
        })
    }

    fn free(&self, addr: u64, _size: u64, stream: Option<StreamId>) -> Result<(), PoolError> {
        let Some(buffer) = lock(&self.buffers).remove(&addr) else {
            let reason = vrampool_core::InvalidFreeReason::NotAllocated;
            return Err(PoolError::InvalidFree { ptr: addr, reason });
        };
        self.call(|py| match buffer.bind(py).call_method1("free", (stream.map(|s| s.0),)) {
            Ok(_) => Ok(()),
            Err(e) => {
                lock(&self.buffers).insert(addr, buffer.clone_ref(py));
                Err(e)
            }
        })
    }

    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        self.call(|py| self.pool.bind(py).call_method1("record_stream", (addr, stream.0)).map(drop))
    }

    fn trim(&self) -> Result<u64, PoolError> {
        self.call(|py| self.pool.bind(py).call_method0("trim")?.extract())
    }

    fn alignment(&self) -> u64 {
        self.alignment
    }
}

/// The planned arena over a `NativePool`: `allocate` / `free` by pointer, `step(key)` between
/// iterations, `stats()`.
#[pyclass(module = "vrampool._native", frozen)]
pub struct NativePlannedPool {
    inner: PlannedPool<PoolObject>,
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
        let backing = PoolObject { pool, buffers: Mutex::default(), alignment, error: Mutex::default() };
        Ok(Self { inner: PlannedPool::with_budget(backing, Duration::from_millis(budget_ms)) })
    }

    #[pyo3(signature = (nbytes, stream = 0))]
    fn allocate(&self, py: Python<'_>, nbytes: u64, stream: u64) -> PyResult<u64> {
        // Detached: the planned pool's lock is never waited for while holding the GIL, which its pool
        // calls take.
        let inner = &self.inner;
        py.detach(|| inner.allocate(nbytes, StreamId(stream))).map_err(|e| inner.backing().to_py(e))
    }

    #[pyo3(signature = (ptr, size = None, stream = None))]
    fn free(&self, py: Python<'_>, ptr: u64, size: Option<u64>, stream: Option<u64>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.free(ptr, size, stream.map(StreamId))).map_err(|e| inner.backing().to_py(e))
    }

    fn record_stream(&self, py: Python<'_>, ptr: u64, stream: u64) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.record_stream(ptr, StreamId(stream))).map_err(|e| inner.backing().to_py(e))
    }

    fn step(&self, py: Python<'_>, key: u64) {
        let inner = &self.inner;
        py.detach(|| inner.step(key));
    }

    fn owns(&self, py: Python<'_>, ptr: u64) -> bool {
        let inner = &self.inner;
        py.detach(|| inner.owns(ptr))
    }

    /// Gives the arena back to the pool unless arena buffers are live; returns the bytes.
    fn release_idle_arena(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = &self.inner;
        py.detach(|| inner.release_idle_arena()).map_err(|e| inner.backing().to_py(e))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = &self.inner;
        let stats = py.detach(|| inner.stats());
        planned_stats_dict(py, &stats)
    }
}

/// The planned arena's figures: counts, `arena_bytes`, and `plans`, one dict per key.
pub(crate) fn planned_stats_dict<'py>(py: Python<'py>, stats: &PlannedStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("planned_allocations", stats.planned_allocations)?;
    d.set_item("dynamic_allocations", stats.dynamic_allocations)?;
    d.set_item("fallbacks", stats.fallbacks)?;
    d.set_item("recorded_iterations", stats.recorded_iterations)?;
    d.set_item("replayed_iterations", stats.replayed_iterations)?;
    d.set_item("arena_bytes", stats.arena_bytes)?;
    d.set_item("arena_live", stats.arena_live)?;
    let plans = PyList::empty(py);
    for p in &stats.plans {
        let plan = PyDict::new(py);
        plan.set_item("key", p.key)?;
        plan.set_item("arena_bytes", p.arena_bytes)?;
        plan.set_item("lower_bound_bytes", p.lower_bound_bytes)?;
        plan.set_item("arena_buffers", p.arena_buffers)?;
        plan.set_item("dynamic_buffers", p.dynamic_buffers)?;
        plan.set_item("events", p.events)?;
        plans.append(plan)?;
    }
    d.set_item("plans", plans)?;
    Ok(d)
}
