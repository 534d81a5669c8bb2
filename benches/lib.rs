//! Benchmarks only: see `pool.rs`, `pair_ratio.rs` and `planner.rs` beside this file. What the
//! benchmarks and the examples in `examples/` share is here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;

use vrampool_core::sizes::{GIB, KIB, MIB};
use vrampool_core::{Device, Pool, PoolConfig, SimDevice, SimMode, StreamId};

/// A pool with `config` over a 64 GiB simulated device that hands out addresses only.
pub fn sim_pool(config: PoolConfig) -> Pool {
    let device = Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly));
    Pool::new(device as Arc<dyn Device>, config).unwrap()
}

/// One allocation of `size` bytes on the default stream and its free: the pair the benchmarks
/// time.
#[inline(always)]
pub fn pool_pair(pool: &Pool, size: u64) {
    let a = pool.allocate(black_box(size), StreamId(0)).unwrap();
    pool.free(black_box(a), None, None).unwrap();
}

/// One malloc and free of `layout` through the system allocator (glibc's): the pairs' baseline.
#[inline(always)]
pub fn malloc_pair(layout: Layout) {
    // SAFETY: the benchmarks' layouts are non-zero; the block is freed with the same layout at
    // once.
    unsafe {
        let p = System.alloc(black_box(layout));
        assert!(!p.is_null());
        System.dealloc(black_box(p), layout);
    }
}

/// Marsaglia's xorshift64 from `seed` (not 0): the same numbers every run, for workloads.
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The `mixed` workload: 1,000 operations, each `(allocate?, size)`, over random sizes from
/// 512 B to 8 MiB (six in ten below 16 KiB, three below 1 MiB), the same every run.
pub fn mixed_ops() -> Vec<(bool, u64)> {
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    (0..1000)
        .map(|_| {
            let r = next();
            let size = match r % 10 {
                0..=5 => 512 + (r >> 8) % (16 * KIB),
                6..=8 => 16 * KIB + (r >> 8) % MIB,
                _ => MIB + (r >> 8) % (7 * MIB),
            };
            (r.is_multiple_of(2), size)
        })
        .collect()
}

/// Runs `ops` once on `pool` with up to 64 blocks live in `live` (an allocation when asked and
/// there is room, or when nothing is live; else a free of a block the size picks).
pub fn run_mixed(pool: &Pool, ops: &[(bool, u64)], live: &mut Vec<u64>) {
    for &(alloc, size) in ops {
        if (alloc && live.len() < 64) || live.is_empty() {
            live.push(pool.allocate(size, StreamId(0)).unwrap());
        } else {
            let i = (size as usize) % live.len();
            pool.free(live.swap_remove(i), None, None).unwrap();
        }
    }
}
