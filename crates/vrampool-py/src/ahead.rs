//! Plans made ahead at a step's largest shape (`vrampool_steady::AheadPlan`): made, checked, and
//! set on a `NativePool` or on a device of the C ABI. A step is rows `(stream, size, lower, upper)`
//! in the order of its allocations; a plan, their offsets.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use vrampool_core::StreamId;
use vrampool_steady::{AheadBuffer, AheadPlan};

use crate::c_abi::ABI;
use crate::errors::to_py;

/// A step's buffer: (stream, size, lower, upper), live on `[lower, upper)`.
pub(crate) type StepRow = (u64, u64, u64, u64);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_ahead, m)?)?;
    m.add_function(wrap_pyfunction!(check_ahead, m)?)?;
    m.add_function(wrap_pyfunction!(abi_set_ahead, m)?)?;
    Ok(())
}

fn buffers_of(rows: &[StepRow]) -> Vec<AheadBuffer> {
    rows.iter().map(|&(stream, size, lower, upper)| AheadBuffer::new(StreamId::canonical(stream), size, lower, upper)).collect()
}

/// The plan of `rows` at `offsets`, the first `first` serving the first step alone, checked; a
/// `ValueError` that says why when it is refused.
pub(crate) fn ahead_plan(rows: &[StepRow], offsets: &[u64], alignment: u64, first: usize) -> PyResult<Arc<AheadPlan>> {
    AheadPlan::with_offsets(&buffers_of(rows), offsets, alignment)
        .and_then(|plan| plan.with_first_step(first))
        .map(Arc::new)
        .map_err(|e| PyValueError::new_err(format!("not a valid plan: {e}")))
}

/// Plans a step (rows in the order of its allocations) into a region per stream at `alignment`,
/// each searched for at most `budget_ms`; returns the offsets.
#[pyfunction]
#[pyo3(signature = (rows, alignment = 512, budget_ms = 100))]
fn plan_ahead(py: Python<'_>, rows: Vec<StepRow>, alignment: u64, budget_ms: u64) -> PyResult<Vec<u64>> {
    let buffers = buffers_of(&rows);
    let plan = crate::exit::detach(py, || AheadPlan::plan(&buffers, alignment, Duration::from_millis(budget_ms)))
        .map_err(|e| PyValueError::new_err(format!("cannot plan the step: {e}")))?;
    Ok(plan.offsets().to_vec())
}

/// Checks a plan (read from a file): `(arena_bytes, lower_bound_bytes)`, or a `ValueError` that says
/// which buffers share a byte, or which offset is misaligned.
#[pyfunction]
#[pyo3(signature = (rows, offsets, alignment = 512, first = 0))]
fn check_ahead(rows: Vec<StepRow>, offsets: Vec<u64>, alignment: u64, first: usize) -> PyResult<(u64, u64)> {
    let plan = ahead_plan(&rows, &offsets, alignment, first)?;
    Ok((plan.arena_bytes(), plan.lower_bound_bytes()))
}

/// Sets a plan (None: none) on the C ABI's pool of `device` (made now if it is not yet).
#[pyfunction]
#[pyo3(signature = (device, rows, offsets, alignment = 512, first = 0))]
fn abi_set_ahead(device: i32, rows: Option<Vec<StepRow>>, offsets: Option<Vec<u64>>, alignment: u64, first: usize) -> PyResult<()> {
    let plan = match (rows, offsets) {
        (Some(rows), Some(offsets)) => Some(ahead_plan(&rows, &offsets, alignment, first)?),
        (None, None) => None,
        _ => return Err(PyValueError::new_err("rows and offsets come together")),
    };
    let resource = ABI.device(device).map_err(|e| PyValueError::new_err(e.to_string()))?;
    resource.planned().planned().set_ahead(plan).map_err(to_py)
}
