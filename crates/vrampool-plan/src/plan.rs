//! The planner's front door: pick an algorithm, get a validated plan with its lower bound.

use std::time::{Duration, Instant};

use crate::bound::lower_bound_of;
use crate::buffer::round_up;
use crate::{best_fit_decreasing, exact_search, greedy_by_size, validate, Buffer, PlanError};

/// Which offset assignment to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Both heuristics; if neither meets the lower bound, the exact search seeded with the better one.
    #[default]
    Auto,
    /// TFLite's greedy by size.
    GreedyBySize,
    /// XLA's best fit by decreasing size.
    BestFit,
    /// The exact search alone (falls back to greedy by size for parts it cannot solve in the budget).
    Exact,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [Algorithm::Auto, Algorithm::GreedyBySize, Algorithm::BestFit, Algorithm::Exact];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::GreedyBySize => "greedy-by-size",
            Algorithm::BestFit => "best-fit",
            Algorithm::Exact => "exact",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown algorithm `{s}` (expected auto, greedy-by-size, best-fit or exact)"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    pub algorithm: Algorithm,
    /// Time the exact search may take (Auto and Exact; default 5 s). Auto spends it only when neither
    /// heuristic meets the lower bound, and all of it only when the search cannot meet it either.
    pub budget: Duration,
    /// Every offset is a multiple of this (>= 1); sizes are rounded up to it inside the planner.
    pub alignment: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { algorithm: Algorithm::Auto, budget: Duration::from_secs(5), alignment: 1 }
    }
}

/// A plan: buffer `i` lives at `offsets[i]` of an arena of `arena_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Parallel to the input buffers.
    pub offsets: Vec<u64>,
    /// The highest end of any buffer, rounded up to the alignment.
    pub arena_bytes: u64,
    /// The most (aligned) bytes live at one time: no plan needs less.
    pub lower_bound_bytes: u64,
    /// The algorithm asked for.
    pub algorithm: Algorithm,
    /// Wall time spent planning (including validation).
    pub seconds: f64,
    /// Whether no plan has a smaller arena (it meets the lower bound, or the exact search proved it).
    pub optimal: bool,
}

/// Plans `buffers` with `options`. The result is checked by the independent validator before it is returned.
pub fn plan(buffers: &[Buffer], options: &PlanOptions) -> Result<Plan, PlanError> {
    let start = Instant::now();
    let alignment = options.alignment;
    crate::buffer::check_buffers(buffers, alignment)?;
    // check_buffers has shown the rounding cannot overflow.
    let lower_bound =
        lower_bound_of(buffers.iter().map(|b| (b.lower, b.upper, round_up(b.size, alignment).unwrap_or(u64::MAX))));
    let arena = |offsets: &[u64]| validate(buffers, offsets, alignment);

    let (offsets, proven) = match options.algorithm {
        Algorithm::GreedyBySize => (greedy_by_size(buffers, alignment)?, false),
        Algorithm::BestFit => (best_fit_decreasing(buffers, alignment)?, false),
        Algorithm::Exact => {
            let outcome = exact_search(buffers, alignment, options.budget, None)?;
            (outcome.offsets, outcome.optimal)
        }
        Algorithm::Auto => {
            // Cheapest first; stop as soon as a plan meets the lower bound.
            let greedy = greedy_by_size(buffers, alignment)?;
            let greedy_arena = arena(&greedy)?;
            if greedy_arena <= lower_bound {
                (greedy, true)
            } else {
                let best_fit = best_fit_decreasing(buffers, alignment)?;
                let best_fit_arena = arena(&best_fit)?;
                if best_fit_arena <= lower_bound {
                    (best_fit, true)
                } else {
                    let seed = if best_fit_arena < greedy_arena { best_fit } else { greedy };
                    let outcome = exact_search(buffers, alignment, options.budget, Some(&seed))?;
                    (outcome.offsets, outcome.optimal)
                }
            }
        }
    };
    let arena_bytes = arena(&offsets)?;
    Ok(Plan {
        offsets,
        arena_bytes,
        lower_bound_bytes: lower_bound,
        algorithm: options.algorithm,
        seconds: start.elapsed().as_secs_f64(),
        optimal: proven || arena_bytes <= lower_bound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(algorithm: Algorithm) -> PlanOptions {
        PlanOptions { algorithm, ..PlanOptions::default() }
    }

    #[test]
    fn every_algorithm_plans_a_small_instance_at_the_lower_bound() {
        // Lower bound 12 (time 3: 4 + 8); a ladder that any sensible planner stacks tightly.
        let buffers =
            [Buffer::new(0, 0, 4, 4), Buffer::new(1, 3, 8, 8), Buffer::new(2, 6, 10, 4), Buffer::new(3, 9, 12, 8)];
        for algorithm in Algorithm::ALL {
            let plan = plan(&buffers, &options(algorithm)).unwrap();
            assert_eq!(plan.lower_bound_bytes, 12);
            assert_eq!(plan.arena_bytes, 12, "{algorithm}");
            assert!(plan.optimal);
            assert_eq!(plan.algorithm, algorithm);
            assert_eq!(validate(&buffers, &plan.offsets, 1).unwrap(), plan.arena_bytes);
        }
    }

    #[test]
    fn exact_and_auto_prove_a_tight_instance_optimal() {
        // Every moment has exactly 5 bytes live, so any plan of 5 bytes is optimal.
        let buffers = [
            Buffer::new(0, 0, 2, 3),
            Buffer::new(1, 2, 4, 3),
            Buffer::new(2, 1, 3, 2),
            Buffer::new(3, 0, 1, 2),
            Buffer::new(4, 3, 4, 2),
        ];
        let exact = plan(&buffers, &options(Algorithm::Exact)).unwrap();
        let auto = plan(&buffers, &options(Algorithm::Auto)).unwrap();
        assert_eq!((exact.arena_bytes, exact.lower_bound_bytes), (5, 5));
        assert!(exact.optimal && auto.optimal && auto.arena_bytes == 5);
    }

    #[test]
    fn exact_and_auto_beat_the_heuristics_where_they_miss() {
        // Both heuristics need 13 bytes; 11 (the lower bound) is possible. Found by a random search.
        let buffers = [
            Buffer::new(0, 5, 6, 5),
            Buffer::new(1, 0, 3, 5),
            Buffer::new(2, 4, 8, 4),
            Buffer::new(3, 4, 6, 2),
            Buffer::new(4, 2, 5, 2),
            Buffer::new(5, 1, 3, 2),
        ];
        let arena = |algorithm| plan(&buffers, &options(algorithm)).unwrap();
        assert_eq!(arena(Algorithm::GreedyBySize).arena_bytes, 13);
        assert_eq!(arena(Algorithm::BestFit).arena_bytes, 13);
        for algorithm in [Algorithm::Exact, Algorithm::Auto] {
            let p = arena(algorithm);
            assert_eq!((p.arena_bytes, p.lower_bound_bytes, p.optimal), (11, 11, true), "{algorithm}");
        }
    }

    #[test]
    fn alignment_rounds_sizes_and_bounds() {
        let buffers = [Buffer::new(0, 0, 4, 100), Buffer::new(1, 2, 6, 100)];
        for algorithm in Algorithm::ALL {
            let options = PlanOptions { alignment: 256, ..options(algorithm) };
            let plan = plan(&buffers, &options).unwrap();
            assert!(plan.offsets.iter().all(|o| o % 256 == 0));
            assert_eq!((plan.arena_bytes, plan.lower_bound_bytes), (512, 512), "{algorithm}");
        }
    }

    #[test]
    fn empty_input_is_an_empty_plan() {
        let plan = plan(&[], &PlanOptions::default()).unwrap();
        assert_eq!((plan.arena_bytes, plan.lower_bound_bytes, plan.optimal), (0, 0, true));
    }

    #[test]
    fn bad_input_is_an_error_for_every_algorithm() {
        for algorithm in Algorithm::ALL {
            let o = options(algorithm);
            assert!(matches!(plan(&[Buffer::new(0, 2, 2, 8)], &o), Err(PlanError::EmptyLifetime { id: 0, .. })));
            assert!(matches!(plan(&[Buffer::new(4, 0, 2, 0)], &o), Err(PlanError::ZeroSize { id: 4 })));
            let twice = [Buffer::new(1, 0, 2, 8), Buffer::new(1, 2, 3, 8)];
            assert!(matches!(plan(&twice, &o), Err(PlanError::DuplicateId { id: 1 })));
            let huge = [Buffer::new(0, 0, 2, u64::MAX), Buffer::new(1, 0, 2, 1)];
            assert!(matches!(plan(&huge, &o), Err(PlanError::Overflow { .. })));
            let zero = PlanOptions { alignment: 0, ..o };
            assert!(matches!(plan(&[Buffer::new(0, 0, 2, 8)], &zero), Err(PlanError::ZeroAlignment)));
        }
    }

    #[test]
    fn algorithm_names_round_trip() {
        for algorithm in Algorithm::ALL {
            assert_eq!(algorithm.name().parse::<Algorithm>().unwrap(), algorithm);
        }
        assert!("fastest".parse::<Algorithm>().is_err());
    }
}
