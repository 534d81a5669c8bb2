//! Trace replay for Python: trace rows in, one dict of figures per strategy out.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vrampool_core::replay::{self, ReplayReport, TraceBuffer};
use vrampool_core::{PoolConfig, StrategyKind};

/// `(id, lower, upper, size, stream)`.
type Row = (u64, u64, u64, u64, u64);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_trace_csv, m)?)?;
    m.add_function(wrap_pyfunction!(replay_trace, m)?)?;
    Ok(())
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Rows `(id, lower, upper, size, stream)` of a trace CSV text (`id,lower,upper,size[,stream]`);
/// errors name the line.
#[pyfunction]
fn read_trace_csv(text: &str) -> PyResult<Vec<Row>> {
    let buffers = replay::read_trace_csv(text).map_err(value_error)?;
    Ok(buffers.iter().map(|b| (b.id, b.lower, b.upper, b.size, b.stream)).collect())
}

/// Replays `(id, lower, upper, size, stream)` rows through `strategy` (a name, or `all`) on the
/// address-only simulated device; `conf` is extra pool configuration in `VRAMPOOL_CONF` form.
/// Returns one dict a strategy.
#[pyfunction]
#[pyo3(signature = (rows, strategy = "hybrid", conf = ""))]
fn replay_trace<'py>(
    py: Python<'py>,
    rows: Vec<Row>,
    strategy: &str,
    conf: &str,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let mut config = PoolConfig::default();
    let others = config.apply_text(conf).map_err(value_error)?;
    if let Some((key, _)) = others.first() {
        return Err(value_error(format!("unknown pool setting `{key}` for a replay")));
    }
    let strategies: Vec<StrategyKind> = if strategy.eq_ignore_ascii_case("all") {
        replay::ALL_STRATEGIES.to_vec()
    } else {
        vec![StrategyKind::parse(strategy).ok_or_else(|| {
            value_error(format!("unknown strategy `{strategy}` (slab, best_fit, buddy, hybrid or all)"))
        })?]
    };
    let buffers: Vec<TraceBuffer> = rows
        .into_iter()
        .map(|(id, lower, upper, size, stream)| TraceBuffer { id, lower, upper, size, stream })
        .collect();
    let reports: Vec<ReplayReport> = py
        .detach(|| {
            let events = replay::events_from_buffers(&buffers)?;
            strategies
                .iter()
                .map(|&strategy| replay::replay(&events, PoolConfig { strategy, ..config.clone() }))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(value_error)?;
    reports
        .iter()
        .map(|r| {
            let out = PyDict::new(py);
            out.set_item("strategy", r.strategy.name())?;
            out.set_item("peak_reserved_bytes", r.peak_reserved_bytes)?;
            out.set_item("peak_allocated_bytes", r.peak_allocated_bytes)?;
            out.set_item("lower_bound_bytes", r.lower_bound_bytes)?;
            out.set_item("events", r.events)?;
            out.set_item("seconds", r.seconds)?;
            out.set_item("events_per_s", r.events_per_s)?;
            out.set_item("device_allocs", r.device_allocs)?;
            Ok(out)
        })
        .collect()
}
