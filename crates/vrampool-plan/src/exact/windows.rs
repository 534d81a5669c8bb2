//! Large parts (thousands of buffers, up to the whole of a training step or of a decoding run): decompose by
//! time, search windows, stitch.
//!
//! The buffers are taken in order of their start, a window at a time. Each window is searched as a part of
//! its own, with the buffers of earlier windows that are still live fixed where they were put (obstacles, see
//! `search.rs`), at a capacity that starts at the lower bound and rises only when the window does not fit in
//! one round of the round robin. A window's buffers that outlive it are then fixed for the next windows. So
//! the exact search sees a few hundred buffers at a time, and the plan stays as close to the bound as the
//! windows allow.
//!
//! Wider windows see further ahead but cost more a node (a node scans its group, and each placement updates
//! every section its neighbours span). So the width follows the clock: it halves while the sweep is behind
//! its share of the deadline and doubles while well ahead. Buffers left when the deadline comes are placed by
//! best fit among those placed, so the sweep always ends with a plan, on time.

use std::time::Instant;

use super::component::Component;
use super::probe::{orders, Prober};
use super::search::Outcome;
use crate::greedy::best_fit;
use crate::instance::Instance;
use crate::placed_index::PlacedIndex;

/// Buffers in the first window, and the fewest and most in any.
const FIRST_WINDOW: usize = 400;
const MIN_WINDOW: usize = 50;
const MAX_WINDOW: usize = 1_600;
/// The capacity's first rise, as a fraction of the bound; each further rise within a window is half as large
/// again.
const RISES_PER_BOUND: u64 = 1_024;

/// Offsets of the part's buffers (instance index, offset) and the arena they take; `target` is the lower
/// bound.
pub(crate) fn sweep(inst: &Instance, part: &[u32], target: u64, deadline: Instant, nodes: &mut u64) -> Vec<(u32, u64)> {
    let start = Instant::now();
    let mut order = part.to_vec();
    order.sort_unstable_by_key(|&i| (inst.lo[i as usize], i));
    let mut capacity = target;
    let mut placed = PlacedIndex::new(inst.segments);
    let mut offsets: Vec<(u32, u64)> = Vec::with_capacity(part.len());
    let mut spans = Vec::new();
    let (mut done, mut width) = (0, FIRST_WINDOW);
    while done < order.len() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let spent = (now - start).as_secs_f64() / (deadline - start).as_secs_f64().max(1e-9);
        let share = done as f64 / order.len() as f64;
        if spent > share + 0.05 {
            width = (width / 2).max(MIN_WINDOW);
        } else if spent < share / 2.0 {
            width = (width * 2).min(MAX_WINDOW);
        }
        let window = &order[done..(done + width).min(order.len())];
        let Some(local) = search_window(inst, window, &placed, &mut capacity, target, deadline, nodes) else {
            break;
        };
        for (i, offset) in local {
            let i_ = i as usize;
            placed.insert((offset, offset + inst.size[i_]), inst.lo[i_], inst.hi[i_]);
            offsets.push((i, offset));
        }
        done += window.len();
    }
    for &i in &order[done..] {
        offsets.push((i, best_fit(inst, &mut placed, i, &mut spans)));
    }
    offsets
}

/// The window's buffers placed clear of `placed`, at `capacity` or as little above it as the search finds
/// (raising `capacity` to it); `None` if the deadline comes first.
fn search_window(
    inst: &Instance,
    window: &[u32],
    placed: &PlacedIndex,
    capacity: &mut u64,
    target: u64,
    deadline: Instant,
    nodes: &mut u64,
) -> Option<Vec<(u32, u64)>> {
    let mut comp = Component::new(inst, window);
    let mut spans = Vec::new();
    let obstacles = comp
        .members
        .iter()
        .map(|&i| {
            spans.clear();
            placed.overlapping(inst.lo[i as usize], inst.hi[i as usize], &mut spans);
            spans.clone()
        })
        .collect();
    comp.set_obstacles(obstacles);
    let orders = orders(&comp);
    let mut rise = (target / RISES_PER_BOUND).max(1);
    loop {
        let mut prober = Prober::new(&comp, *capacity);
        for _ in 0..orders.len() {
            if let Outcome::Fits(local) = prober.step(&comp, &orders, deadline, nodes) {
                return Some(comp.members.iter().copied().zip(local).collect());
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        *capacity = capacity.saturating_add(rise);
        rise = rise.saturating_add(rise / 2);
    }
}
