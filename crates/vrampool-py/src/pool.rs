//! `NativePool` and `NativeBuffer`: a `DeviceResource` (the core pool under the binding's
//! adaptors, as the C ABI has it per device) and the blocks it hands to Python.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use vrampool_core::{EventKind, MemoryResource, PoolConfig, SimDevice, SimMode, StreamId};

use crate::errors::to_py;
use crate::figures::{snapshot_dict, stats_dict};
use crate::resource::{Backend, DeviceResource};
use crate::streams::stream_arg;

#[pyclass(module = "vrampool._native", frozen)]
pub struct NativePool {
    resource: Arc<DeviceResource>,
}

impl NativePool {
    pub(crate) fn resource(&self) -> Arc<DeviceResource> {
        Arc::clone(&self.resource)
    }
}

#[pymethods]
impl NativePool {
    /// A pool on the simulated device of `capacity` bytes. `conf` is the text form of the
    /// configuration (`strategy:hybrid,limit:0.9`); `host_backed` picks real host memory
    /// (pointers can be written) over addresses only.
    #[new]
    #[pyo3(signature = (capacity, conf = "", host_backed = true, ordinal = 0))]
    fn new(capacity: u64, conf: &str, host_backed: bool, ordinal: i32) -> PyResult<Self> {
        let config = config_from(conf)?;
        if capacity == 0 {
            return Err(PyValueError::new_err("capacity must be positive"));
        }
        let mode = if host_backed { SimMode::HostBacked } else { SimMode::AddressOnly };
        let resource = DeviceResource::open(Backend::Sim { capacity, mode }, ordinal, config, conf.to_string()).map_err(to_py)?;
        Ok(Self { resource: Arc::new(resource) })
    }

    /// A pool on CUDA device `ordinal` (its primary context). Raises `DeviceError` when there is
    /// no driver or no such device.
    #[staticmethod]
    #[pyo3(signature = (ordinal, conf = ""))]
    fn cuda(py: Python<'_>, ordinal: i32, conf: &str) -> PyResult<Self> {
        let config = config_from(conf)?;
        let resource = crate::exit::detach(py, || DeviceResource::open(Backend::Cuda, ordinal, config, conf.to_string())).map_err(to_py)?;
        Ok(Self { resource: Arc::new(resource) })
    }

    #[pyo3(signature = (nbytes, stream = 0))]
    fn allocate(&self, nbytes: u64, stream: u64) -> PyResult<NativeBuffer> {
        // With the GIL held: a call is a few hundred nanoseconds, and a daemon thread that took
        // the GIL back inside it at interpreter exit would be ended by a forced unwind that the
        // binding's panic guard cannot pass (CPython 3.11: "FATAL: exception not rethrown").
        let ptr = self.resource.allocate(nbytes, StreamId(stream)).map_err(to_py)?;
        Ok(NativeBuffer { resource: Arc::clone(&self.resource), ptr, size: nbytes, stream, life: Mutex::default() })
    }

    fn record_stream(&self, ptr: u64, stream: u64) -> PyResult<()> {
        self.resource.record_stream(ptr, StreamId(stream)).map_err(to_py)
    }

    /// With the GIL held, as in `allocate`.
    fn trim(&self) -> PyResult<u64> {
        self.resource.trim().map_err(to_py)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.resource.pool().check_process().map_err(to_py)?;
        stats_dict(py, &self.resource.stats())
    }

    fn reset_peak_stats(&self) {
        self.resource.reset_peak_stats();
    }

    /// The segments and their blocks in the format of `torch.cuda.memory._snapshot()`.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let resource = &self.resource;
        resource.pool().check_process().map_err(to_py)?;
        let segments: Vec<_> = resource.snapshot().into_iter().map(|s| (resource.ordinal(), s)).collect();
        snapshot_dict(py, &segments, 0, resource.conf())
    }

    /// Live blocks as (addr, size, requested, stream, age_ns) tuples; `age_ns` (nanoseconds
    /// since the allocation) is None unless the pool tracks leaks (`track_leaks:true`).
    fn live_blocks(&self) -> PyResult<Vec<LiveTuple>> {
        self.resource.pool().check_process().map_err(to_py)?;
        Ok(self.resource.live_blocks().iter().map(live_tuple).collect())
    }

    /// Opens `tag`'s region: allocations go to the tag's memory until `region_end(tag)`.
    fn region_begin(&self, tag: &str) -> PyResult<()> {
        if self.resource.pool().is_closed() {
            return Err(to_py(vrampool_core::PoolError::Closed));
        }
        self.resource.stack().begin_tag(tag).map_err(to_py)
    }

    /// Closes the innermost open region of `tag`; False when none is open.
    fn region_end(&self, tag: &str) -> bool {
        self.resource.stack().end_tag(tag)
    }

    /// Pauses `tag`'s memory (every tag's for None): returns (bytes given back, bytes backed up).
    /// Without the GIL: a backup of gigabytes takes seconds.
    #[pyo3(signature = (tag = None, backup = false))]
    fn pause(&self, py: Python<'_>, tag: Option<&str>, backup: bool) -> PyResult<(u64, u64)> {
        let report = crate::exit::detach(py, || self.resource.stack().pause(tag, backup)).map_err(to_py)?;
        Ok((report.released, report.backed_up))
    }

    /// Resumes `tag`'s memory (every tag's for None); returns the bytes mapped again.
    #[pyo3(signature = (tag = None, cached = true))]
    fn resume(&self, py: Python<'_>, tag: Option<&str>, cached: bool) -> PyResult<u64> {
        crate::exit::detach(py, || self.resource.stack().resume(tag, cached)).map_err(to_py)
    }

    /// Every tag as (name, paused, allocated, reserved, paused_bytes).
    fn tags(&self) -> PyResult<Vec<TagRow>> {
        self.resource.pool().check_process().map_err(to_py)?;
        Ok(self.resource.stack().tags().into_iter().map(tag_row).collect())
    }

    /// Serves every step from now on by a plan made ahead (rows `(stream, size, lower, upper)` in the
    /// order of the step's allocations, and their offsets; the first `first` serve the first step
    /// alone), or by the steady arena again (None).
    #[pyo3(signature = (rows, offsets, alignment = 512, first = 0))]
    fn set_ahead(&self, rows: Option<Vec<crate::ahead::StepRow>>, offsets: Option<Vec<u64>>, alignment: u64, first: usize) -> PyResult<()> {
        let plan = match (rows, offsets) {
            (Some(rows), Some(offsets)) => Some(crate::ahead::ahead_plan(&rows, &offsets, alignment, first)?),
            (None, None) => None,
            _ => return Err(pyo3::exceptions::PyValueError::new_err("rows and offsets come together")),
        };
        self.resource.planned().planned().set_ahead(plan).map_err(to_py)
    }

    /// The steady arena's figures (`PlannedStats`), or None for a pool made with `steady:false`.
    fn steady_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.resource.pool().check_process().map_err(to_py)?;
        let planned = self.resource.planned();
        if !planned.is_steady() && !planned.is_on() {
            return Ok(None);
        }
        planned.planned_stats().map(|stats| crate::figures::planned_stats_dict(py, &stats)).transpose()
    }

    /// Takes the events recorded since the last call (pools made with `record_events:true`) as
    /// (time_ns, kind, addr, size, stream) tuples, kind one of alloc, free, segment_alloc,
    /// segment_free: what `vrampool.whatif.traces.from_event_log` reads.
    fn take_events(&self) -> PyResult<Vec<EventTuple>> {
        let pool = self.resource.pool();
        pool.check_process().map_err(to_py)?;
        let kind = |k: EventKind| match k {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::SegmentAlloc => "segment_alloc",
            EventKind::SegmentFree => "segment_free",
        };
        Ok(pool.take_events().into_iter().map(|e| (e.time_ns, kind(e.kind), e.addr, e.size, e.stream.0)).collect())
    }

    /// Closes the pool; returns the blocks still live, as `live_blocks` does. A `DeviceError`
    /// names the bytes the device refused to take back; the pool is closed all the same.
    fn close(&self) -> PyResult<Vec<LiveTuple>> {
        Ok(self.resource.close().map_err(to_py)?.iter().map(live_tuple).collect())
    }

    /// Whether the pool records allocation times for leak reports (`track_leaks`).
    #[getter]
    fn track_leaks(&self) -> bool {
        self.resource.pool().config().track_leaks
    }

    #[getter]
    fn closed(&self) -> bool {
        self.resource.pool().is_closed()
    }

    /// The pool's number in this process (`NativeBuffer.pool_id` of its buffers).
    #[getter]
    fn pool_id(&self) -> u64 {
        self.resource.id()
    }

    /// Whether its memory may be shared with other processes (`ipc:true`).
    #[getter]
    fn ipc(&self) -> bool {
        self.resource.pool().config().ipc
    }

    /// `ipc_export` of a buffer, for `[ptr, ptr + size)` inside one of the pool's segments: for
    /// callers that hold a pointer, not the buffer (Numba's arrays); they keep the memory live.
    fn ipc_export_range(&self, py: Python<'_>, ptr: u64, size: u64) -> PyResult<(Py<PyAny>, u64, u64)> {
        crate::ipc::export(py, &self.resource, ptr, size, false, &format!("{size} bytes at {ptr:#x}"))
    }

    #[getter]
    fn device(&self) -> i32 {
        self.resource.ordinal()
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.resource.pool().capacity()
    }

    #[getter]
    fn strategy(&self) -> &'static str {
        self.resource.pool().config().strategy.name()
    }

    /// What the pointers point at: "device" (CUDA memory), "host" (the host-backed simulated
    /// device: plain host memory) or "none" (the address-only simulated device).
    #[getter]
    fn memory_kind(&self) -> &'static str {
        self.resource.memory_kind()
    }

    /// The device's (free, total) bytes, as `cuMemGetInfo` reports them.
    fn mem_info(&self) -> PyResult<(u64, u64)> {
        let info = self.resource.pool().device().mem_info().map_err(|e| to_py(e.into()))?;
        Ok((info.free, info.total))
    }

    // ---- the simulated device, for tests and demos ----

    fn sim_write(&self, ptr: u64, data: &[u8]) -> PyResult<()> {
        self.sim()?.write(ptr, data).map_err(|e| to_py(e.into()))
    }

    fn sim_read<'py>(&self, py: Python<'py>, ptr: u64, nbytes: u64) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.sim()?.read(ptr, nbytes).map_err(|e| to_py(e.into()))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Makes the `n`-th device segment allocation from now fail.
    fn sim_fail_alloc_in(&self, n: u64) -> PyResult<()> {
        self.sim()?.fail_alloc_in(n);
        Ok(())
    }

    /// Makes the `n`-th event recording from now fail (a cross-stream free needs one).
    fn sim_fail_record_in(&self, n: u64) -> PyResult<()> {
        self.sim()?.fail_record_in(n);
        Ok(())
    }

    fn sim_set_auto_complete(&self, on: bool) -> PyResult<()> {
        self.sim()?.set_auto_complete(on);
        Ok(())
    }

    fn sim_complete_stream(&self, stream: u64) -> PyResult<()> {
        self.sim()?.complete_stream(StreamId(stream));
        Ok(())
    }

    /// The simulated device's counters: alloc_calls, free_calls, live_segments, used.
    fn sim_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.sim()?.counters();
        let d = PyDict::new(py);
        for (k, v) in [("alloc_calls", c.alloc_calls), ("free_calls", c.free_calls), ("live_segments", c.live_segments), ("used", c.used)] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

/// (time_ns, kind, addr, size, stream) of a logged event.
type EventTuple = (u64, &'static str, u64, u64, u64);

/// (addr, size, requested, stream, age_ns) of a live block.
type LiveTuple = (u64, u64, u64, u64, Option<u64>);

/// A tag as Python sees it: (name, paused, allocated, reserved, paused_bytes).
pub(crate) type TagRow = (String, bool, u64, u64, u64);

pub(crate) fn tag_row(t: vrampool_core::TagInfo) -> TagRow {
    (t.name, t.paused, t.allocated, t.reserved, t.paused_bytes)
}

fn live_tuple(b: &vrampool_core::LiveBlockInfo) -> LiveTuple {
    (b.addr, b.size, b.requested, b.stream.0, b.age_ns)
}

/// A pool configuration from its text form, parsed strictly by the core.
fn config_from(conf: &str) -> PyResult<PoolConfig> {
    let mut config = PoolConfig::default();
    config.apply_text(conf).map_err(to_py)?;
    Ok(config)
}

impl NativePool {
    fn sim(&self) -> PyResult<&SimDevice> {
        self.resource.sim().ok_or_else(|| PyValueError::new_err("this pool is not on the simulated device"))
    }
}

/// A buffer's life: freed once, and not before the last DLPack consumer lets go.
#[derive(Default)]
struct Life {
    /// A free was asked for (`free`, `close`, the context manager or a pool's `deallocate`).
    freed: bool,
    /// DLPack capsules handed out whose consumers have not yet called the deleter.
    exports: usize,
    /// A free asked for while `exports > 0`, with its stream: done by the last deleter.
    deferred: Option<Option<u64>>,
}

/// A block of device memory, freed exactly once: by `free()` / `close()`, the context manager,
/// or when collected. A free asked for while DLPack consumers still hold the memory waits for
/// the last of them (their deleters hold a reference to the buffer).
#[pyclass(module = "vrampool._native", frozen, subclass)]
pub struct NativeBuffer {
    resource: Arc<DeviceResource>,
    #[pyo3(get)]
    ptr: u64,
    #[pyo3(get)]
    size: u64,
    #[pyo3(get)]
    stream: u64,
    // A mutex, not atomics: three fields change together, and it is uncontended (one buffer).
    life: Mutex<Life>,
}

#[pymethods]
impl NativeBuffer {
    /// Gives the block back to its pool; later calls do nothing. `stream`, when given, is the
    /// stream that used the block last. While DLPack consumers hold the memory, the free happens
    /// when the last of them releases it.
    #[pyo3(signature = (stream = None))]
    fn free(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = stream_arg(py, stream)?;
        {
            let mut life = self.life();
            if life.freed {
                return Ok(());
            }
            if self.resource.pool().is_closed() {
                // Refused, and the buffer stays as it was: the closed pool keeps its segments.
                return Err(to_py(vrampool_core::PoolError::Closed));
            }
            life.freed = true;
            if life.exports > 0 {
                life.deferred = Some(stream);
                return Ok(());
            }
        }
        // With the GIL held, as in `NativePool::allocate`.
        let freed = self.resource.free(self.ptr, Some(self.size), stream.map(StreamId));
        if freed.is_err() {
            // The pool refused (an event it could not record, or a pool closed meanwhile): the
            // block is still live, so the buffer is too and may be freed again.
            self.life().freed = false;
        }
        freed.map_err(to_py)
    }

    /// `free`, under the name file-like objects use.
    #[pyo3(signature = (stream = None))]
    fn close(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.free(py, stream)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.free(py, None)?;
        Ok(false)
    }

    /// Whether a free was asked for (the memory itself may wait for DLPack consumers).
    #[getter]
    fn freed(&self) -> bool {
        self.life().freed
    }

    /// DLPack capsules handed out whose consumers still hold the memory.
    #[getter]
    fn dlpack_exports(&self) -> usize {
        self.life().exports
    }

    #[getter]
    fn device(&self) -> i32 {
        self.resource.ordinal()
    }

    /// `(handle, offset, size)`: a handle for the allocation under the buffer (a new file
    /// descriptor, the caller's to close, or a legacy IPC handle's bytes), the buffer's offset in
    /// it and the allocation's size, for another process to map.
    fn ipc_export(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, u64, u64)> {
        crate::ipc::export(py, &self.resource, self.ptr, self.size, self.life().freed, &self.__repr__())
    }

    /// The number of the pool it came from, in this process.
    #[getter]
    fn pool_id(&self) -> u64 {
        self.resource.id()
    }

    /// Whether `pool` is the pool this buffer came from.
    fn belongs_to(&self, pool: &NativePool) -> bool {
        Arc::ptr_eq(&self.resource, &pool.resource)
    }

    /// CUDA Array Interface v3: a 1-D array of `size` bytes. `stream` is the buffer's stream, the
    /// one a consumer must order its work after: 1 for the legacy default stream (the interface
    /// forbids 0), 2 for the per-thread default stream, else the `CUstream` handle.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.check_live("__cuda_array_interface__")?;
        let d = PyDict::new(py);
        d.set_item("shape", (self.size,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        let stream = match StreamId::canonical(self.stream) {
            StreamId(0) => StreamId::LEGACY,
            StreamId(s) => s,
        };
        d.set_item("stream", stream)?;
        Ok(d)
    }

    /// `(device_type, device_id)`: kDLCUDA (2) and the ordinal for CUDA memory; kDLCPU (1, 0)
    /// for the simulated device, whose memory is host memory (so numpy takes it zero-copy).
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.dl_device()
    }

    /// A DLPack capsule of a 1-D uint8 view of the buffer; the consumer's deleter holds a
    /// reference to the buffer, so its memory stays valid until the consumer lets go.
    /// `stream` is the consumer's stream: the producer stream's work is ordered before it (None:
    /// the legacy default stream on CUDA, no ordering on the CPU; -1: no ordering; 0 is refused
    /// as ambiguous). `max_version` >= (1, 0) gets a versioned capsule (`dltensor_versioned`).
    #[pyo3(signature = (stream = None, *, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        if this.resource.memory_kind() == "none" {
            return Err(PyBufferError::new_err("the address-only simulated device has no memory behind its pointers"));
        }
        let device = this.dl_device();
        if let Some(wanted) = dl_device {
            if wanted != device {
                return Err(PyBufferError::new_err(format!(
                    "the buffer is on DLPack device {device:?}, not {wanted:?}; vrampool does not copy"
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err("vrampool buffers are exported without a copy; copy=True is not supported"));
        }
        let consumer = consumer_stream(stream, device.0 == K_DL_CUDA)?;
        {
            let mut life = this.life();
            if life.freed {
                return Err(PyBufferError::new_err(format!("{} was freed", this.__repr__())));
            }
            life.exports += 1;
        }
        if let Some(consumer) = consumer.filter(|&c| c != StreamId::canonical(this.stream).0) {
            // The consumer's stream waits for the work queued so far on the buffer's stream.
            let device = this.resource.pool().device();
            let producer = StreamId(this.stream);
            let ordered = (|| {
                let event = device.record_event(producer)?;
                let waited = device.stream_wait_event(StreamId(consumer), event);
                device.release_event(event);
                waited
            })();
            if let Err(e) = ordered {
                this.release_export();
                return Err(to_py(e.into()));
            }
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        // SAFETY: `export` builds a tensor over this live buffer; the capsule owns it from here.
        unsafe { export(slf, versioned) }
    }

    fn __repr__(&self) -> String {
        format!("DeviceBuffer(ptr={:#x}, size={}, device={}, stream={})", self.ptr, self.size, self.device(), self.stream)
    }
}

impl NativeBuffer {
    fn life(&self) -> MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_live(&self, what: &str) -> PyResult<()> {
        if self.life().freed {
            return Err(PyBufferError::new_err(format!("{what} of {}: the buffer was freed", self.__repr__())));
        }
        Ok(())
    }

    fn dl_device(&self) -> (i32, i32) {
        match self.resource.sim() {
            Some(_) => (K_DL_CPU, 0),
            None => (K_DL_CUDA, self.device()),
        }
    }

    /// A DLPack consumer let go; the last one does a free that was asked for meanwhile.
    fn release_export(&self) {
        let deferred = {
            let mut life = self.life();
            life.exports = life.exports.saturating_sub(1);
            if life.exports == 0 {
                life.deferred.take()
            } else {
                None
            }
        };
        if let Some(stream) = deferred {
            // Nobody to tell: a closed pool refuses it, and its segments go when it is dropped.
            let _ = self.resource.free(self.ptr, Some(self.size), stream.map(StreamId));
        }
    }
}

impl Drop for NativeBuffer {
    fn drop(&mut self) {
        // No DLPack export can be live here: each holds a reference to the buffer.
        let life = self.life.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !life.freed {
            life.freed = true;
            // A closed pool refuses the free; its segments go back when the pool is dropped.
            let _ = self.resource.free(self.ptr, Some(self.size), None);
        }
    }
}

// ---- DLPack (the ABI of dlpack.h v1.x; the unversioned struct for older consumers) ----

const K_DL_CPU: i32 = 1;
const K_DL_CUDA: i32 = 2;
const K_DL_UINT: u8 = 1;
const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What a managed tensor's `manager_ctx` points at: the buffer (kept alive) and the arrays the
/// tensor's `shape` and `strides` point into.
struct ExportCtx {
    owner: Py<NativeBuffer>,
    shape: [i64; 1],
    strides: [i64; 1],
}

/// The consumer's stream from `__dlpack__(stream=...)`, canonical; None when no ordering is due.
fn consumer_stream(stream: Option<&Bound<'_, PyAny>>, cuda: bool) -> PyResult<Option<u64>> {
    let Some(stream) = stream.filter(|s| !s.is_none()) else {
        // The DLPack default: the legacy default stream on CUDA; no streams on the CPU.
        return Ok(cuda.then_some(0));
    };
    if let Ok(handle) = stream.extract::<i64>() {
        return match handle {
            -1 => Ok(None),
            0 => Err(PyValueError::new_err(
                "DLPack stream 0 is ambiguous: pass 1 (legacy default stream), 2 (per-thread default stream) or a stream handle",
            )),
            h if h < 0 => Err(PyValueError::new_err(format!("DLPack stream {h} is not a stream handle"))),
            h => Ok(Some(StreamId::canonical(h as u64).0)),
        };
    }
    match stream.extract::<u64>() {
        Ok(handle) => Ok(Some(handle)),
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "the DLPack stream must be an int or None, not {}",
            stream.get_type().name()?
        ))),
    }
}

/// Builds the managed tensor and its capsule; counts one export, which the deleter releases.
///
/// # Safety
/// The caller has counted the export (`Life::exports`), so the block is live and stays so.
unsafe fn export<'py>(slf: &Bound<'py, NativeBuffer>, versioned: bool) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let this = slf.get();
    let (device_type, device_id) = this.dl_device();
    let ctx = Box::into_raw(Box::new(ExportCtx { owner: slf.clone().unbind(), shape: [this.size as i64], strides: [1] }));
    let tensor = DLTensor {
        data: this.ptr as *mut c_void,
        device: DLDevice { device_type, device_id },
        ndim: 1,
        dtype: DLDataType { code: K_DL_UINT, bits: 8, lanes: 1 },
        shape: std::ptr::addr_of_mut!((*ctx).shape).cast(),
        strides: std::ptr::addr_of_mut!((*ctx).strides).cast(),
        byte_offset: 0,
    };
    let capsule = if versioned {
        let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: ctx.cast(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor: tensor,
        }));
        let capsule = ffi::PyCapsule_New(managed.cast(), VERSIONED_NAME.as_ptr(), Some(destroy_versioned_capsule));
        if capsule.is_null() {
            delete_versioned(managed);
        }
        capsule
    } else {
        let managed = Box::into_raw(Box::new(DLManagedTensor { dl_tensor: tensor, manager_ctx: ctx.cast(), deleter: Some(delete_legacy) }));
        let capsule = ffi::PyCapsule_New(managed.cast(), LEGACY_NAME.as_ptr(), Some(destroy_legacy_capsule));
        if capsule.is_null() {
            delete_legacy(managed);
        }
        capsule
    };
    Bound::from_owned_ptr_or_err(py, capsule)
}

/// Ends one export: releases it on the buffer, then drops the reference to the buffer.
unsafe fn drop_ctx(ctx: *mut ExportCtx) {
    if ctx.is_null() {
        return;
    }
    let ctx = Box::from_raw(ctx);
    // No interpreter needed for this: the buffer is frozen and its state sits behind a mutex.
    ctx.owner.get().release_export();
    let mut slot = Some(ctx);
    // Dropping a reference needs the interpreter; a deleter run after it shut down leaks the
    // reference (and so the block) rather than touch a dead interpreter.
    let _ = Python::try_attach(|_py| drop(slot.take()));
    if let Some(ctx) = slot {
        std::mem::forget(ctx);
    }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        drop_ctx(Box::from_raw(managed).manager_ctx.cast());
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        drop_ctx(Box::from_raw(managed).manager_ctx.cast());
    }
}

/// A capsule collected without a consumer (still named `dltensor`) deletes its tensor; a
/// consumer renames it (`used_dltensor`) and owns the tensor from then on.
unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
        delete_legacy(ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast());
    }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
        delete_versioned(ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr()).cast());
    }
}
