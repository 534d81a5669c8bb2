//! One thread, then two, each holding many live blocks and replacing one at random per op, on the
//! core pool (simulated device, default stream): the more live blocks, the more of them find their
//! slot in the live table (65,536 slots) taken and go to its overflow map.
//! `cargo run --release -p vrampool-core --example many_live [LIVE]` (by default 40,000 live
//! blocks of 512 B-4 KiB; two threads hold half as many each). Prints ns per op (a free and an
//! allocation) and the ratio of throughputs, three turns.
use std::sync::Arc;
use std::time::Instant;
use vrampool_core::*;

const OPS: usize = 1_000_000;

/// Knuth's MMIX LCG.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }

    fn size(&mut self) -> u64 {
        512 * (1 + self.next() % 8)
    }
}

/// ns per op with `live` blocks held, `OPS` times one freed and one allocated at random.
fn work(pool: &Pool, seed: u64, live: usize) -> f64 {
    let mut rng = Lcg(seed);
    let mut held: Vec<u64> = (0..live).map(|_| pool.allocate(rng.size(), StreamId(0)).unwrap()).collect();
    let t = Instant::now();
    for _ in 0..OPS {
        let i = rng.next() as usize % live;
        pool.free(held[i], None, None).unwrap();
        held[i] = pool.allocate(rng.size(), StreamId(0)).unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / OPS as f64;
    held.into_iter().for_each(|a| pool.free(a, None, None).unwrap());
    ns
}

fn main() {
    let live: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(40_000);
    let pool = Pool::new(Arc::new(SimDevice::new(1 << 36, SimMode::AddressOnly)), PoolConfig::default()).unwrap();
    for _ in 0..3 {
        let one = work(&pool, 1, live);
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| work(&pool, 2, live / 2));
            work(&pool, 3, live / 2);
        });
        // The two-thread time includes making and freeing the live blocks, a few percent of it.
        let two = t.elapsed().as_nanos() as f64 / (2 * OPS) as f64;
        println!("{live} live: one thread {one:.1} ns/op, two threads {two:.1} ns/op, throughput ratio {:.2}x", one / two);
    }
}
