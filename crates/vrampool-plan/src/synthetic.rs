//! Seeded random instances for tests and benchmarks, shaped like a network's tensors: most lifetimes short,
//! a few spanning much of the run, sizes spread over several orders of magnitude. No dependencies: a
//! splitmix64 generator, so an instance is the same on every machine for the same seed.

use crate::Buffer;

/// `n` buffers with ids `0..n` over roughly `n` time steps, the same for the same `seed`.
pub fn random_instance(n: usize, seed: u64) -> Vec<Buffer> {
    let mut rng = SplitMix64(seed);
    let horizon = (n as u64).max(1);
    (0..n as u64)
        .map(|id| {
            let lower = rng.below(horizon);
            // Lifetimes: 90% short (1..16 steps), 9% medium (up to 1% of the run), 1% long (up to 30%).
            let length = match rng.below(100) {
                0 => 1 + rng.below((horizon * 3 / 10).max(1)),
                1..=9 => 1 + rng.below((horizon / 100).max(16)),
                _ => 1 + rng.below(16),
            };
            // Sizes log-uniform from 256 B to 64 MiB, in 256-byte steps as allocators hand them out.
            let size = (1u64 << (8 + rng.below(18))) + 256 * rng.below(64);
            Buffer { id, lower, upper: lower + length, size }
        })
        .collect()
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (bound > 0); the modulo bias is irrelevant here.
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
