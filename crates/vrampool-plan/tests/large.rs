//! Large graphs, planned as large parts (`exact/large.rs`): LLM-like lifetimes from the crate's generators.
//! Every plan is checked by the validator.

use std::time::{Duration, Instant};

use vrampool_plan::{
    decide, greedy_by_size, large_graph, llm_decoding_instance, llm_training_instance, plan, random_instance, validate,
    Algorithm, Buffer, Decision, GraphFamily, PlanOptions,
};

fn auto(buffers: &[Buffer], budget: Duration) -> vrampool_plan::Plan {
    let options = PlanOptions { algorithm: Algorithm::Auto, budget, alignment: 1 };
    let p = plan(buffers, &options).unwrap();
    assert_eq!(validate(buffers, &p.offsets, 1).unwrap(), p.arena_bytes);
    assert!(p.lower_bound_bytes <= p.best_bound_bytes && p.best_bound_bytes <= p.arena_bytes);
    p
}

#[test]
fn a_decoding_graph_packs_its_growing_caches_far_better_than_greedy() {
    // 8 layers, 60 tokens: over 5,000 buffers, one time-connected part, so planned window by window.
    let buffers = llm_decoding_instance(8, 64, 60, 4096);
    assert!(buffers.len() > 5_000, "{}", buffers.len());
    let greedy = validate(&buffers, &greedy_by_size(&buffers, 1).unwrap(), 1).unwrap();
    let p = auto(&buffers, Duration::from_secs(3));
    let ratio = |arena: u64| arena as f64 / p.lower_bound_bytes as f64;
    assert!(ratio(greedy) > 1.5, "greedy by size at {:.3} of the bound", ratio(greedy));
    // Best fit in order of start reaches 1.052 here; lowest floor first, the first run, the bound.
    let (planned, greedy) = (ratio(p.arena_bytes), ratio(greedy));
    assert!(planned <= 1.005, "planned at {planned:.4} of the bound, greedy at {greedy:.3}");
}

#[test]
fn a_training_graph_meets_its_bound() {
    let buffers = llm_training_instance(16, 4, 1024, 7);
    let p = auto(&buffers, Duration::from_secs(3));
    assert_eq!(p.arena_bytes, p.lower_bound_bytes);
    assert!(p.optimal);
}

#[test]
fn a_decoding_graph_is_decided_window_by_window() {
    let buffers = llm_decoding_instance(8, 64, 60, 4096);
    let options = PlanOptions { algorithm: Algorithm::Auto, budget: Duration::from_secs(3), alignment: 1 };
    let bound = vrampool_plan::lower_bound(&buffers);
    // Best fit in order of start reaches 1.052 of the bound here, greedy by size and best fit far less;
    // lowest floor first fits within 1.005.
    let capacity = bound + bound / 200;
    let Decision::Fits(p) = decide(&buffers, capacity, &options).unwrap() else {
        panic!("no plan at 1.005 of the bound")
    };
    assert!(p.arena_bytes <= capacity);
    assert_eq!(validate(&buffers, &p.offsets, 1).unwrap(), p.arena_bytes);
    // The windows prove nothing: just above the bound the answer is a plan or "unknown", never "infeasible".
    assert_ne!(decide(&buffers, bound, &options).unwrap(), Decision::Infeasible);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "32,000 buffers: scripts/test.sh runs it in release")]
fn decide_finds_a_plan_at_the_arena_that_plan_reaches() {
    // The portfolio's runs end 3.6-4% above the bound on this graph and only their lowering reaches 2.5%, so a
    // decision whose runs stop at the capacity finds nothing there (it was "unknown" at 3% in 10 s).
    let buffers = large_graph(GraphFamily::Serving, 4);
    let options = PlanOptions { algorithm: Algorithm::Auto, budget: Duration::from_secs(5), alignment: 1 };
    let planned = auto(&buffers, options.budget);
    let capacity = planned.arena_bytes + planned.lower_bound_bytes / 200;
    let options = PlanOptions { budget: Duration::from_secs(10), ..options };
    let Decision::Fits(p) = decide(&buffers, capacity, &options).unwrap() else {
        panic!("no plan at {capacity}, where plan reached {}", planned.arena_bytes)
    };
    assert!(p.arena_bytes <= capacity);
    assert_eq!(validate(&buffers, &p.offsets, 1).unwrap(), p.arena_bytes);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "60,000 buffers: scripts/test.sh runs it in release")]
fn ragged_sizes_are_planned_in_classes() {
    // Sizes a power of two plus up to 16 KiB: the portfolio's best plan is 1.054 of the bound and no run or band
    // takes it lower; best fit decreasing on sizes rounded up to classes of 8 bits, settled, is at 1.007. It
    // gets a quarter of the time after the heuristics: in 5 s that is 0.8 s for its 0.5 s on an idle machine,
    // too little where other tests share the cores, so the test gives 20 s (the 5 s figure is BENCHMARKS.md's,
    // from `random_plan 60000 5 6`).
    let buffers = random_instance(60_000, 6);
    let p = auto(&buffers, Duration::from_secs(20));
    let ratio = p.arena_bytes as f64 / p.lower_bound_bytes as f64;
    assert!(ratio <= 1.02, "planned at {ratio:.4} of the bound");
}

#[test]
fn the_budget_holds_where_greedy_by_size_would_take_longer() {
    // A staircase: every buffer meets every other, and the sizes leave gaps, so greedy by size and best fit
    // scan thousands of them for each buffer (13 s for 40,000 in release, against a budget of half a second).
    let n = if cfg!(debug_assertions) { 8_000 } else { 40_000 };
    let buffers: Vec<Buffer> = (0..n).map(|i| Buffer::new(i, i, i + n, 1 + (i * 7_919) % 4_096)).collect();
    let bound = vrampool_plan::lower_bound(&buffers);
    let budget = Duration::from_millis(500);
    // Generous: the budget's point is seconds against tens of them.
    let within = budget + Duration::from_secs(1);
    for algorithm in [Algorithm::Auto, Algorithm::Exact] {
        let options = PlanOptions { algorithm, budget, alignment: 1 };
        let began = Instant::now();
        let p = plan(&buffers, &options).unwrap();
        assert!(began.elapsed() < within, "{algorithm}: {:?}", began.elapsed());
        // Any plan of buffers that all meet stacks them: the bound.
        assert_eq!((validate(&buffers, &p.offsets, 1).unwrap(), p.arena_bytes), (bound, bound), "{algorithm}");
        let began = Instant::now();
        assert!(matches!(decide(&buffers, bound, &options).unwrap(), Decision::Fits(_)), "{algorithm}");
        assert!(began.elapsed() < within, "decide, {algorithm}: {:?}", began.elapsed());
    }
}
