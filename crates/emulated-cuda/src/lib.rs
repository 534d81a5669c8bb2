//! An emulated CUDA driver: a `libcuda.so.1` that runs on host memory, for tests.
//!
//! It stands in for the NVIDIA driver so that vrampool's CUDA backend (cudarc's run-time
//! loading, `CudaDevice`, the pool over it, the C ABI, the Python faces) and the driver-API
//! clients over it (`cuda.bindings`, `cuda.core`, Numba) run on a CPU: device pointers are
//! host addresses; virtual memory is reserved, mapped and given access with real page
//! protections (touching memory that is only reserved faults, as on a GPU); every stream has a
//! worker thread, so asynchronous work is really pending when its call returns; events order
//! streams; a stream-order race check watches every access (see `race`). It is never shipped
//! and never loaded unless asked for: `scripts/emulated-cuda.sh CMD...` puts it on the loader
//! path as `libcuda.so.1`. The machine it emulates is set by environment variables (`config`).
//! None of its figures is a GPU figure.
//!
//! Calls it does not implement exist (every function of CUDA 13.0's driver API) and return
//! `CUDA_ERROR_NOT_SUPPORTED`, saying so on stderr once per function; `cuGetProcAddress` hands
//! them out too. Test-only entry points, all named `emucuda_*` (in `control`), read the call
//! counts, plan faults, read the race reports and queue the delayed "kernel".

mod abi;
mod calls;
mod config;
mod control;
mod driver;
mod entry;
mod memory;
mod names;
mod proc_address;
mod race;
mod streams;
mod symbols;
mod unsupported;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use abi::CuResult;
use calls::Calls;
use config::Config;
use memory::Memory;
use race::{Access, Actor, Races};
use streams::{Context, Event, Machine, Stream, Work};

/// The emulated machine: one per process, made at the first driver call.
pub(crate) struct Emulator {
    config: Config,
    calls: Calls,
    races: Races,
    memory: RwLock<Memory>,
    capacity: Vec<AtomicU64>,
    /// One primary context per device; never resized, so each has a fixed address (its handle).
    contexts: Vec<Context>,
    initialized: AtomicBool,
    streams: Mutex<HashMap<u64, Arc<Stream>>>,
    events: Mutex<HashMap<u64, Arc<Event>>>,
    next_event: AtomicU64,
    /// Illegal addresses touched by queued work.
    faults: AtomicU64,
}

static EMULATOR: OnceLock<Emulator> = OnceLock::new();

pub(crate) fn emulator() -> &'static Emulator {
    EMULATOR.get_or_init(|| {
        let config = Config::from_env();
        let devices = config.devices.max(0) as usize;
        Emulator {
            calls: Calls::new(&config.faults),
            races: Races::new(config.strict),
            memory: RwLock::new(Memory::new(devices)),
            capacity: (0..devices).map(|_| AtomicU64::new(config.memory)).collect(),
            contexts: (0..devices as i32).map(Context::new).collect(),
            initialized: AtomicBool::new(false),
            streams: Mutex::default(),
            events: Mutex::default(),
            next_event: AtomicU64::new(0xe700_0000_0010),
            faults: AtomicU64::new(0),
            config,
        }
    })
}

thread_local! {
    /// The thread's context stack (device ordinals); the top is current.
    static CURRENT: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    /// The thread's per-thread default stream, per device.
    static PER_THREAD: RefCell<HashMap<i32, Arc<Stream>>> = RefCell::new(HashMap::new());
}

impl Emulator {
    fn ready(&self) -> Result<(), CuResult> {
        if self.initialized.load(Relaxed) {
            Ok(())
        } else {
            Err(abi::NOT_INITIALIZED)
        }
    }

    fn device(&self, ordinal: i32) -> Result<i32, CuResult> {
        self.ready()?;
        if (0..self.contexts.len() as i32).contains(&ordinal) {
            Ok(ordinal)
        } else {
            Err(abi::INVALID_DEVICE)
        }
    }

    fn context_handle(&self, device: i32) -> u64 {
        &self.contexts[device as usize] as *const Context as u64
    }

    fn context_of(&self, handle: u64) -> Result<i32, CuResult> {
        (0..self.contexts.len() as i32).find(|&d| self.context_handle(d) == handle).ok_or(abi::INVALID_CONTEXT)
    }

    /// The calling thread's current context.
    fn current(&self) -> Result<&Context, CuResult> {
        self.ready()?;
        let device = CURRENT.with(|c| c.borrow().last().copied()).ok_or(abi::INVALID_CONTEXT)?;
        Ok(&self.contexts[device as usize])
    }

    fn set_current(&self, device: Option<i32>) {
        CURRENT.with(|c| {
            let mut stack = c.borrow_mut();
            stack.pop();
            if let Some(device) = device {
                stack.push(device);
            }
        });
    }

    /// The stream a handle names (0 and `CU_STREAM_LEGACY`: the current context's legacy
    /// default stream; `CU_STREAM_PER_THREAD`: this thread's own).
    fn stream(&self, handle: u64) -> Result<Arc<Stream>, CuResult> {
        match handle {
            abi::STREAM_NULL | abi::STREAM_LEGACY => Ok(Arc::clone(&self.current()?.legacy)),
            abi::STREAM_PER_THREAD => {
                let ctx = self.current()?;
                Ok(PER_THREAD.with(|p| {
                    Arc::clone(p.borrow_mut().entry(ctx.device).or_insert_with(|| {
                        let thread = std::thread::current().id();
                        let stream = Stream::new(ctx.device, 0, false, |_| {
                            format!("the per-thread default stream of {thread:?} on device {}", ctx.device)
                        });
                        ctx.streams.lock().push(Arc::clone(&stream));
                        stream
                    }))
                }))
            }
            other => {
                self.ready()?;
                self.streams.lock().get(&other).cloned().ok_or(abi::INVALID_HANDLE)
            }
        }
    }

    fn event(&self, handle: u64) -> Result<Arc<Event>, CuResult> {
        self.ready()?;
        self.events.lock().get(&handle).cloned().ok_or(abi::INVALID_HANDLE)
    }

    /// Queues `work` on `stream`, after what CUDA's implicit synchronisation orders before it.
    fn queue(&'static self, stream: &Arc<Stream>, work: Work, accesses: &[Access]) {
        let waits = self.contexts[stream.device as usize].implicit_waits(stream);
        streams::enqueue(self, stream, waits, Some(work), accesses);
    }

    /// Blocks until `stream`'s work so far is done; the host then comes after it.
    fn host_waits(&self, stream: &Stream) -> Result<(), CuResult> {
        let (upto, clock) = stream.snapshot();
        stream.wait_for(upto);
        self.races.host_learns(&clock);
        self.contexts[stream.device as usize].sticky_error()
    }

    /// The accesses of work touching `[addr, addr + len)` when it is device memory.
    fn device_accesses(&self, ranges: &[(u64, u64, bool)]) -> Vec<Access> {
        let memory = self.memory.read();
        ranges
            .iter()
            .filter(|&&(addr, len, _)| {
                len > 0 && matches!(memory.place(addr), memory::Place::Device { .. } | memory::Place::Reserved { .. })
            })
            .map(|&(addr, len, write)| Access { lo: addr, hi: addr + len, write })
            .collect()
    }

    /// Refuses a copy or memset whose device side the device may not touch now.
    fn check_device_range(&self, addr: u64, len: u64, write: bool, host_allowed: bool) -> Result<(), CuResult> {
        match self.memory.read().device_access(addr, len, write) {
            Ok(true) => Ok(()),
            Ok(false) if host_allowed => Ok(()),
            _ => Err(abi::INVALID_VALUE),
        }
    }

    /// Runs `write` on `[dst, dst + len)` if queued work may write there now; else an illegal
    /// address, sticky on the stream's context.
    fn device_write(&self, stream: &Stream, what: &str, dst: u64, len: u64, write: impl FnOnce(*mut u8)) {
        let memory = self.memory.read();
        match memory.device_access(dst, len, true) {
            Ok(true) => write(dst as *mut u8),
            _ => self.illegal_address(stream, what, dst, len),
        }
    }

    fn device_copy(&self, stream: &Stream, dst: u64, src: u64, len: u64) {
        let memory = self.memory.read();
        let ok = memory.device_access(dst, len, true).is_ok() && memory.device_access(src, len, false).is_ok();
        if !ok {
            return self.illegal_address(stream, "copy", dst, len);
        }
        // SAFETY: both ranges are device memory accessible now (checked under the memory lock
        // we hold) or host memory the caller handed to the copy and keeps until it is done.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
    }

    fn illegal_address(&self, stream: &Stream, what: &str, addr: u64, len: u64) {
        self.faults.fetch_add(1, Relaxed);
        self.contexts[stream.device as usize].sticky.store(abi::ILLEGAL_ADDRESS, Relaxed);
        self.races.report_fault(format!(
            "illegal address: {what} on {} touched [{addr:#x}, {:#x}), which is not mapped with access (CUDA_ERROR_ILLEGAL_ADDRESS is sticky on device {})",
            stream.label,
            addr + len,
            stream.device
        ));
    }

    /// The host is about to release `[lo, hi)`: pending work there that the host has not
    /// waited for is a race; it is reported, and then all pending work on those bytes is waited
    /// for, so that the release cannot pull pages from under a worker.
    fn host_releases(&self, what: &'static str, lo: u64, hi: u64) {
        self.races.check(Actor::Host, "the host", None, 0, what, &[Access { lo, hi, write: true }]);
        while self.races.pending_on(lo, hi) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

impl Machine for Emulator {
    fn races(&self) -> &Races {
        &self.races
    }

    fn execute(&self, stream: &Stream, work: &Work) {
        match *work {
            Work::Wait { ref on, upto } => on.wait_for(upto),
            Work::Kernel { dst, len, value, delay } => {
                std::thread::sleep(delay);
                self.device_write(stream, "kernel", dst, len, |ptr| {
                    // SAFETY: `device_write` checked that the range is device memory writable now
                    // and holds the memory lock, so it stays mapped while we write.
                    unsafe { std::ptr::write_bytes(ptr, value, len as usize) }
                });
            }
            Work::Fill { dst, count, value, width } => {
                let len = count * width as u64;
                self.device_write(stream, "memset", dst, len, |ptr| match width {
                    // SAFETY (each arm): as for the kernel; the range holds `count` elements.
                    1 => unsafe { std::ptr::write_bytes(ptr, value as u8, len as usize) },
                    2 => (0..count as usize).for_each(|i| unsafe { (ptr as *mut u16).add(i).write_unaligned(value as u16) }),
                    _ => (0..count as usize).for_each(|i| unsafe { (ptr as *mut u32).add(i).write_unaligned(value) }),
                });
            }
            Work::Copy { dst, src, len } => self.device_copy(stream, dst, src, len),
            Work::CopyStaged { dst, ref bytes } => self.device_copy(stream, dst, bytes.as_ptr() as u64, bytes.len() as u64),
        }
    }
}
