//! Static memory planning: given each buffer's lifetime and size, choose offsets in one arena so that buffers
//! live at the same time never share a byte, with the arena as small as possible.
//!
//! - [`lower_bound`]: the most bytes live at once, which no plan can beat.
//! - [`greedy_by_size`] (TFLite) and [`best_fit_decreasing`] (XLA): fast heuristics, O(n log n + overlaps).
//! - [`exact_search`]: MiniMalloc-style branch and bound over canonical placements, anytime, under a budget.
//! - [`plan`]: one call that runs them ([`Algorithm::Auto`] stops as soon as the lower bound is met) and checks
//!   the result with [`validate`], an independent sweep-based checker.
//! - [`decide`]: the same at a fixed capacity, as MiniMalloc decides it: a plan that fits, a proof that none
//!   does, or neither within the budget.
//! - [`read_csv`] / [`write_plan_csv`]: the MiniMalloc CSV format `id,lower,upper,size[,offset]`.
//! - [`quick_plan`]: a plan in O(n log n) with no search and no clock, for a runtime that plans while a
//!   program waits (the planned arena of `vrampool-steady`).
//!
//! A planner is a pure function from buffers to offsets; it knows nothing of pools.
//!
//! ```
//! use vrampool_plan::{plan, validate, Buffer, PlanOptions};
//!
//! // Live on [lower, upper), in steps; sizes in bytes.
//! let buffers = [Buffer::new(0, 0, 4, 1024), Buffer::new(1, 2, 6, 512), Buffer::new(2, 4, 8, 1024)];
//! let p = plan(&buffers, &PlanOptions::default())?;
//! assert_eq!(p.lower_bound_bytes, 1536); // buffers 1 and 2 at steps 4 and 5
//! assert_eq!(p.arena_bytes, 1536);
//! assert!(p.optimal);
//! assert_eq!(validate(&buffers, &p.offsets, 1)?, 1536);
//! # Ok::<(), vrampool_plan::PlanError>(())
//! ```

mod bound;
mod buffer;
mod csv;
mod error;
mod exact;
mod floors;
mod greedy;
mod instance;
mod order;
mod placed_index;
mod plan;
mod ring;
mod rng;
#[cfg(any(test, feature = "generators"))]
mod synthetic;
mod trace;
mod validate;

pub use bound::lower_bound;
pub use buffer::Buffer;
pub use csv::{csv_files, read_csv, read_plan_csv, write_plan_csv};
pub use error::PlanError;
pub use exact::{exact_search, ExactOutcome};
pub use greedy::{best_fit_decreasing, greedy_by_size};
#[doc(hidden)]
pub use plan::plan_with_stages;
pub use plan::{decide, plan, quick_plan, Algorithm, Decision, Plan, PlanOptions, QuickPlacement, QuickPlan};
#[cfg(any(test, feature = "generators"))]
pub use synthetic::{
    large_graph, llm_decoding_instance, llm_training_instance, packed_instance, random_instance, GraphFamily,
};
#[doc(hidden)]
pub use trace::{Stage, Stages};
pub use validate::validate;
