//! Decides the buffers of a large graph (`large_graph`) that live near its most loaded moments, each window
//! with its lifetimes cut to the window: a window that does not fit at a capacity would prove the whole graph
//! does not either, and one that fits says the peak alone is not what keeps a plan above that capacity.
//!
//! `cargo run --release -p vrampool-plan --features generators --example window_bound -- FAMILY SEED HALF_WIDTH SLACK SECONDS
//! [WINDOWS]`: windows of HALF_WIDTH steps either side of the WINDOWS (3) most loaded moments, each decided
//! at (1 + SLACK) times the whole graph's bound within SECONDS; a half width past the last step decides the
//! whole graph. FAMILY `random-N` is the random instance of N buffers (`random_instance`) of that seed.

use std::time::{Duration, Instant};

use vrampool_plan::{
    decide, large_graph, lower_bound, random_instance, Algorithm, Buffer, Decision, GraphFamily, PlanOptions,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [family, seed, half_width, slack, seconds, rest @ ..] = args.as_slice() else {
        return Err("usage: FAMILY SEED HALF_WIDTH SLACK SECONDS [WINDOWS]".into());
    };
    let (seed, half_width, slack): (u64, u64, f64) = (seed.parse()?, half_width.parse()?, slack.parse()?);
    let budget = Duration::from_secs_f64(seconds.parse()?);
    let windows: usize = rest.first().map(|w| w.parse()).transpose()?.unwrap_or(3);

    let buffers = match family.strip_prefix("random-") {
        Some(n) => random_instance(n.parse()?, seed),
        None => {
            let graph =
                GraphFamily::ALL.into_iter().find(|f| f.name() == family).ok_or(format!("no family {family}"))?;
            large_graph(graph, seed)
        }
    };
    let bound = lower_bound(&buffers);
    let capacity = (bound as f64 * (1.0 + slack)).ceil() as u64;
    let load = load_by_step(&buffers);
    println!("{family} seed {seed}: {} buffers, bound {bound}, {} steps", buffers.len(), load.len());
    let mut moments: Vec<u64> = (0..load.len() as u64).collect();
    moments.sort_by_key(|&t| std::cmp::Reverse(load[t as usize]));
    let mut centres: Vec<u64> = Vec::new();
    for t in moments {
        if centres.len() == windows {
            break;
        }
        if centres.iter().any(|&c| c.abs_diff(t) <= half_width) {
            continue;
        }
        centres.push(t);
        let (lower, upper) = (t.saturating_sub(half_width), t.saturating_add(half_width + 1));
        let window: Vec<Buffer> = buffers
            .iter()
            .filter(|b| b.lower < upper && b.upper > lower)
            .map(|b| Buffer::new(b.id, b.lower.max(lower), b.upper.min(upper), b.size))
            .collect();
        let began = Instant::now();
        let options = PlanOptions { algorithm: Algorithm::Auto, budget, alignment: 1 };
        let verdict = match decide(&window, capacity, &options)? {
            Decision::Fits(_) => "fits",
            Decision::Infeasible => "infeasible",
            Decision::Unknown => "unknown",
        };
        println!(
            "  step {t} (load {:.4} of the bound): {} buffers, {verdict} at {:.4} in {:.2} s",
            load[t as usize] as f64 / bound as f64,
            window.len(),
            capacity as f64 / bound as f64,
            began.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Bytes live at each step, from the first to the last.
fn load_by_step(buffers: &[Buffer]) -> Vec<u64> {
    let steps = buffers.iter().map(|b| b.upper).max().unwrap_or(0) as usize;
    let mut change = vec![0i128; steps + 1];
    for b in buffers {
        change[b.lower as usize] += i128::from(b.size);
        change[b.upper as usize] -= i128::from(b.size);
    }
    let mut live = 0i128;
    change[..steps]
        .iter()
        .map(|c| {
            live += c;
            live as u64
        })
        .collect()
}
