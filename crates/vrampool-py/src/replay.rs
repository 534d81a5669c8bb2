//! Trace replay for Python: trace rows in, one dict of figures per pool configuration or
//! allocator model out.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vrampool_core::peers::PeerConfig;
use vrampool_core::replay::{self, PreparedTrace, ReplayOptions, ReplayReport, ReplayTarget, TraceBuffer};
use vrampool_core::PoolConfig;

/// `(id, lower, upper, size, stream)`.
type Row = (u64, u64, u64, u64, u64);

/// What `replay_trace` calls the pool (its configuration text follows).
const POOL: &str = "pool";

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_trace_csv, m)?)?;
    m.add_function(wrap_pyfunction!(replay_trace, m)?)?;
    m.add_function(wrap_pyfunction!(allocator_options, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add("ALLOCATOR_MODELS", vrampool_core::peers::PEER_NAMES.to_vec())?;
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

/// Bytes from a size text: `1024`, `64KB`, `1.5MiB`, `80GB` (units are binary, as PyTorch's are).
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    vrampool_core::config::parse_bytes(text).map_err(value_error)
}

/// The option keys of `"pool"` (its `VRAMPOOL_CONF` keys) or of an allocator model.
#[pyfunction]
fn allocator_options(name: &str) -> PyResult<Vec<&'static str>> {
    if name == POOL {
        return Ok(PoolConfig::KEYS.to_vec());
    }
    PeerConfig::keys(name).map(<[_]>::to_vec).ok_or_else(|| value_error(format!("unknown allocator model `{name}`")))
}

fn target(name: &str, conf: &str) -> PyResult<ReplayTarget> {
    if name != POOL {
        return PeerConfig::parse(name, conf).map(ReplayTarget::Peer).map_err(value_error);
    }
    let mut config = PoolConfig::default();
    let others = config.apply_text(conf).map_err(value_error)?;
    match others.first() {
        Some((key, _)) => Err(value_error(format!("unknown pool setting `{key}` for a replay"))),
        None => Ok(ReplayTarget::Pool(config)),
    }
}

/// Replays `(id, lower, upper, size, stream)` rows on the address-only simulated device once per
/// entry of `runs`: `("pool", VRAMPOOL_CONF text)` for the pool, or `(model, options)` for an
/// allocator model (`torch`, `torch+expandable`, `rmm`, `cupy`, `async`). `capacity` limits the
/// device's memory (a replay that runs out stops there and says where, in `out_of_memory`);
/// `repeat` replays the trace that many times back to back, in the memory of one copy. Returns
/// one dict per run.
#[pyfunction]
#[pyo3(signature = (rows, runs, samples = replay::DEFAULT_SAMPLES, capacity = None, repeat = 1))]
fn replay_trace<'py>(
    py: Python<'py>,
    rows: Vec<Row>,
    runs: Vec<(String, String)>,
    samples: usize,
    capacity: Option<u64>,
    repeat: u64,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let targets = runs.iter().map(|(name, conf)| target(name, conf)).collect::<PyResult<Vec<_>>>()?;
    if capacity == Some(0) {
        return Err(value_error("capacity must be at least 1 byte"));
    }
    let buffers: Vec<TraceBuffer> = rows
        .into_iter()
        .map(|(id, lower, upper, size, stream)| TraceBuffer { id, lower, upper, size, stream })
        .collect();
    let options = ReplayOptions { samples, capacity, repeat };
    let reports: Vec<ReplayReport> = py
        .detach(|| {
            let prepared = PreparedTrace::new(&replay::events_from_buffers(&buffers)?)?;
            targets.iter().map(|target| replay::replay_prepared(&prepared, target, options)).collect::<Result<Vec<_>, _>>()
        })
        .map_err(value_error)?;
    reports.iter().map(|r| report_dict(py, r)).collect()
}

fn report_dict<'py>(py: Python<'py>, r: &ReplayReport) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("strategy", r.strategy)?;
    out.set_item("approximate", r.approximate)?;
    out.set_item("peak_reserved_bytes", r.peak_reserved_bytes)?;
    out.set_item("peak_allocated_bytes", r.peak_allocated_bytes)?;
    out.set_item("lower_bound_bytes", r.lower_bound_bytes)?;
    out.set_item("events", r.events)?;
    out.set_item("seconds", r.seconds)?;
    out.set_item("events_per_s", r.events_per_s)?;
    out.set_item("device_allocs", r.device_allocs)?;
    out.set_item("device_frees", r.device_frees)?;
    out.set_item("fragmentation", r.fragmentation)?;
    match &r.out_of_memory {
        None => out.set_item("out_of_memory", py.None())?,
        Some(oom) => {
            let d = PyDict::new(py);
            d.set_item("event", oom.event)?;
            d.set_item("requested_bytes", oom.report.requested)?;
            d.set_item("allocated_bytes", oom.report.allocated)?;
            d.set_item("reserved_bytes", oom.report.reserved)?;
            d.set_item("largest_free_bytes", oom.report.largest_free)?;
            out.set_item("out_of_memory", d)?;
        }
    }
    // Columns rather than one dict a point: a third of the objects, and JSON-ready as is.
    let timeline = PyDict::new(py);
    timeline.set_item("event", r.timeline.iter().map(|p| p.event).collect::<Vec<_>>())?;
    timeline.set_item("allocated_bytes", r.timeline.iter().map(|p| p.allocated_bytes).collect::<Vec<_>>())?;
    timeline.set_item("reserved_bytes", r.timeline.iter().map(|p| p.reserved_bytes).collect::<Vec<_>>())?;
    out.set_item("timeline", timeline)?;
    Ok(out)
}
