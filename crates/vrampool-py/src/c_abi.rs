//! The C ABI that PyTorch's `CUDAPluggableAllocator` loads from this very extension module, and
//! the native functions `vrampool.torch` reads it through.
//!
//! ```text
//! void* vrampool_malloc(size_t size, int device, cudaStream_t stream);        // never throws
//! void* vrampool_torch_malloc(size_t size, int device, cudaStream_t stream);  // PyTorch's: may throw
//! void  vrampool_free(void* ptr, size_t size, int device, cudaStream_t stream);
//! void  vrampool_init(int device_count);                 // set_init_fn
//! void  vrampool_reset(void);                            // set_reset_fn: torch.cuda.empty_cache()
//! void  vrampool_memory_fraction(double fraction, int device);   // set_memory_fraction_fn
//! void* vrampool_base_alloc(void* ptr, size_t* size);    // set_base_alloc_fn
//! void  vrampool_record_stream(void* ptr, cudaStream_t stream);  // set_record_stream_fn
//! void  vrampool_begin_allocate_to_pool(int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter);
//! void  vrampool_end_allocate_to_pool(int device, MempoolId_t id);
//! void  vrampool_release_pool(int device, MempoolId_t id);
//! int    vrampool_configure(const char* text);           // 0, or -1 with the reason in last_error
//! size_t vrampool_last_error(char* buffer, size_t capacity);
//! void  vrampool_planned_enable(int on);               // the planned arena: a mode of the allocator
//! void  vrampool_planned_step(uint64_t key);           // an iteration boundary; `key` names the next one
//! ```
//!
//! One pool per device, made on first use from the configuration (`VRAMPOOL_CONF`, then
//! `configure`). Nothing crosses the ABI as a panic: every entry runs under `catch_unwind`, and a
//! failure is recorded (`last_error`, and for out-of-memory `last_oom`) and answered with null
//! or nothing. PyTorch does not check the pointer its pluggable allocator returns
//! (`CUDAPluggableAllocator::malloc` and `allocate` of torch 2.11 and 2.15 store it as is), so a
//! null would become a tensor at address 0; `install()` therefore turns on `raise_on_failure`,
//! under which a failed `vrampool_torch_malloc` (the entry PyTorch alone is given;
//! `vrampool_malloc` never throws, so a C or ctypes caller is never terminated) throws
//! libstdc++'s `std::runtime_error` ("CUDA out of memory. ...") that PyTorch turns into a Python
//! `RuntimeError`. (Inside `torch.cuda.MemPool` PyTorch's caching allocator does check: a null is
//! its out-of-memory.) `vrampool_torch_malloc` itself is C (`csrc/malloc.c`, which says why): it
//! calls `vrampool_torch_malloc_or_message` here and throws after that has returned, so no
//! exception ever unwinds through Rust; every Rust entry returns.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, null_mut};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use vrampool_core::config::parse_bytes;
use vrampool_core::stats::CounterValues;
use vrampool_core::{Device, Limit, OomReport, Pool, PoolConfig, PoolCore, PoolError, SimDevice, SimMode, Stats, StreamId};
use vrampool_plan::PlannedPool;

use crate::planned::planned_stats_dict;
use crate::pool::{segment_dict, stats_dict};

/// Device ordinals served: PyTorch's `DeviceIndex` is an `int8_t`.
const MAX_DEVICES: usize = 128;
const DEFAULT_SIM_CAPACITY: u64 = 16 << 30;
const ENV_VAR: &str = "VRAMPOOL_CONF";

// ---- configuration ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceKind {
    Cuda,
    /// The host-backed simulated device (tests, and trying things on a machine without a GPU).
    Sim,
}

/// The configuration every device's pool is made from.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    /// The text it was parsed from: `VRAMPOOL_CONF`, then what `configure` was given.
    text: String,
    config: PoolConfig,
    device: DeviceKind,
    sim_capacity: u64,
    /// `expandable:` as given (None: the core's default). The core reads it too where it knows it.
    expandable: Option<bool>,
}

impl Settings {
    /// Defaults, then `VRAMPOOL_CONF`, then `text`; later keys win.
    fn parse(env: &str, text: &str) -> Result<Self, String> {
        let mut settings =
            Self { text: String::new(), config: PoolConfig::default(), device: DeviceKind::Cuda, sim_capacity: DEFAULT_SIM_CAPACITY, expandable: None };
        for (source, part) in [(ENV_VAR, env), ("configuration", text)] {
            settings.apply(part).map_err(|e| format!("{source} `{part}`: {e}"))?;
        }
        settings.text = [env.trim(), text.trim()].iter().filter(|t| !t.is_empty()).copied().collect::<Vec<_>>().join(",");
        Ok(settings)
    }

    fn apply(&mut self, text: &str) -> Result<(), String> {
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some((key, value)) = pair.split_once(':').or_else(|| pair.split_once('=')) {
                if matches!(key.trim(), "expandable" | "expandable_segments") {
                    self.expandable = Some(parse_bool(value.trim())?);
                }
            }
        }
        for (key, value) in self.config.apply_text(text).map_err(|e| e.to_string())? {
            match key.as_str() {
                "device" => {
                    self.device = match value.to_ascii_lowercase().as_str() {
                        "cuda" | "gpu" => DeviceKind::Cuda,
                        "sim" => DeviceKind::Sim,
                        other => return Err(format!("device must be `cuda` or `sim`, got `{other}`")),
                    }
                }
                "sim_capacity" => {
                    self.sim_capacity = parse_bytes(&value).map_err(|e| e.to_string())?;
                    if self.sim_capacity == 0 {
                        return Err("sim_capacity must be positive".into());
                    }
                }
                // Parsed above; the core may or may not know it yet.
                "expandable" | "expandable_segments" => {}
                other => {
                    return Err(format!(
                        "unknown configuration key `{other}` (pool keys: strategy, small_max, large_min, alignment, \
                         round_up_divisions, limit, record_events, expandable; allocator keys: device, sim_capacity)"
                    ))
                }
            }
        }
        Ok(())
    }
}

fn parse_bool(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("`{text}` is not a boolean")),
    }
}

fn env_text() -> String {
    std::env::var(ENV_VAR).unwrap_or_default()
}

// ---- the registry: one entry per device, made on first use and never freed ----

/// A CUDA mempool id (`c10::cuda::MempoolId_t`, a `std::pair<unsigned long long, unsigned long
/// long>`): trivially copyable, so passed by value like this struct.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MempoolId {
    pub first: u64,
    pub second: u64,
}

/// A private pool (`beginAllocateToPool`, CUDA graphs): its blocks are reused only by its own
/// allocations, until `releasePool`.
struct PrivatePool {
    id: MempoolId,
    pool: Arc<Pool>,
    released: bool,
}

#[derive(Default)]
struct Private {
    pools: Vec<PrivatePool>,
    /// Pools allocations are routed to, innermost last.
    open: Vec<MempoolId>,
    /// The figures of the private pools released and gone: their totals and peaks stay in the
    /// device's.
    retired: Stats,
}

struct DeviceEntry {
    ordinal: i32,
    device: Arc<dyn Device>,
    sim: Option<Arc<SimDevice>>,
    config: PoolConfig,
    pool: Pool,
    /// The limit `set_memory_fraction` set last, for private pools made later.
    limit: Mutex<Option<Limit>>,
    private: Mutex<Private>,
    /// `private.open.len()` and `private.pools.len()`, read without the lock on the fast paths.
    routing: AtomicUsize,
    private_count: AtomicUsize,
}

impl DeviceEntry {
    /// The pool a new allocation goes to: the innermost open private pool, else the main one.
    fn target(&self) -> Option<Arc<Pool>> {
        if self.routing.load(Relaxed) == 0 {
            return None;
        }
        let private = lock(&self.private);
        let id = private.open.last()?;
        private.pools.iter().find(|p| p.id == *id).map(|p| Arc::clone(&p.pool))
    }

    fn private_pools(&self) -> Vec<(MempoolId, Arc<Pool>)> {
        if self.private_count.load(Relaxed) == 0 {
            return Vec::new();
        }
        lock(&self.private).pools.iter().map(|p| (p.id, Arc::clone(&p.pool))).collect()
    }

    fn sync_counts(&self, private: &Private) {
        self.routing.store(private.open.len(), Relaxed);
        self.private_count.store(private.pools.len(), Relaxed);
    }

    /// Forgets released private pools that hold no live block (giving their memory back).
    fn drop_finished(&self, private: &mut Private) {
        let retired = &mut private.retired;
        private.pools.retain(|p| {
            let finished = p.released && p.pool.live_blocks().is_empty();
            if finished {
                let _ = p.pool.close();
                add_stats(retired, &p.pool.stats());
            }
            !finished
        });
        self.sync_counts(private);
    }

    fn begin(&self, id: MempoolId) -> Result<(), PoolError> {
        let mut private = lock(&self.private);
        match private.pools.iter_mut().find(|p| p.id == id) {
            Some(p) => p.released = false,
            None => {
                let pool = Pool::new(Arc::clone(&self.device), self.config.clone())?;
                if let Some(limit) = *lock(&self.limit) {
                    pool.set_limit(Some(limit))?;
                }
                private.pools.push(PrivatePool { id, pool: Arc::new(pool), released: false });
            }
        }
        private.open.push(id);
        self.sync_counts(&private);
        Ok(())
    }

    fn end(&self, id: MempoolId) -> bool {
        let mut private = lock(&self.private);
        let found = private.open.iter().rposition(|&o| o == id).map(|i| private.open.remove(i)).is_some();
        self.sync_counts(&private);
        found
    }

    fn release(&self, id: MempoolId) -> bool {
        let mut private = lock(&self.private);
        private.open.retain(|&o| o != id);
        let found = match private.pools.iter_mut().find(|p| p.id == id) {
            Some(p) => {
                p.released = true;
                let _ = p.pool.trim();
                true
            }
            None => false,
        };
        self.drop_finished(&mut private);
        found
    }

    /// Frees a block of this device's main pool or one of its private pools.
    fn free(&self, addr: u64, size: Option<u64>, stream: StreamId) -> Result<(), PoolError> {
        let err = match self.pool.free(addr, size, Some(stream)) {
            Ok(()) => return Ok(()),
            Err(e @ PoolError::InvalidFree { reason: vrampool_core::InvalidFreeReason::NotAllocated, .. }) => e,
            Err(e) => return Err(e),
        };
        for (_, pool) in self.private_pools() {
            match pool.free(addr, size, Some(stream)) {
                Ok(()) => {
                    let mut private = lock(&self.private);
                    self.drop_finished(&mut private);
                    return Ok(());
                }
                Err(PoolError::InvalidFree { reason: vrampool_core::InvalidFreeReason::NotAllocated, .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(err)
    }

    fn record_stream(&self, addr: u64, stream: StreamId) -> bool {
        self.pool.record_stream(addr, stream).is_ok() || self.private_pools().iter().any(|(_, p)| p.record_stream(addr, stream).is_ok())
    }

    fn trim(&self) -> Result<u64, PoolError> {
        let mut bytes = self.pool.trim()?;
        for (_, pool) in self.private_pools() {
            bytes += pool.trim()?;
        }
        let mut private = lock(&self.private);
        self.drop_finished(&mut private);
        Ok(bytes)
    }

    fn set_limit(&self, limit: Limit) -> Result<(), PoolError> {
        self.pool.set_limit(Some(limit))?;
        for (_, pool) in self.private_pools() {
            pool.set_limit(Some(limit))?;
        }
        *lock(&self.limit) = Some(limit);
        Ok(())
    }

    /// The main pool's figures plus the private pools', those gone included (their peaks add up
    /// to an upper bound).
    fn stats(&self) -> Stats {
        let mut stats = self.pool.stats();
        for (_, pool) in self.private_pools() {
            add_stats(&mut stats, &pool.stats());
        }
        add_stats(&mut stats, &lock(&self.private).retired);
        stats
    }

    fn reset_peak_stats(&self) {
        self.pool.reset_peak_stats();
        self.private_pools().iter().for_each(|(_, p)| p.reset_peak_stats());
        let retired = &mut lock(&self.private).retired;
        for c in [&mut retired.allocated_bytes, &mut retired.requested_bytes, &mut retired.reserved_bytes, &mut retired.active_bytes, &mut retired.allocation, &mut retired.segment] {
            c.peak = c.current;
        }
    }

    fn all_pools(&self) -> Vec<(MempoolId, PoolRef<'_>)> {
        let mut pools = vec![(MempoolId { first: 0, second: 0 }, PoolRef::Main(&self.pool))];
        pools.extend(self.private_pools().into_iter().map(|(id, p)| (id, PoolRef::Private(p))));
        pools
    }
}

enum PoolRef<'a> {
    Main(&'a Pool),
    Private(Arc<Pool>),
}

impl std::ops::Deref for PoolRef<'_> {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        match self {
            Self::Main(p) => p,
            Self::Private(p) => p,
        }
    }
}

fn add_counter(a: &mut CounterValues, b: &CounterValues) {
    a.current += b.current;
    a.peak += b.peak;
    a.allocated += b.allocated;
    a.freed += b.freed;
}

fn add_stats(a: &mut Stats, b: &Stats) {
    for (x, y) in [
        (&mut a.allocated_bytes, &b.allocated_bytes),
        (&mut a.requested_bytes, &b.requested_bytes),
        (&mut a.reserved_bytes, &b.reserved_bytes),
        (&mut a.active_bytes, &b.active_bytes),
        (&mut a.allocation, &b.allocation),
        (&mut a.segment, &b.segment),
    ] {
        add_counter(x, y);
    }
    a.num_alloc_retries += b.num_alloc_retries;
    a.num_ooms += b.num_ooms;
    a.num_device_alloc += b.num_device_alloc;
    a.num_device_free += b.num_device_free;
    a.fast_path_hits += b.fast_path_hits;
    a.deferred_frees += b.deferred_frees;
    a.largest_free_bytes = a.largest_free_bytes.max(b.largest_free_bytes);
    a.cached_bytes += b.cached_bytes;
}

/// The entries, by device ordinal: read with one atomic load on every call, written once under
/// `REGISTRY`'s lock. Entries are leaked, so a reference to one stays valid for the process's
/// life (`_abi_reset` only unhooks them).
static SLOTS: [AtomicPtr<DeviceEntry>; MAX_DEVICES] = [const { AtomicPtr::new(null_mut()) }; MAX_DEVICES];

/// The configuration in force: None until first needed (then read from `VRAMPOOL_CONF`).
static REGISTRY: Mutex<Option<Settings>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn settings_in(registry: &mut Option<Settings>) -> Result<&Settings, String> {
    if registry.is_none() {
        *registry = Some(Settings::parse(&env_text(), "")?);
    }
    Ok(registry.as_ref().expect("set just above"))
}

fn slot_index(device: c_int) -> Result<usize, String> {
    usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES).ok_or_else(|| format!("device {device} is not a device ordinal (0..{MAX_DEVICES})"))
}

/// The entry of `device` if its pool exists.
fn existing(device: c_int) -> Option<&'static DeviceEntry> {
    let p = SLOTS.get(usize::try_from(device).ok()?)?.load(Acquire);
    // SAFETY: a non-null slot points at a leaked entry, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn all_entries() -> Vec<&'static DeviceEntry> {
    (0..MAX_DEVICES as c_int).filter_map(existing).collect()
}

/// The entry of `device`, made (with its pool) on first use.
fn entry(device: c_int) -> Result<&'static DeviceEntry, String> {
    let index = slot_index(device)?;
    let p = SLOTS[index].load(Acquire);
    if !p.is_null() {
        // SAFETY: a non-null slot points at a leaked entry, never freed.
        return Ok(unsafe { &*p });
    }
    make_entry(index)
}

#[cold]
fn make_entry(index: usize) -> Result<&'static DeviceEntry, String> {
    let mut registry = lock(&REGISTRY);
    let p = SLOTS[index].load(Acquire);
    if !p.is_null() {
        // SAFETY: as in `entry`.
        return Ok(unsafe { &*p });
    }
    let settings = settings_in(&mut registry)?.clone();
    let ordinal = index as i32;
    let (device, sim): (Arc<dyn Device>, _) = match settings.device {
        DeviceKind::Cuda => {
            let device = vrampool_cuda::CudaDevice::new(ordinal).map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
            (Arc::new(device), None)
        }
        DeviceKind::Sim => {
            let sim = Arc::new(SimDevice::new(settings.sim_capacity, SimMode::HostBacked).with_ordinal(ordinal));
            (sim.clone() as Arc<dyn Device>, Some(sim))
        }
    };
    let pool = Pool::new(Arc::clone(&device), settings.config.clone()).map_err(|e| e.to_string())?;
    let entry = Box::leak(Box::new(DeviceEntry {
        ordinal,
        device,
        sim,
        config: settings.config,
        pool,
        limit: Mutex::new(None),
        private: Mutex::default(),
        routing: AtomicUsize::new(0),
        private_count: AtomicUsize::new(0),
    }));
    SLOTS[index].store(entry, Release);
    Ok(entry)
}

/// Sets the configuration for pools made from now on; refused once a pool exists, unless it
/// would not change.
fn configure_text(text: &str) -> Result<String, String> {
    let mut registry = lock(&REGISTRY);
    let settings = Settings::parse(&env_text(), text)?;
    let live: Vec<i32> = all_entries().iter().map(|e| e.ordinal).collect();
    if !live.is_empty() {
        let current = settings_in(&mut registry)?;
        if current.config == settings.config && current.device == settings.device && current.sim_capacity == settings.sim_capacity {
            return Ok(current.text.clone());
        }
        return Err(format!(
            "vrampool already serves allocations on device(s) {live:?} with `{}`; configure before the first allocation",
            current.text
        ));
    }
    let text = settings.text.clone();
    *registry = Some(settings);
    Ok(text)
}

// ---- failures ----

static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);
static LAST_OOM: Mutex<Option<OomRecord>> = Mutex::new(None);
static FAILED_MALLOCS: AtomicU64 = AtomicU64::new(0);
static REFUSED_FREES: AtomicU64 = AtomicU64::new(0);
static REFUSED_RECORD_STREAMS: AtomicU64 = AtomicU64::new(0);
static OTHER_ERRORS: AtomicU64 = AtomicU64::new(0);
static PANICS: AtomicU64 = AtomicU64::new(0);
/// Whether a failed `vrampool_torch_malloc` throws a C++ exception instead of returning null.
static RAISE_ON_FAILURE: AtomicBool = AtomicBool::new(false);

/// The figures of the last allocation that failed for want of memory.
#[derive(Debug, Clone)]
struct OomRecord {
    device: i32,
    stream: u64,
    report: OomReport,
    /// The most the pool may reserve (limit or device total).
    capacity: u64,
    /// The request is larger than the pool could ever hold (no retry could help).
    too_large: bool,
    strategy: &'static str,
    round_up_divisions: u32,
    num_ooms: u64,
    message: String,
}

fn record_error(message: String) {
    *lock(&LAST_ERROR) = Some(message);
}

/// Runs an entry's body; a panic becomes a recorded error and `fallback`.
fn guard<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            PANICS.fetch_add(1, Relaxed);
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            record_error(format!("vrampool_{what}: internal error (panic): {detail}"));
            fallback
        }
    }
}

/// `CU_STREAM_LEGACY` (1) names the same stream as handle 0.
fn canonical_stream(stream: *mut c_void) -> StreamId {
    match stream as u64 {
        1 => StreamId(0),
        s => StreamId(s),
    }
}

fn human(bytes: u64) -> String {
    vrampool_core::error::human(bytes)
}

/// Allocates, or says why not (the message a C++ exception would carry).
fn malloc_inner(size: usize, device: c_int, stream: *mut c_void) -> Result<u64, String> {
    let entry = entry(device).map_err(|e| format!("vrampool_malloc: {e}"))?;
    let stream = canonical_stream(stream);
    let target = entry.target();
    let pool: &Pool = target.as_deref().unwrap_or(&entry.pool);
    let size = size as u64;
    let planned = (target.is_none() && PLANNED_ON.load(Relaxed)).then(|| planned_for(entry));
    match planned.map_or_else(|| pool.allocate(size, stream), |p| p.allocate(size, stream)) {
        Ok(addr) => Ok(addr),
        Err(PoolError::OutOfMemory(report)) => Err(record_oom(entry, pool, stream, report, false)),
        Err(PoolError::InvalidSize { .. }) => {
            // Larger than the pool may ever reserve: an out-of-memory for the caller too.
            let stats = pool.stats();
            let report = OomReport {
                requested: size,
                allocated: stats.allocated_bytes.current,
                reserved: stats.reserved_bytes.current,
                largest_free: stats.largest_free_bytes,
                device_free: entry.device.mem_info().map(|m| m.free).unwrap_or(0),
                limit: None, // set by `record_oom`
            };
            Err(record_oom(entry, pool, stream, report, true))
        }
        Err(e) => Err(format!("vrampool_malloc of {size} bytes on device {device}: {e}")),
    }
}

fn record_oom(entry: &DeviceEntry, pool: &Pool, stream: StreamId, mut report: OomReport, too_large: bool) -> String {
    let num_ooms = pool.stats().num_ooms;
    let config = pool.config();
    let capacity = pool.capacity();
    // A limit set by `vrampool_memory_fraction` counts as much as one configured.
    let limited = config.limit.is_some() || lock(&entry.limit).is_some();
    report.limit = limited.then_some(capacity);
    let mut message = format!(
        "CUDA out of memory. vrampool could not allocate {} on device {}: ",
        human(report.requested),
        entry.ordinal
    );
    if too_large {
        message.push_str(&format!("the request is larger than the pool may ever reserve ({}); ", human(capacity)));
    }
    message.push_str(&format!("{report}. vrampool.torch.last_oom() says what to try."));
    *lock(&LAST_OOM) = Some(OomRecord {
        device: entry.ordinal,
        stream: stream.0,
        report,
        capacity,
        too_large,
        strategy: config.strategy.name(),
        round_up_divisions: config.round_up_divisions,
        num_ooms,
        message: message.clone(),
    });
    message
}

// ---- the message of the C++ exception (only under `raise_on_failure`) ----

extern "C" {
    /// `csrc/malloc.c`: whether libstdc++ is loaded, so that a failed `vrampool_torch_malloc` can throw.
    fn vrampool_cxx_can_throw() -> c_int;
}

/// Writes `message` into `room` for C, NUL-terminated, without inner NULs, cut to fit.
fn to_c_message(message: &str, room: &mut [u8]) {
    let Some(last) = room.len().checked_sub(1) else { return };
    let mut len = 0;
    for b in message.bytes().filter(|&b| b != 0).take(last) {
        room[len] = b;
        len += 1;
    }
    room[len] = 0;
}

// ---- the C ABI ----

/// Allocates `size` bytes on `device` for use on `stream`. Null for 0 bytes, and on failure
/// (then `last_error`, and for out-of-memory `last_oom`, say why). Never throws: any caller may
/// use it.
#[no_mangle]
pub extern "C" fn vrampool_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    match try_malloc(size, device, stream) {
        Ok(ptr) => ptr,
        Err(reason) => {
            malloc_failed(reason);
            null_mut()
        }
    }
}

/// `vrampool_torch_malloc` (`csrc/malloc.c`, PyTorch's entry) without the throw: as
/// `vrampool_malloc`, and under `raise_on_failure` a failure also writes the message of the
/// exception that `vrampool_torch_malloc` then throws into `message` (`capacity` bytes).
#[no_mangle]
pub extern "C" fn vrampool_torch_malloc_or_message(size: usize, device: c_int, stream: *mut c_void, message: *mut c_char, capacity: usize) -> *mut c_void {
    match try_malloc(size, device, stream) {
        Ok(ptr) => ptr,
        Err(reason) => {
            if let Some(text) = malloc_failed(reason) {
                if !message.is_null() {
                    // SAFETY: the C caller passes `message` with room for `capacity` bytes.
                    let room = unsafe { std::slice::from_raw_parts_mut(message.cast::<u8>(), capacity) };
                    to_c_message(&text, room);
                }
            }
            null_mut()
        }
    }
}

/// A block (null for 0 bytes), or why not.
#[inline(always)]
fn try_malloc(size: usize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, String> {
    if size == 0 {
        return Ok(null_mut());
    }
    // `String::new()` allocates nothing: the fast path stays free of allocation.
    guard("malloc", Err(String::new()), || malloc_inner(size, device, stream)).map(|addr| addr as *mut c_void)
}

/// The slow end of a failed allocation: counts and records it; under `raise_on_failure`, the
/// message of the exception to throw.
#[cold]
#[inline(never)]
fn malloc_failed(reason: String) -> Option<String> {
    FAILED_MALLOCS.fetch_add(1, Relaxed);
    let raise = RAISE_ON_FAILURE.load(Relaxed);
    if reason.is_empty() {
        // The guard caught a panic and recorded it already.
        return raise.then(|| "vrampool_malloc: internal error (see vrampool last_error)".to_string());
    }
    let text = raise.then(|| reason.clone());
    record_error(reason);
    text
}

/// Frees a block `vrampool_malloc` returned. Null is a no-op; `size` 0 means "not known"; a
/// pointer that is not a live block (double free, foreign pointer, wrong size) is refused and
/// recorded, never a crash.
#[no_mangle]
pub extern "C" fn vrampool_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    guard("free", (), || {
        let size = (size != 0).then_some(size as u64);
        let stream = canonical_stream(stream);
        let result = match existing(device) {
            Some(entry) => planned_free(entry, ptr as u64, size, stream)
                .unwrap_or_else(|| entry.free(ptr as u64, size, stream))
                .map_err(|e| e.to_string()),
            None => Err(format!("no vrampool pool on device {device}")),
        };
        if let Err(e) = result {
            REFUSED_FREES.fetch_add(1, Relaxed);
            record_error(format!("vrampool_free({ptr:p}, {}, device {device}): refused: {e}", size.unwrap_or(0)));
        }
    })
}

/// PyTorch's `init(device_count)`: reads the configuration, so that a bad `VRAMPOOL_CONF` is
/// reported before the first allocation. Pools are still made on first use.
#[no_mangle]
pub extern "C" fn vrampool_init(device_count: c_int) {
    guard("init", (), || {
        if let Err(e) = settings_in(&mut lock(&REGISTRY)) {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_init({device_count}): {e}"));
        }
    })
}

/// `torch.cuda.empty_cache()`: gives every wholly free segment of every pool back to the device.
#[no_mangle]
pub extern "C" fn vrampool_reset() {
    guard("reset", (), || {
        if let Err(e) = trim_all() {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_reset: {e}"));
        }
    })
}

fn trim_all() -> Result<u64, String> {
    let mut bytes = 0;
    let mut first_error = None;
    for entry in all_entries() {
        match entry.trim() {
            Ok(b) => bytes += b,
            Err(e) => {
                first_error.get_or_insert(format!("device {}: {e}", entry.ordinal));
            }
        }
    }
    first_error.map_or(Ok(bytes), Err)
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`: caps what `device`'s pool
/// may reserve at `fraction` of the device's memory (0 allows nothing); out of [0, 1] is refused.
#[no_mangle]
pub extern "C" fn vrampool_memory_fraction(fraction: f64, device: c_int) {
    guard("memory_fraction", (), || {
        let result = if !(0.0..=1.0).contains(&fraction) {
            Err(format!("fraction must lie in [0, 1], got {fraction}"))
        } else {
            let limit = if fraction == 0.0 { Limit::Bytes(1) } else { Limit::Fraction(fraction) };
            entry(device).and_then(|e| e.set_limit(limit).map_err(|e| e.to_string()))
        };
        if let Err(e) = result {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_memory_fraction({fraction}, device {device}): {e}"));
        }
    })
}

/// PyTorch's `getBaseAllocation`: the start of the segment holding `ptr`, its size in `*size`;
/// null (and 0) when no pool holds `ptr`.
#[no_mangle]
pub extern "C" fn vrampool_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    guard("base_alloc", null_mut(), || {
        let addr = ptr as u64;
        let found = all_entries().into_iter().find_map(|entry| {
            entry.all_pools().iter().find_map(|(_, pool)| {
                pool.snapshot().into_iter().find(|s| s.base <= addr && addr < s.base + s.size).map(|s| (s.base, s.size))
            })
        });
        let (base, bytes) = found.unwrap_or_else(|| {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_base_alloc({ptr:p}): not in any vrampool segment"));
            (0, 0)
        });
        if !size.is_null() {
            // SAFETY: the caller passes a pointer to a size_t (or null, skipped).
            unsafe { size.write(bytes as usize) };
        }
        base as *mut c_void
    })
}

/// `Tensor.record_stream(stream)`: the block at `ptr` is not reused, once freed, until the work
/// queued on `stream` before the free has completed.
#[no_mangle]
pub extern "C" fn vrampool_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guard("record_stream", (), || {
        let stream_id = canonical_stream(stream);
        let planned = planned_pools().into_iter().any(|(_, p)| p.record_stream(ptr as u64, stream_id).is_ok());
        if !planned && !all_entries().iter().any(|e| e.record_stream(ptr as u64, stream_id)) {
            REFUSED_RECORD_STREAMS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_record_stream({ptr:p}, {stream:p}): refused: not a live block of any vrampool pool"));
        }
    })
}

/// PyTorch's `beginAllocateToPool` (CUDA graph capture, private pools): allocations on `device`
/// go to the private pool `id` until `vrampool_end_allocate_to_pool`. The stream filter (a C++
/// `std::function`, passed by reference) cannot be called from here, so every allocation on the
/// device is routed meanwhile: safe (the pool's blocks are never reused outside it), at worst
/// wasteful for other streams' allocations during a capture.
#[no_mangle]
pub extern "C" fn vrampool_begin_allocate_to_pool(device: c_int, id: MempoolId, _filter: *const c_void) {
    guard("begin_allocate_to_pool", (), || {
        if let Err(e) = entry(device).and_then(|e| e.begin(id).map_err(|e| e.to_string())) {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_begin_allocate_to_pool(device {device}, ({}, {})): {e}", id.first, id.second));
        }
    })
}

/// PyTorch's `endAllocateToPool`: allocations stop going to the private pool `id`.
#[no_mangle]
pub extern "C" fn vrampool_end_allocate_to_pool(device: c_int, id: MempoolId) {
    guard("end_allocate_to_pool", (), || {
        if !existing(device).is_some_and(|e| e.end(id)) {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_end_allocate_to_pool(device {device}, ({}, {})): no such open pool", id.first, id.second));
        }
    })
}

/// PyTorch's `releasePool`: the private pool `id` gives its free memory back, and goes once its
/// last block is freed.
#[no_mangle]
pub extern "C" fn vrampool_release_pool(device: c_int, id: MempoolId) {
    guard("release_pool", (), || {
        if !existing(device).is_some_and(|e| e.release(id)) {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_release_pool(device {device}, ({}, {})): no such pool", id.first, id.second));
        }
    })
}

/// Sets the configuration (`VRAMPOOL_CONF`'s form; applied over it) before the first
/// allocation. 0 on success, -1 otherwise (see `vrampool_last_error`).
///
/// # Safety
/// `text` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn vrampool_configure(text: *const c_char) -> c_int {
    let text = if text.is_null() { String::new() } else { CStr::from_ptr(text).to_string_lossy().into_owned() };
    guard("configure", -1, || match configure_text(&text) {
        Ok(_) => 0,
        Err(e) => {
            OTHER_ERRORS.fetch_add(1, Relaxed);
            record_error(format!("vrampool_configure: {e}"));
            -1
        }
    })
}

/// Copies the last error's message (NUL-terminated, cut to fit) into `buffer`; returns its full
/// length in bytes, 0 when there was none.
///
/// # Safety
/// `buffer` is null or points to `capacity` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrampool_last_error(buffer: *mut c_char, capacity: usize) -> usize {
    guard("last_error", 0, || {
        let message = lock(&LAST_ERROR).clone().unwrap_or_default();
        if !buffer.is_null() && capacity > 0 {
            let n = message.len().min(capacity - 1);
            // SAFETY: the caller gives `capacity` writable bytes; n + 1 <= capacity.
            unsafe {
                ptr::copy_nonoverlapping(message.as_ptr(), buffer.cast::<u8>(), n);
                buffer.add(n).write(0);
            }
        }
        message.len()
    })
}

// ---- the planned arena: a mode of the allocator ----

type DevicePlanned = PlannedPool<&'static PoolCore>;

/// Whether `vrampool_malloc` serves the main pools' allocations through the planned arena.
static PLANNED_ON: AtomicBool = AtomicBool::new(false);
/// A planned arena per device, made on its first planned allocation and kept (its buffers may outlive the
/// mode); `PLANNED_COUNT` lets frees skip them while there are none.
static PLANNED: Mutex<Vec<(i32, Arc<DevicePlanned>)>> = Mutex::new(Vec::new());
static PLANNED_COUNT: AtomicUsize = AtomicUsize::new(0);
/// The key the last `vrampool_planned_step` named: a planned arena made later starts under it.
static PLANNED_KEY: AtomicU64 = AtomicU64::new(vrampool_plan::DEFAULT_KEY);

fn planned_for(entry: &'static DeviceEntry) -> Arc<DevicePlanned> {
    let mut planned = lock(&PLANNED);
    if let Some((_, p)) = planned.iter().find(|(ordinal, _)| *ordinal == entry.ordinal) {
        return Arc::clone(p);
    }
    let core: &'static PoolCore = &entry.pool;
    let p = Arc::new(PlannedPool::new(core));
    p.step(PLANNED_KEY.load(Relaxed));
    planned.push((entry.ordinal, Arc::clone(&p)));
    PLANNED_COUNT.store(planned.len(), Relaxed);
    p
}

fn planned_pools() -> Vec<(i32, Arc<DevicePlanned>)> {
    if PLANNED_COUNT.load(Relaxed) == 0 {
        return Vec::new();
    }
    lock(&PLANNED).clone()
}

/// Device `ordinal`'s planned arena, if it has made one.
fn planned_of(ordinal: i32) -> Option<Arc<DevicePlanned>> {
    if PLANNED_COUNT.load(Relaxed) == 0 {
        return None;
    }
    lock(&PLANNED).iter().find(|(o, _)| *o == ordinal).map(|(_, p)| Arc::clone(p))
}

/// Frees `addr` through `entry`'s planned arena if it is the arena's to answer; None if not.
fn planned_free(entry: &DeviceEntry, addr: u64, size: Option<u64>, stream: StreamId) -> Option<Result<(), PoolError>> {
    let planned = planned_of(entry.ordinal)?;
    planned.claims(addr).then(|| planned.free(addr, size, Some(stream)))
}

fn set_planned(on: bool) {
    PLANNED_ON.store(on, Relaxed);
    if !on {
        // Out of the mode the arena only waits for its last buffers: give it back once they are gone.
        for (_, p) in planned_pools() {
            let _ = p.release_idle_arena();
        }
    }
}

/// Turns the planned arena on (non-zero) or off for the main pools' allocations. On, each device's
/// allocations are recorded per iteration (`vrampool_planned_step`) and, once an iteration's sequence has
/// been seen, served from one arena at planned offsets, falling back to the pool on divergence.
#[no_mangle]
pub extern "C" fn vrampool_planned_enable(on: c_int) {
    guard("planned_enable", (), || set_planned(on != 0))
}

/// An iteration boundary on every device's planned arena; `key` is the signature of the next iteration
/// (e.g. a hash of the input shapes), whose plan is kept apart from other keys'.
#[no_mangle]
pub extern "C" fn vrampool_planned_step(key: u64) {
    guard("planned_step", (), || {
        let planned = lock(&PLANNED);
        PLANNED_KEY.store(key, Relaxed);
        planned.iter().for_each(|(_, p)| p.step(key));
    })
}

// ---- Python ----

/// Sets the configuration for the pools the C ABI makes (text form, applied over
/// `VRAMPOOL_CONF`); refused once one exists with another. Returns the text in force.
#[pyfunction]
#[pyo3(signature = (text = ""))]
fn configure(text: &str) -> PyResult<String> {
    configure_text(text).map_err(PyValueError::new_err)
}

/// The configuration in force (reading `VRAMPOOL_CONF` if nothing set it yet), and the devices
/// that have a pool.
#[pyfunction]
fn configuration(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let settings = settings_in(&mut lock(&REGISTRY)).cloned().map_err(PyValueError::new_err)?;
    let d = PyDict::new(py);
    d.set_item("text", &settings.text)?;
    d.set_item("device", if settings.device == DeviceKind::Sim { "sim" } else { "cuda" })?;
    d.set_item("sim_capacity", settings.sim_capacity)?;
    d.set_item("expandable", settings.expandable)?;
    d.set_item("strategy", settings.config.strategy.name())?;
    d.set_item("small_max", settings.config.small_max)?;
    d.set_item("large_min", settings.config.large_min)?;
    d.set_item("alignment", settings.config.alignment)?;
    d.set_item("round_up_divisions", settings.config.round_up_divisions)?;
    let limit = match settings.config.limit {
        None => py.None(),
        Some(Limit::Bytes(b)) => b.into_pyobject(py)?.into_any().unbind(),
        Some(Limit::Fraction(f)) => f.into_pyobject(py)?.into_any().unbind(),
    };
    d.set_item("limit", limit)?;
    d.set_item("record_events", settings.config.record_events)?;
    d.set_item("devices", all_entries().iter().map(|e| e.ordinal).collect::<Vec<_>>())?;
    d.set_item("raise_on_failure", RAISE_ON_FAILURE.load(Relaxed))?;
    Ok(d)
}

/// The message of the last failure of any C ABI call (any thread), or None.
#[pyfunction]
fn last_error() -> Option<String> {
    lock(&LAST_ERROR).clone()
}

/// Forgets the last error and the last out-of-memory report.
#[pyfunction]
fn clear_last_error() {
    *lock(&LAST_ERROR) = None;
    *lock(&LAST_OOM) = None;
}

/// The last allocation that failed for want of memory, as a dict of figures, or None.
#[pyfunction]
fn last_oom(py: Python<'_>) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(r) = lock(&LAST_OOM).clone() else { return Ok(None) };
    let d = PyDict::new(py);
    let free = r.report.reserved.saturating_sub(r.report.allocated);
    let fragmentation = if free == 0 { 0.0 } else { 1.0 - r.report.largest_free.min(free) as f64 / free as f64 };
    d.set_item("device", r.device)?;
    d.set_item("stream", r.stream)?;
    d.set_item("requested", r.report.requested)?;
    d.set_item("allocated", r.report.allocated)?;
    d.set_item("reserved", r.report.reserved)?;
    d.set_item("free", free)?;
    d.set_item("largest_free", r.report.largest_free)?;
    d.set_item("fragmentation", fragmentation)?;
    d.set_item("device_free", r.report.device_free)?;
    d.set_item("limit", r.report.limit)?;
    d.set_item("capacity", r.capacity)?;
    d.set_item("too_large", r.too_large)?;
    d.set_item("strategy", r.strategy)?;
    d.set_item("round_up_divisions", r.round_up_divisions)?;
    d.set_item("num_ooms", r.num_ooms)?;
    d.set_item("message", r.message)?;
    Ok(Some(d))
}

/// `device`'s figures under PyTorch's key names (main and private pools together); zeros where
/// the device has no pool yet.
#[pyfunction]
fn abi_stats(py: Python<'_>, device: i32) -> PyResult<Bound<'_, PyDict>> {
    let stats = existing(device).map(DeviceEntry::stats).unwrap_or_default();
    let d = stats_dict(py, &stats)?;
    d.set_item("capacity_bytes", existing(device).map_or(0, |e| e.pool.capacity()))?;
    Ok(d)
}

#[pyfunction]
fn abi_reset_peak_stats(device: i32) {
    if let Some(e) = existing(device) {
        e.reset_peak_stats();
    }
}

/// Gives every wholly free segment of every pool back; returns the bytes given back. With the
/// GIL held, as `NativePool::trim`.
#[pyfunction]
fn abi_trim() -> PyResult<u64> {
    trim_all().map_err(PyRuntimeError::new_err)
}

/// Every segment of every pool: device, pool_id, stream, strategy, base, size and blocks (addr,
/// size, state, requested), in address order per pool.
#[pyfunction]
fn abi_snapshot(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for entry in all_entries() {
        for (id, pool) in entry.all_pools() {
            for seg in pool.snapshot() {
                let d = segment_dict(py, seg)?;
                d.set_item("device", entry.ordinal)?;
                d.set_item("pool_id", (id.first, id.second))?;
                list.append(d)?;
            }
        }
    }
    Ok(list)
}

/// Counts of refused or failed C ABI calls, and the private pools per device.
#[pyfunction]
fn abi_counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("failed_mallocs", FAILED_MALLOCS.load(Relaxed))?;
    d.set_item("refused_frees", REFUSED_FREES.load(Relaxed))?;
    d.set_item("refused_record_streams", REFUSED_RECORD_STREAMS.load(Relaxed))?;
    d.set_item("other_errors", OTHER_ERRORS.load(Relaxed))?;
    d.set_item("panics", PANICS.load(Relaxed))?;
    let private = PyDict::new(py);
    for entry in all_entries() {
        let ids: Vec<(u64, u64)> = entry.private_pools().iter().map(|(id, _)| (id.first, id.second)).collect();
        let open: Vec<(u64, u64)> = lock(&entry.private).open.iter().map(|id| (id.first, id.second)).collect();
        let e = PyDict::new(py);
        e.set_item("pools", ids)?;
        e.set_item("open", open)?;
        private.set_item(entry.ordinal, e)?;
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
    if let Some(on) = on {
        // SAFETY: a plain C function of csrc/malloc.c, safe to call at any time.
        if on && unsafe { vrampool_cxx_can_throw() } == 0 {
            return Err(PyRuntimeError::new_err("the C++ runtime (libstdc++) is not loaded in this process: import torch first"));
        }
        RAISE_ON_FAILURE.store(on, Relaxed);
    }
    Ok(RAISE_ON_FAILURE.load(Relaxed))
}

/// Drives the simulated device behind `device`'s pool: whether its events complete at once, and
/// completing the work queued so far on a stream.
#[pyfunction]
#[pyo3(signature = (device, auto_complete = None, complete_stream = None))]
fn abi_sim_control(device: i32, auto_complete: Option<bool>, complete_stream: Option<u64>) -> PyResult<()> {
    let sim = existing(device)
        .and_then(|e| e.sim.clone())
        .ok_or_else(|| PyValueError::new_err(format!("device {device} has no pool on the simulated device")))?;
    if let Some(on) = auto_complete {
        sim.set_auto_complete(on);
    }
    if let Some(stream) = complete_stream {
        sim.complete_stream(canonical_stream(stream as *mut c_void));
    }
    Ok(())
}

/// Gets, and with `on` sets, whether allocations go through the planned arena.
#[pyfunction]
#[pyo3(signature = (on = None))]
fn abi_planned(on: Option<bool>) -> bool {
    if let Some(on) = on {
        set_planned(on);
    }
    PLANNED_ON.load(Relaxed)
}

#[pyfunction]
fn abi_planned_step(key: u64) {
    vrampool_planned_step(key);
}

/// `device`'s planned-arena figures, or None where it has made no planned allocation.
#[pyfunction]
fn abi_planned_stats(py: Python<'_>, device: i32) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(planned) = planned_of(device) else { return Ok(None) };
    planned_stats_dict(py, &planned.stats()).map(Some)
}

/// For tests: closes and unhooks every pool (their memory stays reserved: blocks may be live),
/// forgets the configuration, the errors and the counters, and turns `raise_on_failure` off.
#[pyfunction]
fn _abi_reset() {
    let mut registry = lock(&REGISTRY);
    for slot in SLOTS.iter() {
        let p = slot.swap(null_mut(), Release);
        if !p.is_null() {
            // SAFETY: leaked entries are never freed; this one is only unhooked.
            let entry = unsafe { &*p };
            let _ = entry.pool.close();
            entry.private_pools().iter().for_each(|(_, p)| drop(p.close()));
        }
    }
    *registry = None;
    PLANNED_ON.store(false, Relaxed);
    PLANNED_COUNT.store(0, Relaxed);
    PLANNED_KEY.store(vrampool_plan::DEFAULT_KEY, Relaxed);
    lock(&PLANNED).clear();
    clear_last_error();
    for counter in [&FAILED_MALLOCS, &REFUSED_FREES, &REFUSED_RECORD_STREAMS, &OTHER_ERRORS, &PANICS] {
        counter.store(0, Relaxed);
    }
    RAISE_ON_FAILURE.store(false, Relaxed);
}

/// For tests: runs a panicking body through the same guard as every C ABI entry; returns what
/// the guard answered and the error it recorded.
#[pyfunction]
fn _abi_guard_selftest() -> (i64, Option<String>) {
    let answer = guard("selftest", -1i64, || panic!("selftest"));
    (answer, last_error())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_reads_the_environment_then_the_call() {
        let s = Settings::parse("device:sim,strategy:slab,sim_capacity:1GB", "strategy:best_fit,expandable:false").unwrap();
        assert_eq!(s.device, DeviceKind::Sim);
        assert_eq!(s.config.strategy.name(), "best_fit");
        assert_eq!(s.sim_capacity, 1 << 30);
        assert_eq!(s.expandable, Some(false));
        assert_eq!(s.text, "device:sim,strategy:slab,sim_capacity:1GB,strategy:best_fit,expandable:false");
        let d = Settings::parse("", "").unwrap();
        assert_eq!((d.device, d.sim_capacity, d.expandable, d.text.as_str()), (DeviceKind::Cuda, DEFAULT_SIM_CAPACITY, None, ""));
        assert_eq!(Settings::parse("", "device:gpu").unwrap().device, DeviceKind::Cuda);
    }

    #[test]
    fn bad_configuration_names_its_source() {
        let err = Settings::parse("strategy:fastest", "").unwrap_err();
        assert!(err.starts_with("VRAMPOOL_CONF `strategy:fastest`"), "{err}");
        for text in ["device:tpu", "sim_capacity:0", "colour:blue", "expandable:maybe", "limit:2x"] {
            let err = Settings::parse("", text).unwrap_err();
            assert!(err.starts_with("configuration `"), "{text}: {err}");
        }
        assert!(Settings::parse("", "colour:blue").unwrap_err().contains("unknown configuration key `colour`"));
    }

    #[test]
    fn mempool_id_has_the_layout_of_a_pair_of_u64() {
        assert_eq!(std::mem::size_of::<MempoolId>(), 16);
        assert_eq!(std::mem::align_of::<MempoolId>(), 8);
    }

    #[test]
    fn a_thrown_message_is_cut_to_fit_and_has_no_inner_nul() {
        let mut room = [0xffu8; 1024];
        to_c_message("out\0of memory", &mut room);
        assert_eq!(CStr::from_bytes_until_nul(&room).unwrap().to_str().unwrap(), "outof memory");
        to_c_message(&"x".repeat(5000), &mut room);
        assert_eq!(CStr::from_bytes_until_nul(&room).unwrap().to_bytes().len(), room.len() - 1);
        let mut tiny = [0xffu8; 1];
        to_c_message("oom", &mut tiny);
        assert_eq!(tiny, [0]);
        to_c_message("oom", &mut []);
    }

    #[test]
    fn a_guarded_panic_is_an_answer_and_a_record() {
        PANICS.store(0, Relaxed);
        assert_eq!(guard("unit", 7, || -> i32 { panic!("boom") }), 7);
        assert!(last_error().unwrap().contains("vrampool_unit: internal error (panic): boom"));
        assert_eq!(guard("unit", 7, || 3), 3);
    }

    #[test]
    fn legacy_stream_is_the_default_stream() {
        assert_eq!(canonical_stream(1 as *mut c_void), StreamId(0));
        assert_eq!(canonical_stream(2 as *mut c_void), StreamId(2));
        assert_eq!(canonical_stream(null_mut()), StreamId(0));
    }
}
