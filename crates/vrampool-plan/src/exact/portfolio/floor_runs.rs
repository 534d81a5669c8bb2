//! The floor-runs stage: lowest floor first (`floors/`) with each tie-break, among the portfolio's runs.

use super::Run;
use crate::order::Order;

/// Lowest floor first's runs, each with whether time runs backwards: by start first, the cheapest good one
/// (it comes close to the bound on most graphs). The other tie-breaks run forwards only: a buffer's floor, the
/// highest top over its lifetime, is the same with time backwards, and so are their ranks, so the run
/// backwards would be the same.
pub(super) const FLOOR_RUNS: [(Run, bool); 6] = [
    (Run::Floors(Order::Time), false),
    (Run::Floors(Order::Time), true),
    (Run::Floors(Order::Wat), false),
    (Run::Floors(Order::Taw), false),
    (Run::Floors(Order::Area), false),
    (Run::Floors(Order::Twa), false),
];
