//! Alloc + free pair latency per strategy on a warm pool, beside glibc malloc/free of the same
//! sizes; a mixed random-size workload; and slab-path throughput with one and two threads.
//!
//! Run: `cargo bench -p vrampool-benches --bench pool`; `scripts/bench-summary.py` prints the
//! medians and ratios.

use std::alloc::Layout;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use vrampool_benches::{malloc_pair, mixed_ops, pool_pair, run_mixed, sim_pool};
use vrampool_core::sizes::{KIB, MIB};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{Pool, PoolConfig};

const STRATEGIES: [StrategyKind; 4] = [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid];
const SIZES: [(u64, &str); 4] = [(512, "512B"), (64 * KIB, "64KiB"), (4 * MIB, "4MiB"), (64 * MIB, "64MiB")];

fn pool(strategy: StrategyKind) -> Pool {
    sim_pool(PoolConfig { strategy, ..PoolConfig::default() })
}

/// A pool that has served `size` once, so the pair measured reuses cached memory.
fn warm_pool(strategy: StrategyKind, size: u64) -> Pool {
    let pool = pool(strategy);
    pool_pair(&pool, size);
    pool
}

fn pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("pair");
    for (size, label) in SIZES {
        for strategy in STRATEGIES {
            let pool = warm_pool(strategy, size);
            group.bench_function(BenchmarkId::new(strategy.name(), label), |b| b.iter(|| pool_pair(&pool, size)));
        }
        let layout = Layout::from_size_align(size as usize, 16).unwrap();
        group.bench_function(BenchmarkId::new("malloc", label), |b| b.iter(|| malloc_pair(layout)));
    }
    group.finish();
}

/// 1,000 operations over random sizes from 512 B to 8 MiB with up to 64 blocks live.
fn mixed(c: &mut Criterion) {
    let ops = mixed_ops();
    let mut group = c.benchmark_group("mixed");
    group.throughput(Throughput::Elements(ops.len() as u64));
    for strategy in STRATEGIES {
        let pool = pool(strategy);
        let mut live: Vec<u64> = Vec::with_capacity(64);
        group.bench_function(strategy.name(), |b| b.iter(|| run_mixed(&pool, &ops, &mut live)));
        for a in live.drain(..) {
            pool.free(a, None, None).unwrap();
        }
    }
    group.finish();
}

/// Slab-path pairs on `threads` threads at once; one iteration is one pair on every thread, so
/// equal times for one and two threads mean twice the throughput.
fn threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("threads");
    for threads in [1usize, 2] {
        let pool = Arc::new(warm_pool(StrategyKind::Hybrid, 512));
        group.bench_function(BenchmarkId::new("slab_512B_pairs", threads), |b| {
            b.iter_custom(|iters| {
                let barrier = Arc::new(Barrier::new(threads + 1));
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        let (pool, barrier) = (Arc::clone(&pool), Arc::clone(&barrier));
                        std::thread::spawn(move || {
                            barrier.wait();
                            for _ in 0..iters {
                                pool_pair(&pool, 512);
                            }
                        })
                    })
                    .collect();
                barrier.wait();
                let start = Instant::now();
                workers.into_iter().for_each(|w| w.join().unwrap());
                start.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(30);
    targets = pairs, mixed, threads
}
criterion_main!(benches);
