//! Trace replay for Python: trace rows in, one dict of figures per configuration out.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vrampool_core::replay::{self, PreparedTrace, ReplayReport, TraceBuffer};
use vrampool_core::PoolConfig;

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

/// Replays `(id, lower, upper, size, stream)` rows on the address-only simulated device once per
/// entry of `confs` (pool configurations in `VRAMPOOL_CONF` form, e.g. `strategy:hybrid`),
/// sampling up to `samples` timeline points each, the trace `repeat` times back to back. Returns
/// one dict per configuration.
#[pyfunction]
#[pyo3(signature = (rows, confs, samples = replay::DEFAULT_SAMPLES, repeat = 1))]
fn replay_trace<'py>(
    py: Python<'py>,
    rows: Vec<Row>,
    confs: Vec<String>,
    samples: usize,
    repeat: u64,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let configs = confs
        .iter()
        .map(|conf| {
            let mut config = PoolConfig::default();
            let others = config.apply_text(conf).map_err(value_error)?;
            match others.first() {
                Some((key, _)) => Err(value_error(format!("unknown pool setting `{key}` for a replay"))),
                None => Ok(config),
            }
        })
        .collect::<PyResult<Vec<_>>>()?;
    let buffers: Vec<TraceBuffer> = rows
        .into_iter()
        .map(|(id, lower, upper, size, stream)| TraceBuffer { id, lower, upper, size, stream })
        .collect();
    let reports: Vec<ReplayReport> = py
        .detach(|| {
            let prepared = PreparedTrace::new(&replay::events_from_buffers(&buffers)?)?;
            configs
                .into_iter()
                .map(|config| replay::replay_prepared_times(&prepared, config, samples, repeat))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(value_error)?;
    reports.iter().map(|r| report_dict(py, r)).collect()
}

fn report_dict<'py>(py: Python<'py>, r: &ReplayReport) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("strategy", r.strategy.name())?;
    out.set_item("peak_reserved_bytes", r.peak_reserved_bytes)?;
    out.set_item("peak_allocated_bytes", r.peak_allocated_bytes)?;
    out.set_item("lower_bound_bytes", r.lower_bound_bytes)?;
    out.set_item("events", r.events)?;
    out.set_item("seconds", r.seconds)?;
    out.set_item("events_per_s", r.events_per_s)?;
    out.set_item("device_allocs", r.device_allocs)?;
    out.set_item("fragmentation", r.fragmentation)?;
    // Columns rather than one dict a point: a third of the objects, and JSON-ready as is.
    let timeline = PyDict::new(py);
    timeline.set_item("event", r.timeline.iter().map(|p| p.event).collect::<Vec<_>>())?;
    timeline.set_item("allocated_bytes", r.timeline.iter().map(|p| p.allocated_bytes).collect::<Vec<_>>())?;
    timeline.set_item("reserved_bytes", r.timeline.iter().map(|p| p.reserved_bytes).collect::<Vec<_>>())?;
    out.set_item("timeline", timeline)?;
    Ok(out)
}
