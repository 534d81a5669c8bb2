//! vrampool's core: buddy, slab and best-fit pools (and their hybrid) over a device trait.
//!
//! No CUDA and no Python here: the CUDA driver and the bindings live in their own crates, and the
//! simulated device makes every algorithm testable on a CPU.
//!
//! ```
//! use std::sync::Arc;
//! use vrampool_core::{Pool, PoolConfig, SimDevice, SimMode, StreamId};
//!
//! let device = Arc::new(SimDevice::new(1 << 30, SimMode::AddressOnly));
//! let pool = Pool::new(device, PoolConfig::default()).unwrap();
//! let block = pool.allocate(4096, StreamId(0)).unwrap();
//! pool.free(block, None, None).unwrap();
//! assert_eq!(pool.stats().allocated_bytes.current, 0);
//! ```

mod arena;
mod barrier;
mod cache_class;
pub mod config;
pub mod device;
pub mod error;
pub mod event_log;
mod expandable;
pub mod failures;
mod fast_gate;
pub mod fork;
mod kept_run;
mod live_table;
mod magazine;
mod pool;
mod private_pools;
pub mod registry;
mod resource;
pub mod ring;
mod sharded_map;
pub mod sizes;
pub mod stats;
mod steal_cell;
pub mod strategy;
mod sync;
mod thread_cache;

pub use config::{AllocatorConfig, DeviceKind, IpcHandles, Limit, PoolConfig, Scrub};
pub use device::{Device, EventId, HostBuffer, MemInfo, SimDevice, SimMode, StreamId};
pub use error::{ArenaHeld, DeviceError, InvalidFreeReason, OomReport, PoolError};
pub use event_log::PieceEvent;
pub use event_log::{EventKind, LogEvent};
pub use pool::{BlockState, CachedFree, LiveBlockInfo, PauseReport, Pool, PoolCore, SegmentSnapshot};
pub use private_pools::{PrivatePools, TagInfo};
pub use registry::DeviceRegistry;
pub use resource::{MemoryResource, PoolId, PoolSegment};
pub use stats::Stats;
pub use strategy::StrategyKind;
