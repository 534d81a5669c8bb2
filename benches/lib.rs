//! Benchmarks only: see `pool.rs` and `planner.rs` beside this file. What the benchmarks and the
//! examples in `examples/` share is here.

use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::{Pool, StreamId};

/// The `mixed` workload: 1,000 operations, each `(allocate?, size)`, over random sizes from
/// 512 B to 8 MiB (six in ten below 16 KiB, three below 1 MiB), the same every run.
pub fn mixed_ops() -> Vec<(bool, u64)> {
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    (0..1000)
        .map(|_| {
            let r = next();
            let size = match r % 10 {
                0..=5 => 512 + (r >> 8) % (16 * KIB),
                6..=8 => 16 * KIB + (r >> 8) % MIB,
                _ => MIB + (r >> 8) % (7 * MIB),
            };
            (r % 2 == 0, size)
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
