//! The `mixed` benchmark's workload (benches/pool.rs) with its device calls counted:
//! `cargo run --release -p vrampool-benches --example mixed [-- ITERATIONS [reclaim:false]]`.
//! Prints time per iteration (1,000 operations of random sizes, 512 B to 8 MiB, up to 64 blocks
//! live) and the device allocations and frees per strategy.
use vrampool_benches::{mixed_ops, run_mixed, sim_pool};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iterations: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(300);
    let reclaim = args.get(2).map(String::as_str) != Some("reclaim:false");
    let ops = mixed_ops();
    for strategy in [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid] {
        let pool = sim_pool(PoolConfig { strategy, reclaim, ..PoolConfig::default() });
        let mut live: Vec<u64> = Vec::with_capacity(64);
        let started = std::time::Instant::now();
        for _ in 0..iterations {
            run_mixed(&pool, &ops, &mut live);
        }
        let stats = pool.stats();
        let per_iteration = started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
        println!(
            "{:<8} {per_iteration:7.1} us/iteration, device allocs {}, frees {}",
            strategy.name(),
            stats.num_device_alloc,
            stats.num_device_free
        );
    }
}
