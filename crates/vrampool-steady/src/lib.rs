//! The steady state of a vrampool pool: what runs on every allocation of every pool the binding
//! makes. A training loop repeats its step; once a step has been seen, the same step is served from
//! one arena at planned offsets, each allocation the next slot of a known sequence (no lock, no
//! hash, no device call), and a step that changes falls back to the pool from its first difference.
//!
//! - [`PlannedPool`]: records an iteration's allocations, plans them (`vrampool_plan`), and serves
//!   the same sequence later from the arena; plans per key, or per first allocation.
//! - [`PlannedMode`]: the planned arena as a mode of a `MemoryResource` (an adaptor over it), on for
//!   good (steady) or switched on and off, as the binding's pools and the C ABI use it. Steady, it
//!   gives threads that repeat their loops at once a planned pool each (`thread_lanes.rs`).
//!
//! Safe across streams: the arena is a region per stream, one block the pool handed out for that
//! stream, so its bytes only ever pass between buffers of one stream (in that stream's order); a
//! buffer used on another stream is left to the pool, or retires its region. Honest in its records:
//! where the pool scrubs, logs or tracks its blocks, it does the same for each arena buffer, and
//! leak reports and snapshots show arena buffers as the blocks they are. Where nothing repeats it
//! backs off (`idle.rs`), so a program that never repeats pays what the pool alone costs.

mod ahead;
mod ahead_steps;
mod cold;
mod figures;
mod idle;
mod mode;
mod peaks;
mod phases;
mod pool;
mod record;
mod regions;
mod schedule;
mod serving;
mod state;
mod stats;
mod thread_lanes;

pub use ahead::{AheadBuffer, AheadPlan};
pub use figures::{ArenaBuffer, ArenaRegion, KeyPlan, PlannedStats};
pub use mode::PlannedMode;
pub use pool::{PlannedPool, AUTO_KEY, AUTO_PLAN_ALLOCATIONS, DEFAULT_KEY};
