//! What every exported function does first: count the call, fail it if a fault is planned for
//! it, print it when tracing, and turn a panic into an error code instead of an abort.
//!
//! Calls are counted under their name without the `_vN` suffix (`cuMemAlloc_v2` counts as
//! `cuMemAlloc`), which is also the name faults are planned for.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use parking_lot::Mutex;

use crate::abi::{self, CuResult};
use crate::config::Fault;

/// Counts and planned faults, by function name.
#[derive(Default)]
pub struct Calls {
    state: Mutex<CallState>,
}

#[derive(Default)]
struct CallState {
    counts: HashMap<String, u64>,
    /// Function -> (call number that fails, code).
    faults: HashMap<String, Vec<(u64, CuResult)>>,
    unsupported: Vec<String>,
}

impl Calls {
    pub fn new(faults: &[Fault]) -> Self {
        let calls = Self::default();
        for f in faults {
            calls.state.lock().faults.entry(f.function.clone()).or_default().push((f.nth, f.code));
        }
        calls
    }

    /// Counts a call of `name`; the planned error code if this call is to fail.
    pub fn count(&self, name: &str) -> Option<CuResult> {
        let base = base_name(name);
        let mut state = self.state.lock();
        let n = {
            let count = state.counts.entry(base.to_string()).or_insert(0);
            *count += 1;
            *count
        };
        let planned = state.faults.get_mut(base)?;
        let at = planned.iter().position(|&(nth, _)| nth == n)?;
        Some(planned.swap_remove(at).1)
    }

    /// Makes the `nth` call of `name` from now (1 = the next) fail with `code`; 0 clears every
    /// fault planned for it.
    pub fn fail_in(&self, name: &str, nth: u64, code: CuResult) {
        let base = base_name(name).to_string();
        let mut state = self.state.lock();
        if nth == 0 {
            state.faults.remove(&base);
            return;
        }
        let done = state.counts.get(&base).copied().unwrap_or(0);
        state.faults.entry(base).or_default().push((done + nth, code));
    }

    pub fn count_of(&self, name: &str) -> u64 {
        self.state.lock().counts.get(base_name(name)).copied().unwrap_or(0)
    }

    /// Every count, as `name count` lines sorted by name.
    pub fn report(&self) -> String {
        let state = self.state.lock();
        let mut lines: Vec<_> = state.counts.iter().map(|(name, n)| format!("{name} {n}\n")).collect();
        lines.sort();
        lines.concat()
    }

    pub fn reset(&self) {
        let mut state = self.state.lock();
        state.counts.clear();
        state.faults.clear();
        state.unsupported.clear();
    }

    pub fn note_unsupported(&self, name: &str) -> bool {
        let mut state = self.state.lock();
        let first = !state.unsupported.iter().any(|n| n == name);
        if first {
            state.unsupported.push(name.to_string());
        }
        first
    }
}

/// `cuMemAlloc_v2` -> `cuMemAlloc`; `_ptds` / `_ptsz` suffixes go too.
pub fn base_name(name: &str) -> &str {
    let name = name.trim_end_matches("_ptds").trim_end_matches("_ptsz");
    match name.rfind("_v") {
        Some(at) if name[at + 2..].chars().all(|c| c.is_ascii_digit()) && at + 2 < name.len() => &name[..at],
        _ => name,
    }
}

/// Runs one driver call: counted, maybe failed by a planned fault, traced, and never unwinding
/// into C (a panic is reported and becomes `CUDA_ERROR_UNKNOWN`).
pub fn run(name: &'static str, body: impl FnOnce() -> Result<(), CuResult>) -> CuResult {
    let emulator = crate::emulator();
    if let Some(code) = emulator.calls.count(name) {
        if emulator.config.trace {
            eprintln!("emulated CUDA driver: {name} -> {} (injected)", abi::code_name(code).unwrap_or("?"));
        }
        return code;
    }
    let result = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            eprintln!("emulated CUDA driver: {name} panicked (a bug in the emulator); returning CUDA_ERROR_UNKNOWN");
            999
        }
    };
    if emulator.config.trace {
        eprintln!("emulated CUDA driver: {name} -> {}", abi::code_name(result).unwrap_or("?"));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_their_version() {
        assert_eq!(base_name("cuMemAlloc_v2"), "cuMemAlloc");
        assert_eq!(base_name("cuCtxCreate_v4"), "cuCtxCreate");
        assert_eq!(base_name("cuMemcpyHtoDAsync_v2_ptsz"), "cuMemcpyHtoDAsync");
        assert_eq!(base_name("cuMemsetD8Async"), "cuMemsetD8Async");
        assert_eq!(base_name("cuGraph_v"), "cuGraph_v");
    }

    #[test]
    fn faults_fail_exactly_the_planned_call() {
        let calls = Calls::new(&[Fault { function: "cuMemCreate".into(), nth: 2, code: 2 }]);
        assert_eq!(calls.count("cuMemCreate"), None);
        assert_eq!(calls.count("cuMemCreate"), Some(2));
        assert_eq!(calls.count("cuMemCreate"), None);
        calls.fail_in("cuMemMap", 1, 999);
        assert_eq!(calls.count("cuMemMap"), Some(999));
        assert_eq!(calls.count("cuMemMap"), None);
        calls.fail_in("cuMemAlloc_v2", 2, 2);
        assert_eq!(calls.count("cuMemAlloc_v2"), None);
        assert_eq!(calls.count("cuMemAlloc"), Some(2), "counted and failed under the base name");
        calls.fail_in("cuInit", 1, 3);
        calls.fail_in("cuInit", 0, 0);
        assert_eq!(calls.count("cuInit"), None, "cleared");
        assert_eq!(calls.count_of("cuMemCreate"), 3);
        assert!(calls.report().contains("cuMemCreate 3\n"));
    }
}
