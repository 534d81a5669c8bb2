//! The core's figures as Python dicts, one way for every pool: stats under PyTorch's key names,
//! snapshots in the format of `torch.cuda.memory._snapshot()` (which `torch.cuda._memory_viz`
//! and the memory visualiser read), out-of-memory records, and configurations by key.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use vrampool_core::config::{AllocatorConfig, Value, KEYS};
use vrampool_core::failures::OomRecord;
use vrampool_core::stats::{StatValue, Stats};
use vrampool_core::{BlockState, Limit, PoolSegment};
use vrampool_steady::PlannedStats;

/// The core's stats under their key names: counts as ints, ratios as floats, by their type.
pub fn stats_dict<'py>(py: Python<'py>, stats: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in stats.to_pairs() {
        match value {
            StatValue::Count(count) => dict.set_item(key, count)?,
            StatValue::Ratio(ratio) => dict.set_item(key, ratio)?,
        }
    }
    Ok(dict)
}

/// A block of a snapshot segment, in torch's terms.
fn block_dict<'py>(py: Python<'py>, address: u64, size: u64, state: BlockState) -> PyResult<Bound<'py, PyDict>> {
    // torch's state, and vrampool's, which tells a block kept in a cache at its size from a free one.
    let (name, own, requested) = match state {
        BlockState::Active { requested } => ("active_allocated", "active", requested),
        BlockState::PendingFree => ("active_pending_free", "pending_free", 0),
        BlockState::Cached => ("inactive", "cached", 0),
        BlockState::Free => ("inactive", "free", 0),
    };
    let d = PyDict::new(py);
    d.set_item("address", address)?;
    d.set_item("size", size)?;
    d.set_item("requested_size", requested)?;
    d.set_item("state", name)?;
    d.set_item("vrampool_state", own)?;
    d.set_item("frames", PyList::empty(py))?;
    Ok(d)
}

/// One segment in torch's format, its blocks covering it in address order (a stretch no block
/// reports is inactive), with vrampool's `strategy` (the tier it belongs to) beside torch's keys.
pub fn segment_dict<'py>(py: Python<'py>, device: i32, seg: &PoolSegment) -> PyResult<Bound<'py, PyDict>> {
    let s = &seg.segment;
    let mut spans: Vec<(u64, u64, BlockState)> = s.blocks.clone();
    spans.sort_by_key(|b| b.0);
    let blocks = PyList::empty(py);
    let (mut cursor, end) = (s.base, s.base + s.size);
    let (mut allocated, mut active, mut requested) = (0, 0, 0);
    for (address, size, state) in spans {
        if address > cursor {
            blocks.append(block_dict(py, cursor, address - cursor, BlockState::Free)?)?;
        }
        match state {
            BlockState::Active { requested: r } => {
                allocated += size;
                active += size;
                requested += r;
            }
            BlockState::PendingFree => active += size,
            BlockState::Cached | BlockState::Free => {}
        }
        blocks.append(block_dict(py, address, size, state)?)?;
        cursor = cursor.max(address + size);
    }
    if cursor < end {
        blocks.append(block_dict(py, cursor, end - cursor, BlockState::Free)?)?;
    }
    let d = PyDict::new(py);
    d.set_item("device", device)?;
    d.set_item("address", s.base)?;
    d.set_item("total_size", s.size)?;
    d.set_item("allocated_size", allocated)?;
    d.set_item("active_size", active)?;
    d.set_item("requested_size", requested)?;
    d.set_item("stream", s.stream.0)?;
    d.set_item("segment_type", if s.strategy == "slab" { "small" } else { "large" })?;
    d.set_item("segment_pool_id", (seg.pool.first, seg.pool.second))?;
    d.set_item("is_expandable", s.expandable)?;
    d.set_item("vrampool_paused", s.paused)?;
    d.set_item("frames", PyList::empty(py))?;
    d.set_item("blocks", blocks)?;
    d.set_item("strategy", s.strategy)?;
    Ok(d)
}

/// A snapshot in the format of `torch.cuda.memory._snapshot()`: `segments` (of each device, in
/// address order per pool), `device_traces` (an empty list per device: vrampool records no
/// stack traces) for at least `devices` devices, and `allocator_settings`.
pub fn snapshot_dict<'py>(
    py: Python<'py>,
    segments: &[(i32, PoolSegment)],
    devices: usize,
    settings: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let list = PyList::empty(py);
    for (device, seg) in segments {
        list.append(segment_dict(py, *device, seg)?)?;
    }
    let devices = segments.iter().map(|(d, _)| *d as usize + 1).max().unwrap_or(0).max(devices).max(1);
    let traces = PyList::empty(py);
    for _ in 0..devices {
        traces.append(PyList::empty(py))?;
    }
    let allocator_settings = PyDict::new(py);
    allocator_settings.set_item("vrampool", settings)?;
    let d = PyDict::new(py);
    d.set_item("segments", list)?;
    d.set_item("device_traces", traces)?;
    d.set_item("allocator_settings", allocator_settings)?;
    Ok(d)
}

/// An out-of-memory record's figures.
pub fn oom_dict<'py>(py: Python<'py>, r: &OomRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("device", r.device)?;
    d.set_item("stream", r.stream.0)?;
    d.set_item("requested", r.report.requested)?;
    d.set_item("allocated", r.report.allocated)?;
    d.set_item("reserved", r.report.reserved)?;
    d.set_item("free", r.free())?;
    d.set_item("largest_free", r.report.largest_free)?;
    d.set_item("fragmentation", r.fragmentation())?;
    d.set_item("device_free", r.report.device_free)?;
    d.set_item("arena", r.report.arena.bytes)?;
    d.set_item("arena_live", r.report.arena.live_bytes)?;
    d.set_item("arena_buffers", r.report.arena.live_buffers)?;
    d.set_item("limit", r.report.limit)?;
    d.set_item("capacity", r.capacity)?;
    d.set_item("too_large", r.too_large)?;
    d.set_item("strategy", r.strategy)?;
    d.set_item("round_up_divisions", r.round_up_divisions)?;
    d.set_item("num_ooms", r.num_ooms)?;
    d.set_item("message", &r.message)?;
    Ok(d)
}

/// Every key of the configuration with its value (a limit: None, bytes as an int, or a
/// fraction as a float), and the text it was read from.
pub fn config_dict<'py>(py: Python<'py>, config: &AllocatorConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", &config.text)?;
    for key in KEYS {
        let value = config.value(key.name).expect("every key has a value");
        let value = match value {
            Value::Name(name) => name.into_pyobject(py)?.into_any(),
            Value::Bytes(n) | Value::Count(n) => n.into_pyobject(py)?.into_any(),
            Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
            Value::Limit(None) => py.None().into_bound(py),
            Value::Limit(Some(Limit::Bytes(b))) => b.into_pyobject(py)?.into_any(),
            Value::Limit(Some(Limit::Fraction(f))) => f.into_pyobject(py)?.into_any(),
        };
        d.set_item(key.name, value)?;
    }
    Ok(d)
}

/// The planned arena's figures: counts, `arena_bytes`, and `plans`, one dict per key.
pub(crate) fn planned_stats_dict<'py>(py: Python<'py>, stats: &PlannedStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("planned_allocations", stats.planned_allocations)?;
    d.set_item("dynamic_allocations", stats.dynamic_allocations)?;
    d.set_item("idle_allocations", stats.idle_allocations)?;
    d.set_item("fallbacks", stats.fallbacks)?;
    d.set_item("recorded_iterations", stats.recorded_iterations)?;
    d.set_item("replayed_iterations", stats.replayed_iterations)?;
    d.set_item("arena_bytes", stats.arena_bytes)?;
    d.set_item("arena_live", stats.arena_live)?;
    d.set_item("arena_live_bytes", stats.arena_live_bytes)?;
    d.set_item("planned_bytes", stats.planned_bytes)?;
    d.set_item("arena_blocks_taken", stats.arena_blocks_taken)?;
    d.set_item("arena_blocks_returned", stats.arena_blocks_returned)?;
    let plans = PyList::empty(py);
    for p in &stats.plans {
        let plan = PyDict::new(py);
        plan.set_item("key", p.key)?;
        plan.set_item("arena_bytes", p.arena_bytes)?;
        plan.set_item("lower_bound_bytes", p.lower_bound_bytes)?;
        plan.set_item("arena_buffers", p.arena_buffers)?;
        plan.set_item("dynamic_buffers", p.dynamic_buffers)?;
        plan.set_item("events", p.events)?;
        plan.set_item("planner", p.planner)?;
        plans.append(plan)?;
    }
    d.set_item("plans", plans)?;
    Ok(d)
}
