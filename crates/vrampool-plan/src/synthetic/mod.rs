//! Seeded instances for tests and benchmarks. No dependencies: a splitmix64 generator, so an instance is the
//! same on every machine for the same seed.
//!
//! - [`random_instance`]: shaped like a network's tensors: most lifetimes short, a few spanning much of the
//!   run, sizes spread over several orders of magnitude.
//! - [`llm_training_instance`] and [`llm_decoding_instance`]: the tensors of a transformer's training step
//!   (activations kept from each layer's forward pass to its backward pass, over micro-batches) and of its
//!   decoding (a KV cache per layer grown by concatenation each token): large graphs of repeated layers.
//! - [`packed_instance`]: a square of time and bytes cut into rectangles, so a plan at its side is known to
//!   exist: instances of the kind of MiniMalloc's challenging set, to measure the search on instances it was
//!   not tuned on.

mod families;
mod llm;

use crate::rng::SplitMix64;
use crate::Buffer;

pub use families::{large_graph, GraphFamily};
pub use llm::{llm_decoding_instance, llm_training_instance};

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

/// About `n` buffers cut from a square of `side` units of time by `side` units of `unit` bytes by guillotine
/// cuts (the largest rectangle is cut next, across its longer side, at a uniform position), with one buffer in
/// `drop_one_in` left out (none if 0), which may lower the bound below the side. With `side = 1024` and
/// `unit = 1024` the square is 1 MiB over 1,048,576 steps, as in MiniMalloc's challenging set. The
/// rectangles' own offsets are a plan at the square's height, so the instance is known to fit there; many
/// are hard to decide there all the same. Cuts across time favour an earliest-start-first order, so these
/// instances check the search on structure it was not tuned on, beside the real ones, not in place of them.
pub fn packed_instance(n: usize, side: u64, unit: u64, drop_one_in: u64, seed: u64) -> Vec<Buffer> {
    let mut rng = SplitMix64(seed);
    // (x0, x1, y0, y1) in units.
    let mut pieces: Vec<(u64, u64, u64, u64)> = vec![(0, side.max(1), 0, side.max(1))];
    while pieces.len() < n.max(1) {
        let (k, &(x0, x1, y0, y1)) = pieces
            .iter()
            .enumerate()
            .max_by_key(|(_, &(x0, x1, y0, y1))| (x1 - x0) * (y1 - y0))
            .expect("at least one piece");
        let (w, h) = (x1 - x0, y1 - y0);
        if w.max(h) < 2 {
            break;
        }
        pieces.swap_remove(k);
        if w >= h {
            let c = x0 + 1 + rng.below(w - 1);
            pieces.extend([(x0, c, y0, y1), (c, x1, y0, y1)]);
        } else {
            let c = y0 + 1 + rng.below(h - 1);
            pieces.extend([(x0, x1, y0, c), (x0, x1, c, y1)]);
        }
    }
    pieces
        .into_iter()
        .filter(|_| drop_one_in == 0 || rng.below(drop_one_in) != 0)
        .enumerate()
        .map(|(id, (x0, x1, y0, y1))| Buffer {
            id: id as u64,
            lower: x0 * unit,
            upper: x1 * unit,
            size: (y1 - y0) * unit,
        })
        .collect()
}

/// Records buffers on a clock: each op ticks it, and a buffer lives from the op that makes it to the op after
/// its last use.
pub(crate) struct Tape {
    buffers: Vec<Buffer>,
    now: u64,
}

impl Tape {
    pub(crate) fn new() -> Tape {
        Tape { buffers: Vec::new(), now: 0 }
    }

    /// A buffer made by the next op; returns its index (its end is set by `free`, or at `finish`).
    pub(crate) fn make(&mut self, size: u64) -> usize {
        self.now += 1;
        self.buffers.push(Buffer { id: self.buffers.len() as u64, lower: self.now, upper: u64::MAX, size });
        self.buffers.len() - 1
    }

    /// The buffer's last use is the next op.
    pub(crate) fn free(&mut self, buffer: usize) {
        self.now += 1;
        self.buffers[buffer].upper = self.now + 1;
    }

    /// Buffers made so far.
    pub(crate) fn len(&self) -> usize {
        self.buffers.len()
    }

    pub(crate) fn finish(mut self) -> Vec<Buffer> {
        let end = self.now + 2;
        self.buffers.iter_mut().filter(|b| b.upper == u64::MAX).for_each(|b| b.upper = end);
        self.buffers
    }
}
