//! Benchmarks only: see `pool.rs` and `planner.rs` beside this file.
