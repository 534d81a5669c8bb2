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
//!
//! - [`PlannedPool`]: a planned arena over a core pool: records an iteration's allocations, plans them, and
//!   serves the same sequence later from one arena, falling back to the pool on divergence (plans per key).
//! - [`PlannedMode`]: the planned arena as a mode of a `MemoryResource` (an adaptor over it), switched on and
//!   off, as the C ABI's allocator uses it.
//!
//! A planner is a pure function from buffers to offsets; only the planned arena knows about pools.
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

mod arena;
mod bound;
mod buffer;
mod csv;
mod error;
mod exact;
mod floors;
mod greedy;
mod instance;
mod mode;
mod order;
mod placed_index;
mod plan;
mod synthetic;
mod trace;
mod validate;

pub use arena::{KeyPlan, PlannedPool, PlannedStats, AUTO_KEY, AUTO_PLAN_ALLOCATIONS, DEFAULT_KEY};
pub use bound::lower_bound;
pub use buffer::Buffer;
pub use csv::{csv_files, read_csv, read_plan_csv, write_plan_csv};
pub use error::PlanError;
pub use exact::{exact_search, ExactOutcome};
pub use greedy::{best_fit_decreasing, greedy_by_size};
pub use mode::PlannedMode;
#[doc(hidden)]
pub use plan::plan_with_stages;
pub use plan::{decide, plan, Algorithm, Decision, Plan, PlanOptions};
pub use synthetic::{
    large_graph, llm_decoding_instance, llm_training_instance, packed_instance, random_instance, GraphFamily,
};
#[doc(hidden)]
pub use trace::{Stage, Stages};
pub use validate::validate;
