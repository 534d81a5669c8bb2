//! Property tests on random small instances: every plan is valid, no plan beats the lower bound, the exact
//! search is never worse than the heuristics, and on tiny instances it matches a brute-force optimum.

use std::time::Duration;

use proptest::prelude::*;
use vrampool_plan::{
    best_fit_decreasing, exact_search, greedy_by_size, lower_bound, plan, validate, Algorithm, Buffer, PlanOptions,
};

/// Up to `max` buffers with ids 0.., lifetimes within 0..24 and sizes 1..=64.
fn instance(max: usize) -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((0u64..20, 1u64..8, 1u64..=64), 1..=max).prop_map(|rows| {
        rows.into_iter()
            .enumerate()
            .map(|(id, (lower, length, size))| Buffer::new(id as u64, lower, lower + length, size))
            .collect()
    })
}

/// The best arena over all orders of stacking each buffer right on top of the earlier ones it overlaps. Every
/// plan pushed down as far as it goes is one of these (list its buffers by offset), so this is the optimum.
fn brute_force(buffers: &[Buffer]) -> u64 {
    fn go(
        buffers: &[Buffer],
        order: &mut Vec<usize>,
        used: &mut [bool],
        offsets: &mut [u64],
        top: u64,
        best: &mut u64,
    ) {
        if top >= *best {
            return;
        }
        if order.len() == buffers.len() {
            *best = top;
            return;
        }
        for i in 0..buffers.len() {
            if used[i] {
                continue;
            }
            let floor = order
                .iter()
                .filter(|&&j| buffers[j].overlaps(&buffers[i]))
                .map(|&j| offsets[j] + buffers[j].size)
                .max()
                .unwrap_or(0);
            offsets[i] = floor;
            used[i] = true;
            order.push(i);
            go(buffers, order, used, offsets, top.max(floor + buffers[i].size), best);
            order.pop();
            used[i] = false;
        }
    }
    let mut best = u64::MAX;
    let n = buffers.len();
    go(buffers, &mut Vec::new(), &mut vec![false; n], &mut vec![0; n], 0, &mut best);
    best
}

/// Whether two buffers that meet in time share a byte, by checking every pair.
fn conflicts_by_pairs(buffers: &[Buffer], offsets: &[u64]) -> bool {
    (0..buffers.len()).any(|i| {
        (0..i).any(|j| {
            buffers[i].overlaps(&buffers[j])
                && offsets[i] < offsets[j] + buffers[j].size
                && offsets[j] < offsets[i] + buffers[i].size
        })
    })
}

fn options(algorithm: Algorithm, alignment: u64) -> PlanOptions {
    PlanOptions { algorithm, budget: Duration::from_secs(2), alignment }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_is_valid_and_above_the_lower_bound(
        buffers in instance(24),
        alignment in prop::sample::select(vec![1u64, 8, 64]),
    ) {
        let aligned: Vec<Buffer> =
            buffers.iter().map(|b| Buffer { size: b.size.div_ceil(alignment) * alignment, ..*b }).collect();
        let bound = lower_bound(&aligned);
        for algorithm in Algorithm::ALL {
            let plan = plan(&buffers, &options(algorithm, alignment)).unwrap();
            prop_assert_eq!(plan.offsets.len(), buffers.len());
            prop_assert_eq!(validate(&buffers, &plan.offsets, alignment).unwrap(), plan.arena_bytes);
            prop_assert!(!conflicts_by_pairs(&buffers, &plan.offsets));
            prop_assert_eq!(plan.lower_bound_bytes, bound);
            prop_assert!(plan.arena_bytes >= bound);
            if plan.arena_bytes == bound {
                prop_assert!(plan.optimal);
            }
            if matches!(algorithm, Algorithm::GreedyBySize | Algorithm::BestFit) {
                // The heuristics prove nothing beyond meeting the bound.
                prop_assert_eq!(plan.optimal, plan.arena_bytes == bound);
            }
        }
    }

    #[test]
    fn exact_search_is_never_worse_than_the_heuristics(buffers in instance(16)) {
        let arena = |offsets: &[u64]| validate(&buffers, offsets, 1).unwrap();
        let greedy = arena(&greedy_by_size(&buffers, 1).unwrap());
        let best_fit = arena(&best_fit_decreasing(&buffers, 1).unwrap());
        let exact = exact_search(&buffers, 1, Duration::from_secs(5), None).unwrap();
        prop_assert!(exact.optimal, "16 buffers should be solved well within 5 s");
        prop_assert!(arena(&exact.offsets) <= greedy.min(best_fit));
        let auto = plan(&buffers, &options(Algorithm::Auto, 1)).unwrap();
        prop_assert_eq!(auto.arena_bytes, arena(&exact.offsets));
    }

    #[test]
    fn exact_search_matches_brute_force_on_tiny_instances(buffers in instance(7)) {
        let exact = exact_search(&buffers, 1, Duration::from_secs(5), None).unwrap();
        prop_assert!(exact.optimal);
        prop_assert_eq!(validate(&buffers, &exact.offsets, 1).unwrap(), brute_force(&buffers));
    }

    #[test]
    fn validator_agrees_with_checking_every_pair(
        buffers in instance(12),
        seeds in prop::collection::vec(0u64..96, 12),
    ) {
        let offsets: Vec<u64> = seeds[..buffers.len()].to_vec();
        let verdict = validate(&buffers, &offsets, 1);
        prop_assert_eq!(verdict.is_err(), conflicts_by_pairs(&buffers, &offsets));
        if let Ok(arena) = verdict {
            let highest = buffers.iter().zip(&offsets).map(|(b, o)| o + b.size).max().unwrap();
            prop_assert_eq!(arena, highest);
        }
    }

    #[test]
    fn lower_bound_is_the_busiest_moment(buffers in instance(24)) {
        let busiest = (0..30)
            .map(|t| buffers.iter().filter(|b| b.lower <= t && t < b.upper).map(|b| b.size).sum::<u64>())
            .max()
            .unwrap();
        prop_assert_eq!(lower_bound(&buffers), busiest);
    }
}
