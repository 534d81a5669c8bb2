//! How D's best known plan was found (an ignored test, run by hand): searches at fixed capacities, each under
//! one of MiniMalloc's orders with a few neighbouring ranks swapped at random, 300 ms per try. A try that fits
//! lowers the capacity by one unit of 1,024 bytes (every size in D is a multiple of it).
//!
//! `cargo test --release -p vrampool-plan --lib descend_on_d -- --ignored --nocapture`, with `DESCEND_SECS`
//! (default 600), `DESCEND_FROM` (the first capacity, in units; default 1,000), `DESCEND_SEED` (the seeds
//! tried are the ones after it; default 0) and `DESCEND_ORDER` (`twa`, the default, or `wat`). The deadlines
//! make runs differ a little. On this 2-core machine, under TWA, `DESCEND_FROM=998 DESCEND_SEED=10000` went
//! down to 993 units in 347 s (400 ms a try), `DESCEND_FROM=992 DESCEND_SEED=20000` to 989 in 588 s,
//! `DESCEND_FROM=988 DESCEND_SEED=30000` to 988 in 282 s, and `DESCEND_FROM=987 DESCEND_SEED=40000` to 983 in
//! 425 s, then nothing lower in the 775 s left of its 1,200. Under WAT, from 983 down, it went on to 982 in
//! 9.4 s, 981 in 52 s and 980 (1,003,520 bytes) in 159 s, then nothing at 979 in 23 minutes of runs (8 to 40
//! swaps, 100 ms to 1 s a try). The 980-unit plan is stored in `tests/minimalloc-challenging-D-plan.csv`;
//! `DESCEND_ORDER=wat DESCEND_FROM=980 DESCEND_SEED=1000527` finds it again on its first try.

use std::time::{Duration, Instant};

use super::component::{write_part, Component};
use super::jitter::{jitter, SWAPS};
use super::search::{fits, Outcome, Ranking};
use crate::instance::Instance;
use crate::order::Order;
use crate::{read_csv, validate};

const UNIT: u64 = 1_024;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore = "a search of minutes, run by hand"]
fn descend_on_d() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/static/minimalloc-challenging-D.csv");
    let buffers = read_csv(std::fs::File::open(path).expect("tests/data/static")).unwrap();
    let inst = Instance::new(&buffers, 1).unwrap();
    let part = Component::new(&inst, &(0..inst.len() as u32).collect::<Vec<_>>());
    let secs = env_or("DESCEND_SECS", 600);
    let mut capacity = env_or("DESCEND_FROM", 1_000) * UNIT;
    // The search recurses once per placement.
    let search = std::thread::Builder::new().stack_size(64 << 20).spawn(move || {
        let order = match std::env::var("DESCEND_ORDER").as_deref() {
            Ok("wat") => Order::Wat,
            _ => Order::Twa,
        };
        let (begin, base) = (Instant::now(), part.ranking(order));
        let mut seed = env_or("DESCEND_SEED", 0);
        while begin.elapsed() < Duration::from_secs(secs) {
            seed += 1;
            let mut nodes = 0;
            let until = Instant::now() + Duration::from_millis(300);
            if let Outcome::Fits(local) = fits(
                &part,
                &Ranking { rank: jitter(&base, seed, SWAPS), rerank: None },
                capacity,
                until,
                &mut nodes,
                u64::MAX,
            ) {
                let mut offsets = vec![0u64; part.len()];
                write_part(&mut offsets, &part.members, local.into_iter());
                let arena = validate(&buffers, &offsets, 1).unwrap();
                println!(
                    "{:>5.0} s  seed {seed}: {arena} bytes ({} units)  {offsets:?}",
                    begin.elapsed().as_secs_f64(),
                    arena / UNIT
                );
                capacity = arena - UNIT;
            }
        }
    });
    search.unwrap().join().unwrap();
}
