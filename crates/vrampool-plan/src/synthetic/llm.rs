//! A transformer's training step and its decoding, with fixed shapes.

use super::{SplitMix64, Tape};
use crate::Buffer;

/// A transformer's training step over `micro_batches` (gradient accumulation): per layer and micro-batch, the
/// forward pass makes about a dozen tensors and keeps five for the backward pass, which makes about as many
/// again; each layer's weight gradients live from the first backward pass to the end. Sizes come from
/// `hidden` (bytes of one token's activation row) times the micro-batch's tokens, which vary by up to a
/// quarter between micro-batches (seeded), as packed sequences do. About `30 * layers * micro_batches`
/// buffers: 64 layers and 10 micro-batches give about 19,000.
pub fn llm_training_instance(layers: usize, micro_batches: usize, hidden: u64, seed: u64) -> Vec<Buffer> {
    let mut rng = SplitMix64(seed);
    let mut tape = Tape::new();
    let mut grads: Vec<Option<[usize; 2]>> = vec![None; layers];
    for _ in 0..micro_batches {
        let tokens = 1024 - rng.below(256);
        let row = hidden * tokens;
        let mut x = tape.make(row);
        let mut kept: Vec<[usize; 5]> = Vec::with_capacity(layers);
        for _ in 0..layers {
            let norm = tape.make(row);
            let qkv = tape.make(3 * row);
            let scores = tape.make(tokens * tokens * 2);
            let probs = tape.make(tokens * tokens * 2);
            tape.free(scores);
            let attn = tape.make(row);
            tape.free(norm);
            let out = tape.make(row);
            tape.free(x);
            let up = tape.make(4 * row);
            let act = tape.make(4 * row);
            let down = tape.make(row);
            let next = tape.make(row);
            tape.free(down);
            tape.free(out);
            kept.push([qkv, probs, attn, up, act]);
            x = next;
        }
        let mut grad = tape.make(row);
        tape.free(x);
        for (layer, saved) in kept.into_iter().enumerate().rev() {
            let g_act = tape.make(4 * row);
            let g_up = tape.make(4 * row);
            tape.free(g_act);
            let g_attn = tape.make(row);
            let g_probs = tape.make(tokens * tokens * 2);
            let g_qkv = tape.make(3 * row);
            tape.free(g_probs);
            let w = grads[layer].get_or_insert_with(|| [tape.make(12 * hidden * 64), tape.make(4 * hidden * 64)]);
            let _ = w;
            let g_x = tape.make(row);
            for b in [g_up, g_attn, g_qkv, grad] {
                tape.free(b);
            }
            for b in saved {
                tape.free(b);
            }
            grad = g_x;
        }
        tape.free(grad);
    }
    tape.finish()
}

/// A transformer decoding `tokens` tokens after a prompt of `prompt` tokens: per layer and token, the
/// attention makes q, k and v rows, grows the layer's K and V caches by concatenation (a new buffer one row
/// longer, the old one freed after the copy), and makes scores over the cache and a few temporaries. Greedy
/// by size packs the growing caches badly. About `13 * layers * tokens` buffers: 24 layers and 120 tokens
/// give about 37,000.
pub fn llm_decoding_instance(layers: usize, prompt: u64, tokens: u64, row: u64) -> Vec<Buffer> {
    let mut tape = Tape::new();
    let mut caches: Vec<[usize; 2]> = (0..layers).map(|_| [tape.make(prompt * row), tape.make(prompt * row)]).collect();
    for t in 0..tokens {
        let length = prompt + t + 1;
        let mut x = tape.make(row);
        for cache in caches.iter_mut() {
            let norm = tape.make(row);
            let q = tape.make(row);
            let k = tape.make(row);
            let v = tape.make(row);
            tape.free(norm);
            let grown = [tape.make(length * row), tape.make(length * row)];
            for b in [cache[0], cache[1], k, v] {
                tape.free(b);
            }
            *cache = grown;
            let scores = tape.make(length * 64);
            let attn = tape.make(row);
            tape.free(scores);
            tape.free(q);
            let up = tape.make(4 * row);
            let down = tape.make(row);
            tape.free(up);
            let next = tape.make(row);
            for b in [attn, down, x] {
                tape.free(b);
            }
            x = next;
        }
        tape.free(x);
    }
    tape.finish()
}
