//! The `mixed` benchmark's workload (benches/pool.rs) with its device calls counted:
//! `mixed [ITERATIONS] [reclaim:false]`. Prints time per iteration (1,000 operations of random
//! sizes, 512 B to 8 MiB, up to 64 blocks live) and the device allocations and frees per strategy.
use std::sync::Arc;
use vrampool_core::sizes::{GIB, KIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iterations: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(300);
    let reclaim = args.get(2).map(String::as_str) != Some("reclaim:false");
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let ops: Vec<(bool, u64)> = (0..1000)
        .map(|_| {
            let r = next();
            let size = match r % 10 {
                0..=5 => 512 + (r >> 8) % (16 * KIB),
                6..=8 => 16 * KIB + (r >> 8) % MIB,
                _ => MIB + (r >> 8) % (7 * MIB),
            };
            (r % 2 == 0, size)
        })
        .collect();
    for strategy in [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid] {
        let device = Arc::new(SimDevice::new(64 * GIB, SimMode::AddressOnly));
        let pool = Pool::new(device as Arc<dyn Device>, PoolConfig { strategy, reclaim, ..PoolConfig::default() }).unwrap();
        let mut live: Vec<u64> = Vec::with_capacity(64);
        let started = std::time::Instant::now();
        for _ in 0..iterations {
            for &(alloc, size) in &ops {
                if (alloc && live.len() < 64) || live.is_empty() {
                    live.push(pool.allocate(size, StreamId(0)).unwrap());
                } else {
                    let i = (size as usize) % live.len();
                    pool.free(live.swap_remove(i), None, None).unwrap();
                }
            }
        }
        let stats = pool.stats();
        let per_iteration = started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
        println!("{:<8} {per_iteration:7.1} us/iteration, device allocs {}, frees {}", strategy.name(), stats.num_device_alloc, stats.num_device_free);
    }
}
