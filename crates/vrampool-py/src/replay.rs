//! Trace replay for Python: trace rows in, one dict of figures per pool configuration or
//! allocator model out.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use vrampool_core::config::{key_names, Scope};
use vrampool_core::{PoolError, PoolId, PoolSegment, StreamId};
use vrampool_steady::{AheadBuffer, AheadPlan};
use vrampool_whatif::peers::PeerConfig;
use vrampool_whatif::replay::{self, PreparedTrace, ReplayOptions, ReplayReport, ReplayTarget, TraceBuffer};
use vrampool_whatif::replay_row::{ahead_target, pool_row_conf, row_target, AHEAD_ROW};
use vrampool_whatif::trace_live::LiveBytes;

use crate::figures::segment_dict;

/// `(id, lower, upper, size, stream)`.
type Row = (u64, u64, u64, u64, u64);

/// A plan made ahead: its rows `(stream, size, lower, upper)`, their offsets, alignment, and how many
/// lead rows serve the first step alone.
type AheadArg = (Vec<(u64, u64, u64, u64)>, Vec<u64>, u64, usize);

/// What `allocator_options` calls the pool.
const POOL: &str = "pool";

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_trace_csv, m)?)?;
    m.add_function(wrap_pyfunction!(replay_trace, m)?)?;
    m.add_function(wrap_pyfunction!(allocator_options, m)?)?;
    m.add_function(wrap_pyfunction!(row_conf, m)?)?;
    m.add_function(wrap_pyfunction!(live_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(peak_segments, m)?)?;
    m.add("ALLOCATOR_MODELS", vrampool_whatif::peers::PEER_NAMES.to_vec())?;
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

/// The option keys of `"pool"` (its `VRAMPOOL_CONF` keys) or of an allocator model.
#[pyfunction]
fn allocator_options(name: &str) -> PyResult<Vec<&'static str>> {
    if name == POOL {
        return Ok(key_names(Scope::Pool));
    }
    PeerConfig::keys(name).map(<[_]>::to_vec).ok_or_else(|| value_error(format!("unknown allocator model `{name}`")))
}

/// The pool row `row`'s configuration text (`default`, or a strategy with `+vm` or not): what its
/// name sets, then `conf`, which may not change that.
#[pyfunction]
fn row_conf(row: &str, conf: &str) -> PyResult<String> {
    pool_row_conf(row, conf).map_err(value_error)
}

fn trace_buffers(rows: Vec<Row>) -> Vec<TraceBuffer> {
    rows.into_iter().map(|(id, lower, upper, size, stream)| TraceBuffer { id, lower, upper, size, stream }).collect()
}

/// Requested bytes live over the rows' events in replay order: `(lower_bound_bytes, events,
/// live_bytes)`, the most bytes live at once and the bytes live after the event counts a replay
/// sampling `samples` points samples at.
#[pyfunction]
#[pyo3(signature = (rows, samples = replay::DEFAULT_SAMPLES))]
fn live_bytes(py: Python<'_>, rows: Vec<Row>, samples: usize) -> PyResult<(u64, Vec<usize>, Vec<u64>)> {
    let buffers = trace_buffers(rows);
    let live = crate::exit::detach(py, || LiveBytes::new(&buffers)).map_err(value_error)?;
    let (events, bytes) = live.timeline(samples).into_iter().unzip();
    Ok((live.lower_bound_bytes(), events, bytes))
}

/// The segments (as in `NativePool.snapshot()["segments"]`) of the pool row `row` with `conf`
/// once it has replayed the rows up to their moment of most live bytes.
#[pyfunction]
#[pyo3(signature = (rows, row, conf = ""))]
fn peak_segments<'py>(py: Python<'py>, rows: Vec<Row>, row: &str, conf: &str) -> PyResult<Bound<'py, PyList>> {
    let ReplayTarget::Pool(config) = row_target(row, conf).map_err(value_error)? else {
        return Err(value_error(format!("{row} has no vrampool segments: pick a pool strategy")));
    };
    let buffers = trace_buffers(rows);
    let segments = crate::exit::detach(py, || LiveBytes::new(&buffers)?.peak_segments(config)).map_err(value_error)?;
    let list = PyList::empty(py);
    for segment in segments {
        list.append(segment_dict(py, 0, &PoolSegment { pool: PoolId::MAIN, segment })?)?;
    }
    Ok(list)
}

/// Replays `(id, lower, upper, size, stream)` rows on the address-only simulated device once per
/// entry of `runs`: `(row, options)`, a row being `default`, a pool strategy (`+vm` or not), an
/// allocator model (`torch`, `torch+expandable`, `rmm`, `cupy`, `async`) or `ahead`, and its
/// options ones that do not change what the row's name says. `ahead` is the default pool served by
/// the plan `ahead`: `(rows, offsets, alignment, first)`, its rows `(stream, size, lower, upper)` in
/// the order of their allocations, their offsets, and how many lead rows serve the first step
/// alone (`vrampool.ahead.Plan`); it ends its step at
/// each of `steps` (the trace's step markers, in the rows' times).
/// `capacity` limits the device's memory (a replay that runs out stops there and says where, in
/// `out_of_memory`); `repeat` replays the trace that many times back to back, in the memory of one
/// copy. Returns one dict per run.
#[pyfunction]
#[pyo3(signature = (rows, runs, samples = replay::DEFAULT_SAMPLES, capacity = None, repeat = 1, ahead = None, steps = Vec::new()))]
#[allow(clippy::too_many_arguments)]
fn replay_trace<'py>(
    py: Python<'py>,
    rows: Vec<Row>,
    runs: Vec<(String, String)>,
    samples: usize,
    capacity: Option<u64>,
    repeat: u64,
    ahead: Option<AheadArg>,
    steps: Vec<u64>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let plan = match ahead {
        Some((rows, offsets, alignment, first)) => {
            let buffers: Vec<AheadBuffer> =
                rows.into_iter().map(|(stream, size, lower, upper)| AheadBuffer::new(StreamId(stream), size, lower, upper)).collect();
            let plan = AheadPlan::with_offsets(&buffers, &offsets, alignment)
                .and_then(|plan| plan.with_first_step(first))
                .map_err(|e| value_error(format!("not a valid plan: {e}")))?;
            Some(Arc::new(plan))
        }
        None => None,
    };
    let target = |row: &str, conf: &str| match (row, &plan) {
        (AHEAD_ROW, Some(plan)) => ahead_target(conf, plan.clone()),
        (AHEAD_ROW, None) => Err(PoolError::InvalidConfig(format!("the row `{AHEAD_ROW}` needs a plan (ahead=)"))),
        _ => row_target(row, conf),
    };
    let targets = runs.iter().map(|(row, conf)| target(row, conf)).collect::<Result<Vec<_>, _>>().map_err(value_error)?;
    if capacity == Some(0) {
        return Err(value_error("capacity must be at least 1 byte"));
    }
    let buffers = trace_buffers(rows);
    let options = ReplayOptions { samples, capacity, repeat, trim_each_pass: false };
    let reports: Vec<ReplayReport> = crate::exit::detach(py, || {
        let prepared = PreparedTrace::new(&replay::events_from_buffers(&buffers)?)?.with_steps(&replay::step_positions(&buffers, &steps));
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
    out.set_item("first_pass_peak_reserved_bytes", r.first_pass_peak_reserved_bytes)?;
    out.set_item("last_pass_device_allocs", r.last_pass_device_allocs)?;
    out.set_item("last_pass_device_frees", r.last_pass_device_frees)?;
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
