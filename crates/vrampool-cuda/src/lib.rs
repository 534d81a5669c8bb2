//! vrampool's CUDA device: `vrampool_core::Device` over the CUDA driver API.
//!
//! The driver is reached through cudarc's raw bindings and loaded at run time (dlopen of
//! libcuda), so this crate builds on machines with no CUDA toolkit and a process without a
//! driver gets `DeviceError::Driver("CUDA driver not found: ...")` from `CudaDevice::new`
//! rather than a link error or a panic.
//!
//! ```no_run
//! use std::sync::Arc;
//! use vrampool_core::{Device, Pool, PoolConfig, StreamId};
//! use vrampool_cuda::CudaDevice;
//!
//! let device = Arc::new(CudaDevice::new(0)?);
//! let pool = Pool::new(device as Arc<dyn Device>, PoolConfig::default()).expect("pool");
//! let block = pool.allocate(1 << 20, StreamId(0)).expect("allocation");
//! pool.free(block, None, None).expect("free");
//! # Ok::<(), vrampool_core::DeviceError>(())
//! ```

mod calls;
mod device;
mod driver;

pub use device::{CudaDevice, Export, Handle, Sharing};
pub use driver::{check, error_from, has_symbol, load as load_driver};

/// cudarc's raw driver bindings, for callers that talk to the driver next to the pool (tests,
/// the benchmark). Every function in it is `unsafe`; call `load_driver` (or make a `CudaDevice`)
/// first, or cudarc panics when libcuda is missing.
pub use cudarc::driver::sys;
