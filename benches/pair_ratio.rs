//! The pool's 512 B alloc + free pair against glibc's malloc + free (issue 2's slab target),
//! timed in turns: 20,000 pool pairs, then 20,000 malloc pairs, 200 times, and the median of
//! each turn's ratio. This VM's speed drifts by up to 1.6x over seconds, so two criterion
//! benchmarks run a few seconds apart can see different machines; turns run back to back see the
//! same one. (Only 512 B: at 64 MiB glibc maps and unmaps memory, which slows the pool's turn that
//! follows, so the larger pairs are measured by criterion alone, in `pool.rs`.)
//!
//! Run: `cargo bench -p vrampool-benches --bench pair_ratio`

use std::alloc::Layout;
use std::time::Instant;

use vrampool_benches::{malloc_pair, pool_pair, sim_pool};
use vrampool_core::strategy::StrategyKind;
use vrampool_core::{Pool, PoolConfig};

const TURNS: usize = 200;
const PAIRS_PER_TURN: u32 = 20_000;
const SIZE: u64 = 512;

fn pool_turn(pool: &Pool) -> f64 {
    let t = Instant::now();
    for _ in 0..PAIRS_PER_TURN {
        pool_pair(pool, SIZE);
    }
    t.elapsed().as_nanos() as f64 / f64::from(PAIRS_PER_TURN)
}

fn malloc_turn() -> f64 {
    let layout = Layout::from_size_align(SIZE as usize, 16).unwrap();
    let t = Instant::now();
    for _ in 0..PAIRS_PER_TURN {
        malloc_pair(layout);
    }
    t.elapsed().as_nanos() as f64 / f64::from(PAIRS_PER_TURN)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    println!("| 512 B pair | pool (median turn) | malloc (median turn) | median of the turns' ratios |");
    println!("| --- | ---: | ---: | ---: |");
    for strategy in [StrategyKind::Slab, StrategyKind::BestFit, StrategyKind::Buddy, StrategyKind::Hybrid] {
        let pool = sim_pool(PoolConfig { strategy, ..PoolConfig::default() });
        pool_turn(&pool);
        let (mut pools, mut mallocs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..TURNS {
            let (p, m) = (pool_turn(&pool), malloc_turn());
            pools.push(p);
            mallocs.push(m);
            ratios.push(p / m);
        }
        println!("| {} | {:.1} ns | {:.1} ns | {:.2}x |", strategy.name(), median(pools), median(mallocs), median(ratios));
    }
}
