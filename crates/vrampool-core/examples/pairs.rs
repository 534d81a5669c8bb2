//! Times alloc + free pairs on one thread (a quick profile target):
//! `pairs [COUNT] [SIZE] [STRATEGY] [HOLES]`, by default 2,000,000 pairs of 512 B on the hybrid
//! pool; STRATEGY `malloc` times glibc's malloc and free instead. HOLES free ranges of SIZE plus
//! 512 B to 3 KiB, each between live 512 B blocks, are made first: with more than 32 in SIZE's
//! best-fit bin, the pairs search a crowded bin. (The ratio to malloc, on a noisy
//! machine: `cargo bench -p vrampool-benches --bench pair_ratio`.)
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use vrampool_core::strategy::StrategyKind;
use vrampool_core::*;

fn pool_pairs(pool: &Pool, n: u64, size: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let a = pool.allocate(black_box(size), StreamId(0)).unwrap();
        pool.free(a, None, None).unwrap();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn malloc_pairs(n: u64, size: u64) -> f64 {
    let layout = Layout::from_size_align(size as usize, 16).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: a non-zero layout; the block is freed with the same layout at once.
        unsafe {
            let p = System.alloc(black_box(layout));
            assert!(!p.is_null());
            System.dealloc(black_box(p), layout);
        }
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let size: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(512);
    let strategy = match args.get(3).map(String::as_str) {
        Some("malloc") => {
            println!("{:.1} ns/pair", malloc_pairs(n, size));
            return;
        }
        Some("slab") => StrategyKind::Slab,
        Some("best_fit") => StrategyKind::BestFit,
        Some("buddy") => StrategyKind::Buddy,
        _ => StrategyKind::Hybrid,
    };
    let dev = Arc::new(SimDevice::new(64 << 30, SimMode::AddressOnly));
    let pool = Pool::new(dev as Arc<dyn Device>, PoolConfig { strategy, ..PoolConfig::default() }).unwrap();
    let holes: u64 = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(0);
    let ranges: Vec<u64> = (0..holes)
        .map(|k| {
            let range = pool.allocate(size + 512 * (1 + k % 6), StreamId(0)).unwrap();
            pool.allocate(512, StreamId(0)).unwrap();
            range
        })
        .collect();
    for range in ranges {
        pool.free(range, None, None).unwrap();
    }
    println!("{:.1} ns/pair", pool_pairs(&pool, n, size));
}
