//! Times alloc + free pairs of 512 B on one thread (a quick profile target).
use std::sync::Arc;
use vrampool_core::*;
fn main() {
    let dev = Arc::new(SimDevice::new(64 << 30, SimMode::AddressOnly));
    let pool = Pool::new(dev as Arc<dyn Device>, PoolConfig::default()).unwrap();
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let t = std::time::Instant::now();
    for _ in 0..n {
        let a = pool.allocate(std::hint::black_box(512), StreamId(0)).unwrap();
        pool.free(a, None, None).unwrap();
    }
    println!("{:.1} ns/pair", t.elapsed().as_nanos() as f64 / n as f64);
}
