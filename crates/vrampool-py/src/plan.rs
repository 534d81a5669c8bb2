//! The static planner for Python: buffers in, offsets and figures out.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vrampool_plan::{Algorithm, Buffer, Decision, Plan, PlanOptions};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(decide_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(read_buffers_csv, m)?)?;
    m.add_function(wrap_pyfunction!(plan_to_csv, m)?)?;
    Ok(())
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn buffers_of(rows: Vec<(u64, u64, u64, u64)>) -> Vec<Buffer> {
    rows.into_iter().map(|(id, lower, upper, size)| Buffer::new(id, lower, upper, size)).collect()
}

fn options_of(algorithm: &str, budget_ms: u64, alignment: u64) -> PyResult<PlanOptions> {
    let algorithm: Algorithm = algorithm.parse().map_err(value_error)?;
    Ok(PlanOptions { algorithm, budget: Duration::from_millis(budget_ms), alignment })
}

/// Plans `(id, lower, upper, size)` rows into one arena; returns a dict with `offsets`,
/// `arena_bytes`, `lower_bound_bytes`, `best_bound_bytes`, `algorithm`, `seconds`, `optimal`.
#[pyfunction]
#[pyo3(signature = (rows, algorithm = "auto", budget_ms = 5000, alignment = 1))]
fn plan_buffers<'py>(
    py: Python<'py>,
    rows: Vec<(u64, u64, u64, u64)>,
    algorithm: &str,
    budget_ms: u64,
    alignment: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let options = options_of(algorithm, budget_ms, alignment)?;
    let buffers = buffers_of(rows);
    let plan: Plan = crate::exit::detach(py, || vrampool_plan::plan(&buffers, &options)).map_err(value_error)?;
    plan_dict(py, plan)
}

/// Whether the rows fit in `capacity` bytes: a dict with `status` (`fits`, `infeasible` or
/// `unknown`) and, when they fit, the plan's keys as `plan_buffers` gives them.
#[pyfunction]
#[pyo3(signature = (rows, capacity, algorithm = "auto", budget_ms = 5000, alignment = 1))]
fn decide_buffers<'py>(
    py: Python<'py>,
    rows: Vec<(u64, u64, u64, u64)>,
    capacity: u64,
    algorithm: &str,
    budget_ms: u64,
    alignment: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let options = options_of(algorithm, budget_ms, alignment)?;
    let buffers = buffers_of(rows);
    let decision = crate::exit::detach(py, || vrampool_plan::decide(&buffers, capacity, &options)).map_err(value_error)?;
    let (status, plan) = match decision {
        Decision::Fits(plan) => ("fits", Some(plan)),
        Decision::Infeasible => ("infeasible", None),
        Decision::Unknown => ("unknown", None),
    };
    let out = match plan {
        Some(plan) => plan_dict(py, plan)?,
        None => PyDict::new(py),
    };
    out.set_item("status", status)?;
    Ok(out)
}

fn plan_dict(py: Python<'_>, plan: Plan) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("offsets", plan.offsets)?;
    out.set_item("arena_bytes", plan.arena_bytes)?;
    out.set_item("lower_bound_bytes", plan.lower_bound_bytes)?;
    out.set_item("best_bound_bytes", plan.best_bound_bytes)?;
    out.set_item("algorithm", plan.algorithm.name())?;
    out.set_item("seconds", plan.seconds)?;
    out.set_item("optimal", plan.optimal)?;
    Ok(out)
}

/// Rows `(id, lower, upper, size)` of a MiniMalloc-format CSV text (errors name the line).
#[pyfunction]
fn read_buffers_csv(text: &str) -> PyResult<Vec<(u64, u64, u64, u64)>> {
    let buffers = vrampool_plan::read_csv(text.as_bytes()).map_err(value_error)?;
    Ok(buffers.iter().map(|b| (b.id, b.lower, b.upper, b.size)).collect())
}

/// MiniMalloc's output format, `id,lower,upper,size,offset`, after checking the plan.
#[pyfunction]
#[pyo3(signature = (rows, offsets, alignment = 1))]
fn plan_to_csv(rows: Vec<(u64, u64, u64, u64)>, offsets: Vec<u64>, alignment: u64) -> PyResult<String> {
    let buffers = buffers_of(rows);
    let arena_bytes = vrampool_plan::validate(&buffers, &offsets, alignment).map_err(value_error)?;
    let plan = Plan {
        offsets,
        arena_bytes,
        lower_bound_bytes: vrampool_plan::lower_bound(&buffers),
        best_bound_bytes: vrampool_plan::lower_bound(&buffers),
        algorithm: Algorithm::Auto,
        seconds: 0.0,
        optimal: false,
    };
    let mut out = Vec::new();
    vrampool_plan::write_plan_csv(&mut out, &buffers, &plan.offsets).map_err(value_error)?;
    String::from_utf8(out).map_err(value_error)
}
