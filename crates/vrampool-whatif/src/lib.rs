//! What the pool would do beside the allocators people run today, on a recorded trace.
//!
//! The models of PyTorch's, RMM's, CuPy's and the driver's pools ([`peers`]), the trace replay
//! that runs them and the pool over the core's address-only simulated device ([`replay`]), the
//! replay's rows by name ([`replay_row`]) and a trace's live bytes ([`trace_live`]). The core
//! knows nothing of this crate: the what-if is a user of the pool, as the bindings are.

pub mod peers;
pub mod replay;
pub mod replay_row;
pub mod trace_live;
