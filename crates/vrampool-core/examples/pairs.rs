//! Times alloc + free pairs on one thread (a quick profile target):
//! `pairs [COUNT] [SIZE] [STRATEGY]`, by default 2,000,000 pairs of 512 B on the hybrid pool.
use std::sync::Arc;
use vrampool_core::strategy::StrategyKind;
use vrampool_core::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let size: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(512);
    let strategy = match args.get(3).map(String::as_str) {
        Some("slab") => StrategyKind::Slab,
        Some("best_fit") => StrategyKind::BestFit,
        Some("buddy") => StrategyKind::Buddy,
        _ => StrategyKind::Hybrid,
    };
    let dev = Arc::new(SimDevice::new(64 << 30, SimMode::AddressOnly));
    let pool = Pool::new(dev as Arc<dyn Device>, PoolConfig { strategy, ..PoolConfig::default() }).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..n {
        let a = pool.allocate(std::hint::black_box(size), StreamId(0)).unwrap();
        pool.free(a, None, None).unwrap();
    }
    println!("{:.1} ns/pair", t.elapsed().as_nanos() as f64 / n as f64);
}
