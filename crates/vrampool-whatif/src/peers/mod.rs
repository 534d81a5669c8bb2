//! Models of the allocators people run today, as replay strategies: PyTorch's
//! CUDACachingAllocator (plain and with expandable segments), RMM's `pool_memory_resource`,
//! CuPy's `MemoryPool`, and the driver's stream-ordered pool behind `cudaMallocAsync`.
//!
//! Each model follows its allocator's documented rules, with the source file and version each rule
//! comes from cited where the rule is written. They are models of policies, not ports: they track
//! what the allocator would reserve from the device and hand out for the same sequence of requests,
//! over the same simulated device the pool replays on, so a replay can put them side by side and a
//! capacity-limited replay can tell which of them runs out of memory. The `cudaMallocAsync` model
//! is approximate: the driver's pool is not documented beyond its release threshold.
//!
//! Options are the allocators' own (`PYTORCH_CUDA_ALLOC_CONF` keys for the PyTorch models), in the
//! `key:value,key:value` text form; an unknown key is an error that lists the valid ones.

mod blocks;
mod caching;
mod cupy;
mod held;
mod mappings;
mod rmm;

use std::sync::Arc;

use vrampool_core::config::{parse_bytes, split_pairs};
use vrampool_core::device::Device;
use vrampool_core::error::PoolError;
use vrampool_core::sizes::MIB;

pub use caching::{AsyncOptions, TorchOptions};
pub use cupy::CupyOptions;
pub use rmm::RmmOptions;

/// What a model holds and has done, in bytes and calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Bytes of the blocks handed out (their rounded sizes).
    pub allocated: u64,
    pub peak_allocated: u64,
    /// Bytes obtained from the device (segments, or mapped pages).
    pub reserved: u64,
    pub peak_reserved: u64,
    /// Device allocations (segment allocations, or map calls as the allocator counts them).
    pub device_allocs: u64,
    pub device_frees: u64,
    /// Allocations that released cached memory and tried again.
    pub alloc_retries: u64,
}

impl Figures {
    fn allocate(&mut self, bytes: u64) {
        self.allocated += bytes;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
    }

    fn free(&mut self, bytes: u64) {
        self.allocated -= bytes;
    }

    fn reserve(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.device_allocs += 1;
    }

    fn release(&mut self, bytes: u64) {
        self.reserved -= bytes;
        self.device_frees += 1;
    }
}

/// One allocator model: single-threaded, fed the requests of a trace in order.
pub trait PeerModel: Send {
    /// A block of at least `size` bytes for `stream`; out of memory after the allocator's own
    /// release-and-retry.
    fn allocate(&mut self, size: u64, stream: u64) -> Result<u64, PoolError>;
    /// Frees the block at `addr` (an address `allocate` returned and not yet freed).
    fn free(&mut self, addr: u64) -> Result<(), PoolError>;
    fn figures(&self) -> Figures;
    /// 1 - largest free block / all free bytes (0 when nothing is free).
    fn fragmentation(&self) -> f64;
    /// What the allocator's own "give back the cache" call returns to the device.
    fn empty_cache(&mut self);
}

/// A modelled allocator and its options.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerConfig {
    Torch(TorchOptions),
    Rmm(RmmOptions),
    Cupy(CupyOptions),
    Async(AsyncOptions),
}

/// The models' names, as `replay --strategy` takes them.
pub const PEER_NAMES: [&str; 5] = ["torch", "torch+expandable", "rmm", "cupy", "async"];

impl PeerConfig {
    /// The model called `name` (one of [`PEER_NAMES`]) with its default options; None for
    /// another name.
    pub fn named(name: &str) -> Option<Self> {
        Some(match name {
            "torch" => Self::Torch(TorchOptions::default()),
            "torch+expandable" => Self::Torch(TorchOptions { expandable: true, ..TorchOptions::default() }),
            "rmm" => Self::Rmm(RmmOptions::default()),
            "cupy" => Self::Cupy(CupyOptions::default()),
            "async" => Self::Async(AsyncOptions::default()),
            _ => return None,
        })
    }

    /// The model called `name` with `conf` (`key:value` pairs separated by commas) applied.
    pub fn parse(name: &str, conf: &str) -> Result<Self, PoolError> {
        let mut config = Self::named(name).ok_or_else(|| {
            PoolError::InvalidConfig(format!("unknown allocator model `{name}` (choose one of {})", PEER_NAMES.join(", ")))
        })?;
        for (key, value) in split_pairs(conf)? {
            let applied = match &mut config {
                Self::Torch(o) => o.apply(key, value),
                Self::Rmm(o) => o.apply(key, value),
                Self::Cupy(o) => o.apply(key, value),
                Self::Async(o) => o.apply(key, value),
            };
            match applied {
                Some(result) => result.map_err(|e| PoolError::InvalidConfig(format!("{name}: {key}: {e}")))?,
                None => {
                    return Err(PoolError::InvalidConfig(format!(
                        "{name} has no option `{key}` (its options: {})",
                        Self::keys(name).unwrap_or_default().join(", ")
                    )))
                }
            }
        }
        Ok(config)
    }

    /// The option keys the model called `name` takes.
    pub fn keys(name: &str) -> Option<&'static [&'static str]> {
        Some(match Self::named(name)? {
            Self::Torch(_) => &TorchOptions::KEYS,
            Self::Rmm(_) => &RmmOptions::KEYS,
            Self::Cupy(_) => &CupyOptions::KEYS,
            Self::Async(_) => &AsyncOptions::KEYS,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Torch(o) if o.expandable => "torch+expandable",
            Self::Torch(_) => "torch",
            Self::Rmm(_) => "rmm",
            Self::Cupy(_) => "cupy",
            Self::Async(_) => "async",
        }
    }

    /// Whether the model guesses at undocumented internals (the driver's pool).
    pub fn approximate(&self) -> bool {
        matches!(self, Self::Async(_))
    }

    /// A fresh model over `device`; `capacity` is the device's memory when the replay limits it
    /// (defaults that depend on it, such as RMM's initial pool, need it).
    pub fn build(&self, device: Arc<dyn Device>, capacity: Option<u64>) -> Box<dyn PeerModel> {
        match self {
            Self::Torch(o) => Box::new(caching::Caching::torch(o.clone(), device, capacity)),
            Self::Async(o) => Box::new(caching::Caching::driver_async(o.clone(), device, capacity)),
            Self::Rmm(o) => Box::new(rmm::Rmm::new(o.clone(), device, capacity)),
            Self::Cupy(o) => Box::new(cupy::Cupy::new(o.clone(), device)),
        }
    }
}

fn parse_u64(value: &str) -> Result<u64, String> {
    value.parse().map_err(|_| format!("`{value}` is not a whole number"))
}

fn parse_size(value: &str) -> Result<u64, String> {
    parse_bytes(value).map_err(|e| e.to_string())
}

fn parse_flag(value: &str) -> Result<bool, String> {
    match value {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(format!("`{value}` is not True or False")),
    }
}

/// PyTorch counts sizes in its options in MiB.
fn parse_mb(value: &str, least: u64) -> Result<u64, String> {
    let mb = parse_u64(value)?;
    if mb < least {
        return Err(format!("{mb} is too small, must be >= {least}"));
    }
    Ok(mb.saturating_mul(MIB))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrampool_core::device::{SimDevice, SimMode};
    use vrampool_core::sizes::{GIB, KIB};

    fn device(capacity: u64) -> Arc<dyn Device> {
        Arc::new(SimDevice::new(capacity, SimMode::AddressOnly))
    }

    #[test]
    fn names_and_options_round_trip() {
        for name in PEER_NAMES {
            let config = PeerConfig::named(name).unwrap();
            assert_eq!(config.name(), name);
            assert!(!PeerConfig::keys(name).unwrap().is_empty());
        }
        assert!(PeerConfig::named("jemalloc").is_none());
        let torch = PeerConfig::parse(
            "torch",
            "max_split_size_mb:256, roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.6",
        )
        .unwrap();
        let PeerConfig::Torch(o) = torch else { panic!() };
        assert_eq!(o.max_split_size, 256 * MIB);
        assert!((o.garbage_collection_threshold - 0.6).abs() < 1e-12);
        assert_eq!(PeerConfig::parse("torch", "expandable_segments:True").unwrap().name(), "torch+expandable");
        let PeerConfig::Rmm(r) = PeerConfig::parse("rmm", "initial_pool_size:1GB,maximum_pool_size=4GB").unwrap() else { panic!() };
        assert_eq!((r.initial_pool_size, r.maximum_pool_size), (Some(GIB), Some(4 * GIB)));
    }

    #[test]
    fn unknown_and_bad_options_are_errors_that_say_what_is_valid() {
        let err = PeerConfig::parse("torch", "small_max:64KB").unwrap_err().to_string();
        assert!(
            err.contains("torch has no option `small_max`")
                && err.contains("max_split_size_mb")
                && err.contains("garbage_collection_threshold"),
            "{err}"
        );
        let err = PeerConfig::parse("rmm", "max_split_size_mb:100").unwrap_err().to_string();
        assert!(err.contains("initial_pool_size, maximum_pool_size"), "{err}");
        for (name, conf) in [
            ("torch", "max_split_size_mb:19"),
            ("torch", "max_split_size_mb:lots"),
            ("torch", "roundup_power2_divisions:3"),
            ("torch", "roundup_power2_divisions:[256:3]"),
            ("torch", "roundup_power2_divisions:[300:2]"),
            ("torch", "garbage_collection_threshold:1.5"),
            ("torch", "expandable_segments:maybe"),
            ("torch", "max_split_size_mb"),
            ("rmm", "initial_pool_size:-1"),
            ("cupy", "limit:many"),
            ("async", "release_threshold:x"),
            ("tcmalloc", ""),
        ] {
            let err = PeerConfig::parse(name, conf).unwrap_err();
            assert!(matches!(err, PoolError::InvalidConfig(_)), "{name} {conf}: {err}");
        }
    }

    /// Every model hands out blocks that do not overlap, frees them all, and reserves at least
    /// what it hands out, on a random mix of sizes and two streams.
    #[test]
    fn every_model_keeps_its_blocks_apart() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for name in PEER_NAMES {
            let mut model = PeerConfig::named(name).unwrap().build(device(1 << 40), None);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for _ in 0..4000 {
                if live.len() > 40 || (random() % 3 == 0 && !live.is_empty()) {
                    let (addr, _) = live.swap_remove((random() % live.len() as u64) as usize);
                    model.free(addr).unwrap();
                } else {
                    let size = match random() % 4 {
                        0 => 1 + random() % (4 * KIB),
                        1 => 1 + random() % MIB,
                        2 => MIB + random() % (16 * MIB),
                        _ => 16 * MIB + random() % (80 * MIB),
                    };
                    let addr = model.allocate(size, random() % 2).unwrap();
                    for &(a, s) in &live {
                        assert!(addr + size <= a || a + s <= addr, "{name}: {addr:#x}+{size} overlaps {a:#x}+{s}");
                    }
                    live.push((addr, size));
                }
                let f = model.figures();
                assert!(f.reserved >= f.allocated && f.peak_reserved >= f.reserved, "{name}: {f:?}");
            }
            for (addr, _) in live {
                model.free(addr).unwrap();
            }
            assert_eq!(model.figures().allocated, 0, "{name}");
            assert!(model.free(1).is_err(), "{name}: a bogus free is an error");
        }
    }
}
