//! `DeviceResource`: what every pool of the binding is, `NativePool`'s and each device's of the C
//! ABI alike: a core pool on a device, under the adaptors the C ABI needs (private pools, the
//! planned arena's mode), composed once here. A `NativePool` never opens a private pool nor
//! turns the mode on; both then cost it one relaxed load a call.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use vrampool_core::failures::OomRecord;
use vrampool_core::stats::Stats;
use vrampool_core::{
    CachedFree, Device, DeviceError, IpcHandles, Limit, LiveBlockInfo, MemoryResource, Pool, PoolConfig, PoolError, PoolSegment,
    PrivatePools, SimDevice, SimMode, StreamId,
};
use vrampool_cuda::{CudaDevice, Export};
use vrampool_steady::PlannedMode;

/// The adaptors over the pool, outermost first: a private pool takes an allocation before the
/// planned arena can.
pub type Stack = PrivatePools<PlannedMode<Pool>>;

/// The device a resource is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cuda,
    Sim { capacity: u64, mode: SimMode },
}

pub struct DeviceResource {
    stack: Stack,
    /// The simulated device, for tests and demos.
    sim: Option<Arc<SimDevice>>,
    /// The CUDA device, for sharing memory with other processes.
    cuda: Option<Arc<CudaDevice>>,
    /// This resource's number in the process (with the pid, what names it to importers).
    id: u64,
    /// The configuration text it was made from.
    conf: String,
}

impl DeviceResource {
    /// A pool on device `ordinal` of `backend`, configured by `conf` (its text, as given).
    pub fn open(backend: Backend, ordinal: i32, config: PoolConfig, conf: String) -> Result<Self, PoolError> {
        let (device, sim, cuda): (Arc<dyn Device>, _, _) = match backend {
            Backend::Cuda => {
                let cuda = Arc::new(match (config.ipc, config.ipc_handles) {
                    (false, _) => CudaDevice::new(ordinal)?,
                    (true, IpcHandles::Auto) => CudaDevice::new_shared(ordinal)?,
                    (true, IpcHandles::Legacy) => CudaDevice::new_shared_legacy(ordinal)?,
                });
                (Arc::clone(&cuda) as Arc<dyn Device>, None, Some(cuda))
            }
            Backend::Sim { capacity, mode } => {
                let sim = Arc::new(SimDevice::new(capacity, mode).with_ordinal(ordinal));
                (Arc::clone(&sim) as Arc<dyn Device>, Some(sim), None)
            }
        };
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let pool = Pool::new(Arc::clone(&device), config.clone())?;
        let planned = if config.steady { PlannedMode::steady(pool) } else { PlannedMode::new(pool) };
        Ok(Self { stack: PrivatePools::new(planned, device, config), sim, cuda, id: NEXT_ID.fetch_add(1, Relaxed), conf })
    }

    /// The adaptors: private pools (`begin`, `end`, `release`), over the planned mode.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    pub fn planned(&self) -> &PlannedMode<Pool> {
        self.stack.upstream()
    }

    /// The core pool under the adaptors.
    pub fn pool(&self) -> &Pool {
        self.planned().upstream()
    }

    pub fn sim(&self) -> Option<&SimDevice> {
        self.sim.as_deref()
    }

    pub fn ordinal(&self) -> i32 {
        self.pool().device().ordinal()
    }

    pub fn conf(&self) -> &str {
        &self.conf
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// A handle for the allocation under `[addr, addr + len)`, for another process.
    pub fn export(&self, addr: u64, len: u64) -> Result<Export, PoolError> {
        let cuda = self.cuda.as_ref().ok_or(DeviceError::Unsupported("sharing memory with other processes (a simulated device)"))?;
        Ok(cuda.export(addr, len)?)
    }

    /// What the pointers point at: "device" (CUDA memory), "host" (the host-backed simulated
    /// device: plain host memory) or "none" (the address-only simulated device).
    pub fn memory_kind(&self) -> &'static str {
        match self.sim().map(SimDevice::mode) {
            None => "device",
            Some(SimMode::HostBacked) => "host",
            Some(SimMode::AddressOnly) => "none",
        }
    }

    /// The out-of-memory record of an allocation of `size` bytes that failed with `error`, if it
    /// failed for want of memory.
    pub fn oom_record(&self, error: &PoolError, stream: StreamId, size: u64) -> Option<OomRecord> {
        let pool = self.pool();
        // A limit set later (`set_limit`: a memory fraction) counts as much as one configured.
        let limited = pool.config().limit.is_some() || self.stack.limit().is_some();
        OomRecord::of(error, self.ordinal(), stream, size, pool, &self.stack.stats(), limited)
    }

    /// The live blocks (for leak reports): the pool's, with each live arena buffer a block of its
    /// own and the arena's regions none, and the private pools' and tags'.
    pub fn live_blocks(&self) -> Vec<LiveBlockInfo> {
        let mut live = self.planned().live_blocks(self.pool().live_blocks());
        live.extend(self.stack.live_blocks());
        live
    }

    /// Closes the pool and the private pools (later calls are refused); returns the live blocks,
    /// or an error naming the bytes the device refused to take back (closed all the same).
    pub fn close(&self) -> Result<Vec<LiveBlockInfo>, PoolError> {
        // In a forked child, as every other call: the live blocks are the parent's.
        self.pool().check_process()?;
        // The idle arena is no leak: it goes back with the rest. One with live buffers stays, and
        // its buffers show as the live blocks they are, at the first close only, as the pool's do.
        let first = !self.pool().is_closed();
        self.planned().close();
        let (blocks, released) = self.pool().close_checked();
        let mut live = if first { self.planned().live_blocks(blocks) } else { Vec::new() };
        live.extend(self.stack.close());
        released.map(|()| live)
    }
}

impl MemoryResource for DeviceResource {
    #[inline]
    fn allocate(&self, size: u64, stream: StreamId) -> Result<u64, PoolError> {
        self.stack.allocate(size, stream)
    }
    #[inline]
    fn free(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> Result<(), PoolError> {
        self.stack.free(addr, size, stream)
    }
    #[inline(always)]
    fn allocate_cached(&self, size: u64, stream: StreamId) -> Option<u64> {
        self.stack.allocate_cached(size, stream)
    }
    #[inline(always)]
    fn free_cached(&self, addr: u64, size: Option<u64>, stream: Option<StreamId>) -> CachedFree {
        self.stack.free_cached(addr, size, stream)
    }
    fn free_parked(&self, addr: u64, stream: Option<StreamId>) -> Result<(), PoolError> {
        self.stack.free_parked(addr, stream)
    }
    fn record_stream(&self, addr: u64, stream: StreamId) -> Result<(), PoolError> {
        self.stack.record_stream(addr, stream)
    }
    fn trim(&self) -> Result<u64, PoolError> {
        self.stack.trim()
    }
    fn stats(&self) -> Stats {
        self.stack.stats()
    }
    fn reset_peak_stats(&self) {
        self.stack.reset_peak_stats()
    }
    fn snapshot(&self) -> Vec<PoolSegment> {
        self.stack.snapshot()
    }
    fn set_limit(&self, limit: Option<Limit>) -> Result<(), PoolError> {
        self.stack.set_limit(limit)
    }
    fn alignment(&self) -> u64 {
        self.stack.alignment()
    }
}
