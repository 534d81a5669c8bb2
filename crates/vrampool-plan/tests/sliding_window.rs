//! A sliding window (buffer i live on [i, i + k), sizes varied): every buffer overlaps its neighbours, so the
//! whole input is one chain. Issue 48: with a small budget `plan` handed back the floors fallback, which
//! stacks each buffer on the last (4,023x the lower bound at 100,000 buffers, budget 0), where greedy by size
//! takes a tenth of a second and gives 1.22x. No budget may leave Auto worse than greedy by size.

use std::time::Duration;

use vrampool_plan::{greedy_by_size, plan, validate, Algorithm, Buffer, PlanOptions};

/// `n` buffers, buffer i live on [i, i + k), sizes 512 B to 32 KiB from a xorshift.
fn sliding_window(n: u64, k: u64) -> Vec<Buffer> {
    let mut x = 7u64;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Buffer::new(i, i, i + k, 512 * (1 + x % 64))
        })
        .collect()
}

#[test]
fn auto_is_never_worse_than_greedy_by_size_on_a_sliding_window() {
    for k in [2, 8, 64] {
        let buffers = sliding_window(20_000, k);
        let greedy = validate(&buffers, &greedy_by_size(&buffers, 1).unwrap(), 1).unwrap();
        for budget in [Duration::ZERO, Duration::from_millis(5)] {
            let options = PlanOptions { algorithm: Algorithm::Auto, budget, alignment: 1 };
            let auto = plan(&buffers, &options).unwrap();
            assert!(
                auto.arena_bytes <= greedy,
                "k={k} budget {budget:?}: auto {} > greedy by size {greedy}",
                auto.arena_bytes
            );
            assert!(auto.arena_bytes >= auto.lower_bound_bytes);
        }
    }
}
