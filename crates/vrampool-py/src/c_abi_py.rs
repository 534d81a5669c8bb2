//! The native functions `vrampool.torch` reads the C ABI's state through: its configuration,
//! failures, figures and modes (the same `Abi` the `extern "C"` entries use).

use std::collections::HashMap;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vrampool_core::failures::Failure;
use vrampool_core::{MemoryResource, StreamId};

use crate::c_abi::{guard, vrampool_cxx_can_throw, ABI};
use crate::errors::to_py;
use crate::figures::planned_stats_dict;
use crate::figures::{config_dict, oom_dict, snapshot_dict, stats_dict};
use crate::pool::{tag_row, TagRow};

/// Sets the configuration for the pools the C ABI makes (text form, applied over
/// `VRAMPOOL_CONF`); refused once one exists with another. Returns the text in force.
#[pyfunction]
#[pyo3(signature = (text = ""))]
fn configure(text: &str) -> PyResult<String> {
    ABI.devices.configure(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The configuration in force (reading `VRAMPOOL_CONF` if nothing set it yet): every key with
/// its value and the text, the devices that have a pool, and whether failures raise.
#[pyfunction]
fn configuration(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let config = ABI.devices.config().map_err(|e| PyValueError::new_err(e.to_string()))?;
    let d = config_dict(py, &config)?;
    d.set_item("devices", ABI.devices.entries().iter().map(|(o, _)| *o).collect::<Vec<_>>())?;
    d.set_item("raise_on_failure", ABI.raise_on_failure.load(std::sync::atomic::Ordering::Relaxed))?;
    Ok(d)
}

/// The message of the last failure of any C ABI call (any thread), or None.
#[pyfunction]
fn last_error() -> Option<String> {
    ABI.failures.last_error()
}

/// Forgets the last error and the last out-of-memory report.
#[pyfunction]
fn clear_last_error() {
    ABI.failures.clear();
}

/// The last allocation that failed for want of memory, as a dict of figures, or None.
#[pyfunction]
fn last_oom(py: Python<'_>) -> PyResult<Option<Bound<'_, PyDict>>> {
    ABI.failures.last_oom().map(|r| oom_dict(py, &r)).transpose()
}

/// `device`'s figures under PyTorch's key names (main and private pools together); zeros where
/// the device has no pool yet.
#[pyfunction]
fn abi_stats(py: Python<'_>, device: i32) -> PyResult<Bound<'_, PyDict>> {
    let resource = ABI.devices.get(device);
    let d = stats_dict(py, &resource.map(|r| r.stats()).unwrap_or_default())?;
    d.set_item("capacity_bytes", resource.map_or(0, |r| r.pool().capacity()))?;
    Ok(d)
}

#[pyfunction]
fn abi_reset_peak_stats(device: i32) {
    if let Some(r) = ABI.devices.get(device) {
        r.reset_peak_stats();
    }
}

/// Gives every wholly free segment of every pool back; returns the bytes given back. With the
/// GIL held, as `NativePool::trim`.
#[pyfunction]
fn abi_trim() -> PyResult<u64> {
    ABI.trim_all().map_err(PyRuntimeError::new_err)
}

/// Every segment of every device's pools in the format of `torch.cuda.memory._snapshot()`
/// (as `NativePool.snapshot`), with `device_traces` for at least `device_count` devices.
#[pyfunction]
#[pyo3(signature = (device_count = 0))]
fn abi_snapshot(py: Python<'_>, device_count: usize) -> PyResult<Bound<'_, PyDict>> {
    let segments: Vec<_> =
        ABI.devices.entries().into_iter().flat_map(|(ordinal, r)| r.snapshot().into_iter().map(move |s| (ordinal, s))).collect();
    let settings = ABI.devices.config().map(|c| c.text).unwrap_or_default();
    snapshot_dict(py, &segments, device_count, &settings)
}

/// Counts of refused or failed C ABI calls, and the private pools per device.
#[pyfunction]
fn abi_counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for kind in Failure::ALL {
        d.set_item(kind.name(), ABI.failures.count(kind))?;
    }
    let private = PyDict::new(py);
    for (ordinal, resource) in ABI.devices.entries() {
        let (pools, open) = resource.stack().ids();
        let e = PyDict::new(py);
        e.set_item("pools", pools.iter().map(|id| (id.first, id.second)).collect::<Vec<_>>())?;
        e.set_item("open", open.iter().map(|id| (id.first, id.second)).collect::<Vec<_>>())?;
        private.set_item(ordinal, e)?;
    }
    d.set_item("private_pools", private)?;
    Ok(d)
}

/// Gets, and with `on` sets, whether a failed `vrampool_torch_malloc` throws a C++ exception (what
/// `install()` needs: PyTorch does not check for null) rather than returning null. Turning it
/// on fails where the C++ runtime is not loaded in the process.
#[pyfunction]
#[pyo3(signature = (on = None))]
fn abi_raise_on_failure(on: Option<bool>) -> PyResult<bool> {
    use std::sync::atomic::Ordering::Relaxed;
    if let Some(on) = on {
        // SAFETY: a plain C function of csrc/malloc.c, safe to call at any time.
        if on && unsafe { vrampool_cxx_can_throw() } == 0 {
            return Err(PyRuntimeError::new_err("the C++ runtime (libstdc++) is not loaded in this process: import torch first"));
        }
        ABI.raise_on_failure.store(on, Relaxed);
    }
    Ok(ABI.raise_on_failure.load(Relaxed))
}

/// Drives the simulated device behind `device`'s pool: whether its events complete at once, and
/// completing the work queued so far on a stream.
#[pyfunction]
#[pyo3(signature = (device, auto_complete = None, complete_stream = None))]
fn abi_sim_control(device: i32, auto_complete: Option<bool>, complete_stream: Option<u64>) -> PyResult<()> {
    let sim = ABI
        .devices
        .get(device)
        .and_then(|r| r.sim())
        .ok_or_else(|| PyValueError::new_err(format!("device {device} has no pool on the simulated device")))?;
    if let Some(on) = auto_complete {
        sim.set_auto_complete(on);
    }
    if let Some(stream) = complete_stream {
        sim.complete_stream(StreamId::canonical(stream));
    }
    Ok(())
}

/// Gets, and with `on` sets, whether allocations go through the planned arena.
#[pyfunction]
#[pyo3(signature = (on = None))]
fn abi_planned(on: Option<bool>) -> bool {
    if let Some(on) = on {
        ABI.set_planned(on);
    }
    ABI.planned_on()
}

#[pyfunction]
fn abi_planned_step(key: u64) {
    ABI.planned_step(key);
}

/// `device`'s planned-arena figures, or None where it has made no planned allocation.
#[pyfunction]
fn abi_planned_stats(py: Python<'_>, device: i32) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(stats) = ABI.devices.get(device).and_then(|r| r.planned().planned_stats()) else { return Ok(None) };
    planned_stats_dict(py, &stats).map(Some)
}

/// Opens (`open`) or closes `tag`'s region on `device`'s pool: the allocations PyTorch makes
/// meanwhile belong to the tag. Closing one that is not open is a `ValueError`.
#[pyfunction]
fn abi_region(device: i32, tag: &str, open: bool) -> PyResult<()> {
    let resource = ABI.device(device).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    match open {
        true => resource.stack().begin_tag(tag).map_err(to_py),
        false if resource.stack().end_tag(tag) => Ok(()),
        false => Err(PyValueError::new_err(format!("no region of tag {tag:?} is open on device {device}"))),
    }
}

/// Pauses `tag`'s memory on `device` (every tag's for None); returns (bytes given back, bytes
/// backed up). Without the GIL, as `NativePool.pause`.
#[pyfunction]
#[pyo3(signature = (device, tag = None, backup = false))]
fn abi_pause(py: Python<'_>, device: i32, tag: Option<&str>, backup: bool) -> PyResult<(u64, u64)> {
    let resource = made(device)?;
    let report = crate::exit::detach(py, || resource.stack().pause(tag, backup)).map_err(to_py)?;
    Ok((report.released, report.backed_up))
}

/// Resumes `tag`'s memory on `device` (every tag's for None); returns the bytes mapped again.
#[pyfunction]
#[pyo3(signature = (device, tag = None, cached = true))]
fn abi_resume(py: Python<'_>, device: i32, tag: Option<&str>, cached: bool) -> PyResult<u64> {
    let resource = made(device)?;
    crate::exit::detach(py, || resource.stack().resume(tag, cached)).map_err(to_py)
}

/// `device`'s pool, which an earlier call made; a `ValueError` where none did.
fn made(device: i32) -> PyResult<&'static crate::resource::DeviceResource> {
    ABI.devices.get(device).ok_or_else(|| PyValueError::new_err(format!("device {device} has no pool")))
}

/// `device`'s tags as (name, paused, allocated, reserved, paused_bytes); none where it has no pool.
#[pyfunction]
fn abi_tags(device: i32) -> Vec<TagRow> {
    let tags = ABI.devices.get(device).map(|r| r.stack().tags()).unwrap_or_default();
    tags.into_iter().map(tag_row).collect()
}

/// For tests: closes and unhooks every pool (their memory stays reserved: blocks may be live),
/// forgets the configuration, the errors and the counters, and turns `raise_on_failure` off.
#[pyfunction]
fn _abi_reset() {
    ABI.reset();
}

/// For tests: runs a panicking body through the same guard as every C ABI entry; returns what
/// the guard answered and the error it recorded.
#[pyfunction]
fn _abi_guard_selftest() -> (i64, Option<String>) {
    let answer = guard("selftest", -1i64, || panic!("selftest"));
    (answer, ABI.failures.last_error())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(configuration, m)?)?;
    m.add_function(wrap_pyfunction!(last_error, m)?)?;
    m.add_function(wrap_pyfunction!(clear_last_error, m)?)?;
    m.add_function(wrap_pyfunction!(last_oom, m)?)?;
    m.add_function(wrap_pyfunction!(abi_stats, m)?)?;
    m.add_function(wrap_pyfunction!(abi_reset_peak_stats, m)?)?;
    m.add_function(wrap_pyfunction!(abi_trim, m)?)?;
    m.add_function(wrap_pyfunction!(abi_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(abi_counters, m)?)?;
    m.add_function(wrap_pyfunction!(abi_raise_on_failure, m)?)?;
    m.add_function(wrap_pyfunction!(abi_sim_control, m)?)?;
    m.add_function(wrap_pyfunction!(abi_planned, m)?)?;
    m.add_function(wrap_pyfunction!(abi_planned_step, m)?)?;
    m.add_function(wrap_pyfunction!(abi_planned_stats, m)?)?;
    m.add_function(wrap_pyfunction!(abi_region, m)?)?;
    m.add_function(wrap_pyfunction!(abi_pause, m)?)?;
    m.add_function(wrap_pyfunction!(abi_resume, m)?)?;
    m.add_function(wrap_pyfunction!(abi_tags, m)?)?;
    m.add_function(wrap_pyfunction!(_abi_reset, m)?)?;
    m.add_function(wrap_pyfunction!(_abi_guard_selftest, m)?)?;
    let symbols: HashMap<&str, &str> = HashMap::from([
        ("malloc", "vrampool_malloc"),
        ("torch_malloc", "vrampool_torch_malloc"),
        ("free", "vrampool_free"),
        ("init", "vrampool_init"),
        ("reset", "vrampool_reset"),
        ("memory_fraction", "vrampool_memory_fraction"),
        ("base_alloc", "vrampool_base_alloc"),
        ("record_stream", "vrampool_record_stream"),
        ("begin_allocate_to_pool", "vrampool_begin_allocate_to_pool"),
        ("end_allocate_to_pool", "vrampool_end_allocate_to_pool"),
        ("release_pool", "vrampool_release_pool"),
    ]);
    m.add("ABI_SYMBOLS", symbols)?;
    Ok(())
}
