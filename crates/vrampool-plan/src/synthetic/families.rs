//! Families of large graphs (about 10,000 to 60,000 buffers) whose shapes are drawn from a seed: the
//! planner is measured on seeds it was not tuned on. Each seed draws a model (layers, hidden size, grouped
//! key-value heads, the MLP's width and gating, vocabulary) and a run (tokens, batch, growth of the caches,
//! micro-batches and their schedule), then records the run's tensors on a clock as an eager framework
//! would allocate them.

use super::{SplitMix64, Tape};
use crate::Buffer;

/// The kind of run a large graph records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphFamily {
    /// Decoding a batch of sequences: per layer one key and one value cache for the batch, grown by
    /// concatenation when full, by one token or by a chunk of them; logits every step.
    Decoding,
    /// Serving with continuous batching: each sequence has its own caches per layer, grown as it decodes and
    /// freed when it ends, when a new sequence's prompt is prefilled in its place.
    Serving,
    /// A training step with gradient accumulation: each micro-batch's activations live from its forward pass
    /// to its backward pass; weight gradients from the first backward pass to the optimizer's step.
    Training,
    /// The same with activation recomputation: the forward pass keeps only each layer's input, and the
    /// backward pass recomputes the layer before differentiating it.
    Recomputation,
    /// Micro-batches in a one-forward-one-backward schedule: several in flight at once.
    Pipelined,
    /// A compiler's dataflow graph of a convolutional network's training step: stages of operators with
    /// residual and long skips, branches joined by concatenation, workspaces, and the backward pass reading
    /// the saved activations in reverse.
    Dataflow,
}

impl GraphFamily {
    pub const ALL: [GraphFamily; 6] = [
        GraphFamily::Decoding,
        GraphFamily::Serving,
        GraphFamily::Training,
        GraphFamily::Recomputation,
        GraphFamily::Pipelined,
        GraphFamily::Dataflow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GraphFamily::Decoding => "decoding",
            GraphFamily::Serving => "serving",
            GraphFamily::Training => "training",
            GraphFamily::Recomputation => "recomputation",
            GraphFamily::Pipelined => "pipelined",
            GraphFamily::Dataflow => "dataflow",
        }
    }
}

/// A graph of `family` with its shape drawn from `seed`: a whole number of steps or micro-batches near a drawn
/// target of 18,000 to 60,000 buffers, so about 10,000 to 60,000; the same on every machine for the same seed.
pub fn large_graph(family: GraphFamily, seed: u64) -> Vec<Buffer> {
    let mut rng = SplitMix64(seed ^ (family as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let target = 18_000 + rng.below(42_001) as usize;
    let model = Model::draw(&mut rng);
    let mut tape = Tape::new();
    match family {
        GraphFamily::Decoding => decoding(&mut tape, &model, target, &mut rng),
        GraphFamily::Serving => serving(&mut tape, &model, target, &mut rng),
        GraphFamily::Training => training(&mut tape, &model, target, Schedule::Accumulate, &mut rng),
        GraphFamily::Recomputation => training(&mut tape, &model, target, Schedule::Recompute, &mut rng),
        GraphFamily::Pipelined => {
            let in_flight = 2 + rng.below(3) as usize;
            training(&mut tape, &model, target, Schedule::OneForwardOneBackward(in_flight), &mut rng)
        }
        GraphFamily::Dataflow => return dataflow(target, &mut rng),
    }
    tape.finish()
}

impl SplitMix64 {
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// What a layer's forward pass leaves live for a backward pass.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    Nothing,
    /// The layer's input, to recompute the rest from.
    Input,
    All,
}

/// A transformer's shape, in bytes per token (16-bit activations).
struct Model {
    layers: usize,
    row: u64,
    kv_row: u64,
    heads: u64,
    /// The MLP's hidden row.
    mlp_row: u64,
    gated: bool,
    /// Whether attention keeps its scores (eager) or only their log-sum-exp (fused).
    fused_attention: bool,
    vocab: u64,
}

impl Model {
    fn draw(rng: &mut SplitMix64) -> Model {
        let hidden = rng.pick(&[1024, 2048, 2560, 3072, 4096, 5120, 6144, 8192]);
        let heads = hidden / 128;
        let gated = rng.below(2) == 0;
        // A gated MLP is narrower for the same parameters (8/3 of the hidden size rather than 4).
        let mlp = if gated { hidden * rng.pick(&[8, 11, 14]) / 4 } else { hidden * 4 };
        Model {
            layers: rng.pick(&[12, 16, 24, 28, 32, 40, 48, 60]),
            row: 2 * hidden,
            kv_row: 2 * hidden / rng.pick(&[1, 2, 4, 8]),
            heads,
            mlp_row: 2 * mlp,
            gated,
            fused_attention: rng.below(2) == 0,
            vocab: rng.pick(&[32_000, 50_257, 128_256]),
        }
    }

    /// One layer's forward pass over `tokens` tokens attending to `context` positions each, from the input
    /// `x`; `cache` is called between the projections and attention with the new keys and values (and frees
    /// them). Returns the layer's output and the tensors left live for a backward pass (`keep`).
    fn layer(
        &self,
        tape: &mut Tape,
        x: usize,
        tokens: u64,
        context: u64,
        keep: Keep,
        cache: &mut dyn FnMut(&mut Tape, usize, usize),
    ) -> (usize, Vec<usize>) {
        let mut kept = Vec::new();
        let all = keep == Keep::All;
        let done = |tape: &mut Tape, b: usize, kept: &mut Vec<usize>| if all { kept.push(b) } else { tape.free(b) };
        let norm = tape.make(tokens * self.row);
        let q = tape.make(tokens * self.row);
        let k = tape.make(tokens * self.kv_row);
        let v = tape.make(tokens * self.kv_row);
        done(tape, norm, &mut kept);
        cache(tape, k, v);
        let attn = if self.fused_attention {
            let lse = tape.make(tokens * self.heads * 4);
            let attn = tape.make(tokens * self.row);
            done(tape, lse, &mut kept);
            attn
        } else {
            let scores = tape.make(tokens * self.heads * context * 4);
            let probs = tape.make(tokens * self.heads * context * 2);
            tape.free(scores);
            let attn = tape.make(tokens * self.row);
            done(tape, probs, &mut kept);
            attn
        };
        done(tape, q, &mut kept);
        let out = tape.make(tokens * self.row);
        done(tape, attn, &mut kept);
        let mid = tape.make(tokens * self.row);
        tape.free(out);
        let norm2 = tape.make(tokens * self.row);
        let up = tape.make(tokens * self.mlp_row);
        let gate = self.gated.then(|| tape.make(tokens * self.mlp_row));
        done(tape, norm2, &mut kept);
        let act = tape.make(tokens * self.mlp_row);
        done(tape, up, &mut kept);
        if let Some(gate) = gate {
            done(tape, gate, &mut kept);
        }
        let down = tape.make(tokens * self.row);
        done(tape, act, &mut kept);
        let next = tape.make(tokens * self.row);
        tape.free(down);
        tape.free(mid);
        if keep == Keep::Nothing {
            tape.free(x);
        } else {
            kept.push(x);
        }
        (next, kept)
    }

    /// Buffers one layer's forward pass makes, roughly.
    fn per_layer(&self) -> u64 {
        15
    }
}

/// Rounds `length` up to a multiple of `chunk`.
fn room(length: u64, chunk: u64) -> u64 {
    length.div_ceil(chunk) * chunk
}

/// Replaces a key and a value cache of `capacity` rows of `row_bytes` by larger ones (allocated, copied into,
/// the old freed) once `length` rows no longer fit, rounded up to a multiple of `chunk` rows.
fn grow_cache(tape: &mut Tape, cache: &mut [usize; 2], capacity: &mut u64, length: u64, chunk: u64, row_bytes: u64) {
    if length > *capacity {
        *capacity = room(length, chunk);
        let grown = [(); 2].map(|_| tape.make(*capacity * row_bytes));
        for b in *cache {
            tape.free(b);
        }
        *cache = grown;
    }
}

/// Decoding a batch: per layer one key and one value cache for the whole batch, replaced by a larger one
/// (allocated, copied into, the old freed) whenever the sequences outgrow it.
fn decoding(tape: &mut Tape, model: &Model, target: usize, rng: &mut SplitMix64) {
    let batch = rng.pick(&[1, 1, 2, 4, 8]);
    let prompt = rng.between(16, 2048);
    let chunk = rng.pick(&[1, 1, 2, 8, 32]);
    let per_step = model.layers as u64 * (model.per_layer() + 4 / chunk) + 2;
    let steps = (target as u64 / per_step).max(2);
    let caches: Vec<[usize; 2]> =
        (0..model.layers).map(|_| [(); 2].map(|_| tape.make(batch * room(prompt, chunk) * model.kv_row))).collect();
    let mut caches = caches.into_iter().map(|c| (c, room(prompt, chunk))).collect::<Vec<_>>();
    for step in 0..steps {
        let length = prompt + step + 1;
        let mut x = tape.make(batch * model.row);
        for (cache, capacity) in caches.iter_mut() {
            let mut grow = |tape: &mut Tape, k: usize, v: usize| {
                grow_cache(tape, cache, capacity, length, chunk, batch * model.kv_row);
                tape.free(k);
                tape.free(v);
            };
            x = model.layer(tape, x, batch, length, Keep::Nothing, &mut grow).0;
        }
        let logits = tape.make(batch * model.vocab * 4);
        tape.free(x);
        tape.free(logits);
    }
}

/// Continuous batching: `slots` sequences decode together, each with its own caches per layer; a sequence
/// that has made its tokens is freed, and the next one's prompt is prefilled (one forward pass over the
/// prompt, which makes its caches) before the next step.
fn serving(tape: &mut Tape, model: &Model, target: usize, rng: &mut SplitMix64) {
    let slots = rng.between(2, 12) as usize;
    let chunk = rng.pick(&[1, 4, 16, 64]);
    let (longest_prompt, longest_output) = (rng.pick(&[128, 512, 2048]), rng.pick(&[64, 256, 1024]));
    struct Sequence {
        caches: Vec<([usize; 2], u64)>,
        length: u64,
        left: u64,
    }
    let prefill = |tape: &mut Tape, rng: &mut SplitMix64| {
        let prompt = rng.between(8, longest_prompt);
        let mut caches = Vec::with_capacity(model.layers);
        let mut x = tape.make(prompt * model.row);
        for _ in 0..model.layers {
            let mut keep = |tape: &mut Tape, k: usize, v: usize| {
                let capacity = room(prompt, chunk);
                caches.push(([(); 2].map(|_| tape.make(capacity * model.kv_row)), capacity));
                tape.free(k);
                tape.free(v);
            };
            x = model.layer(tape, x, prompt, prompt, Keep::Nothing, &mut keep).0;
        }
        tape.free(x);
        Sequence { caches, length: prompt, left: rng.between(4, longest_output) }
    };
    let mut active: Vec<Sequence> = (0..slots).map(|_| prefill(tape, rng)).collect();
    while tape.len() < target {
        let batch = active.len() as u64;
        let mut x = tape.make(batch * model.row);
        for layer in 0..model.layers {
            let context = active.iter().map(|s| s.length).max().unwrap_or(1);
            let mut grow = |tape: &mut Tape, k: usize, v: usize| {
                for s in active.iter_mut() {
                    let (cache, capacity) = &mut s.caches[layer];
                    grow_cache(tape, cache, capacity, s.length + 1, chunk, model.kv_row);
                }
                tape.free(k);
                tape.free(v);
            };
            x = model.layer(tape, x, batch, context, Keep::Nothing, &mut grow).0;
        }
        let logits = tape.make(batch * model.vocab * 4);
        tape.free(x);
        tape.free(logits);
        for s in active.iter_mut() {
            s.length += 1;
            s.left -= 1;
        }
        for s in active.iter_mut().filter(|s| s.left == 0) {
            for (cache, _) in &s.caches {
                cache.iter().for_each(|&b| tape.free(b));
            }
            *s = prefill(tape, rng);
        }
    }
}

enum Schedule {
    /// Each micro-batch's forward pass, then its backward pass.
    Accumulate,
    /// The same, keeping only each layer's input and recomputing the layer in the backward pass.
    Recompute,
    /// This many micro-batches' forward passes ahead of their backward passes.
    OneForwardOneBackward(usize),
}

/// A training step over micro-batches of a drawn number of tokens each (packed sequences vary in length),
/// with weight gradients from the first backward pass of each layer to the optimizer's step at the end.
fn training(tape: &mut Tape, model: &Model, target: usize, schedule: Schedule, rng: &mut SplitMix64) {
    let sequence = rng.pick(&[512, 1024, 2048]);
    let recompute = matches!(schedule, Schedule::Recompute);
    let per_micro_batch = model.layers as u64 * if recompute { 3 * model.per_layer() } else { 2 * model.per_layer() };
    let micro_batches = (target as u64 / per_micro_batch).max(1) as usize;
    let tokens: Vec<u64> = (0..micro_batches).map(|_| sequence - rng.below(sequence / 4)).collect();
    let mut grads: Vec<Option<[usize; 2]>> = vec![None; model.layers];
    let param = |model: &Model| model.row / 2 * model.row;
    // Forward passes keep, per micro-batch, each layer's saved tensors and the loss's gradient input.
    let forward = |tape: &mut Tape, mb: usize| -> (usize, Vec<Vec<usize>>) {
        let t = tokens[mb];
        let mut x = tape.make(t * model.row);
        let mut saved = Vec::with_capacity(model.layers);
        for _ in 0..model.layers {
            let keep = if recompute { Keep::Input } else { Keep::All };
            let (next, kept) = model.layer(tape, x, t, sequence, keep, &mut |tape, k, v| {
                if recompute {
                    tape.free(k);
                    tape.free(v);
                }
            });
            saved.push(kept);
            x = next;
        }
        let logits = tape.make(t * model.vocab * 2);
        tape.free(x);
        let grad = tape.make(t * model.row);
        tape.free(logits);
        (grad, saved)
    };
    let mut backward = |tape: &mut Tape, mb: usize, grad: usize, saved: Vec<Vec<usize>>| {
        let t = tokens[mb];
        let mut grad = grad;
        for (layer, mut kept) in saved.into_iter().enumerate().rev() {
            if recompute {
                let input = kept[0];
                let (out, again) = model.layer(tape, input, t, sequence, Keep::All, &mut |_, _, _| {});
                tape.free(out);
                kept = again;
            }
            let g_mlp = tape.make(t * model.mlp_row);
            let g_up = tape.make(t * model.mlp_row);
            tape.free(g_mlp);
            let g_mid = tape.make(t * model.row);
            tape.free(g_up);
            let g_attn = tape.make(t * model.row);
            let g_scores = (!model.fused_attention).then(|| tape.make(t * model.heads * sequence * 2));
            let g_qkv = tape.make(t * (model.row + 2 * model.kv_row));
            if let Some(g) = g_scores {
                tape.free(g);
            }
            tape.free(g_attn);
            grads[layer].get_or_insert_with(|| [tape.make(3 * param(model)), tape.make(2 * param(model))]);
            let g_x = tape.make(t * model.row);
            for b in [g_qkv, g_mid, grad] {
                tape.free(b);
            }
            for b in kept {
                tape.free(b);
            }
            grad = g_x;
        }
        tape.free(grad);
    };
    let ahead = match schedule {
        Schedule::OneForwardOneBackward(in_flight) => in_flight,
        _ => 1,
    };
    let mut pending = std::collections::VecDeque::new();
    for mb in 0..micro_batches {
        pending.push_back((mb, forward(tape, mb)));
        if pending.len() == ahead {
            let (done, (grad, saved)) = pending.pop_front().expect("in flight");
            backward(tape, done, grad, saved);
        }
    }
    while let Some((done, (grad, saved))) = pending.pop_front() {
        backward(tape, done, grad, saved);
    }
    // The optimizer's step: each layer's update reads its gradients.
    for g in grads.into_iter().flatten() {
        let update = tape.make(3 * param(model));
        for b in g {
            tape.free(b);
        }
        tape.free(update);
    }
}

/// A compiler's dataflow graph: `stages` of operators at one activation size each (halving the resolution
/// and doubling the channels between stages), each operator reading the previous one's output and, now and
/// then, a recent output of its stage (a residual) or a far one (a skip across stages), some in parallel
/// branches joined by a concatenation, some with a workspace live during the operator alone. The backward
/// pass runs the operators in reverse: each reads its saved inputs and the gradient of its output, and makes
/// the gradients of its inputs; weight gradients live to the end. Lifetimes are from the operator that makes
/// a tensor to the last that reads it.
fn dataflow(target: usize, rng: &mut SplitMix64) -> Vec<Buffer> {
    // Each operator makes about 2.5 tensors counting its backward pass.
    let operators = target * 2 / 5;
    let stages = rng.between(3, 6) as usize;
    let base = rng.pick(&[1u64 << 20, 3 << 19, 1 << 21, 3 << 20, 1 << 22]);
    let (p_residual, p_skip, p_branch, p_workspace) =
        (rng.between(5, 30), rng.between(0, 3), rng.between(0, 15), rng.between(5, 40));
    // (size, made at, last read), in order of making; operator k runs at time 2k + 1 (forward).
    let mut tensors: Vec<(u64, u64, u64)> = Vec::new();
    let mut outputs: Vec<usize> = Vec::with_capacity(operators);
    // For the backward pass: each operator's inputs.
    let mut inputs: Vec<Vec<usize>> = Vec::with_capacity(operators);
    let read = |tensors: &mut Vec<(u64, u64, u64)>, t: usize, at: u64| tensors[t].2 = tensors[t].2.max(at + 1);
    let mut size = base;
    for k in 0..operators {
        let now = 2 * k as u64 + 1;
        let stage = k * stages / operators;
        if k > 0 && stage != (k - 1) * stages / operators {
            size = size / 4 * 2;
        }
        let mut ins = Vec::new();
        if let Some(&prev) = outputs.last() {
            ins.push(prev);
            let r = rng.below(100);
            if r < p_residual && outputs.len() > 2 {
                ins.push(outputs[outputs.len() - 2 - rng.below((outputs.len() - 2).min(8) as u64) as usize]);
            } else if r < p_residual + p_skip && outputs.len() > 16 {
                ins.push(outputs[rng.below(outputs.len() as u64 - 8) as usize]);
            } else if r < p_residual + p_skip + p_branch && outputs.len() > 4 {
                // A branch joined here: the concatenation reads the last few outputs.
                let width = rng.between(2, 4) as usize;
                ins.extend(outputs[outputs.len() - width.min(outputs.len())..].iter().copied());
            }
        }
        for &i in &ins {
            read(&mut tensors, i, now);
        }
        if rng.below(100) < p_workspace {
            tensors.push((size * rng.between(1, 8) / 4, now, now + 1));
        }
        let out_size = match rng.below(8) {
            0 => size * 2,
            1 => size / 2,
            2 => size / 16 + 512,
            _ => size,
        };
        tensors.push((out_size.max(512), now, now + 1));
        outputs.push(tensors.len() - 1);
        inputs.push(ins);
    }
    // Backward: operator k at time 2 * (2n - k); the loss's gradient first.
    let end = 4 * operators as u64 + 2;
    let mut grad_of: Vec<Option<usize>> = vec![None; tensors.len()];
    let last = *outputs.last().expect("operators");
    tensors.push((tensors[last].0, 2 * operators as u64, 2 * operators as u64 + 1));
    grad_of[last] = Some(tensors.len() - 1);
    for k in (0..operators).rev() {
        let now = 2 * (2 * operators - k) as u64;
        let out = outputs[k];
        for &i in &inputs[k] {
            read(&mut tensors, i, now);
        }
        if let Some(g) = grad_of[out] {
            read(&mut tensors, g, now);
        }
        if rng.below(3) == 0 {
            // A weight gradient, kept for the optimizer.
            tensors.push(((tensors[out].0 / 8).max(512), now, end));
        }
        for &i in &inputs[k] {
            match grad_of[i] {
                // Gradients of a tensor read twice are summed into the first.
                Some(g) => read(&mut tensors, g, now),
                None => {
                    tensors.push((tensors[i].0, now, now + 1));
                    grad_of[i] = Some(tensors.len() - 1);
                }
            }
        }
        // The forward output is read by its operator's backward pass (a saved activation).
        read(&mut tensors, out, now);
    }
    tensors
        .into_iter()
        .enumerate()
        .map(|(id, (size, lower, upper))| Buffer { id: id as u64, lower, upper, size })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate;

    #[test]
    fn each_family_gives_the_same_large_graph_for_the_same_seed() {
        for family in GraphFamily::ALL {
            for seed in 1..4 {
                let graph = large_graph(family, seed);
                assert!((10_000..=65_000).contains(&graph.len()), "{family:?} {seed}: {}", graph.len());
                assert!(graph.iter().all(|b| b.lower < b.upper && b.size > 0), "{family:?} {seed}");
                assert_eq!(graph, large_graph(family, seed), "{family:?} {seed}");
                // Every buffer at its own offset is a valid plan: the buffers themselves are well formed.
                let stacked: Vec<u64> =
                    graph.iter().scan(0, |next, b| Some(std::mem::replace(next, *next + b.size))).collect();
                validate(&graph, &stacked, 1).unwrap();
            }
            assert_ne!(large_graph(family, 1), large_graph(family, 2), "{family:?}");
        }
    }
}
