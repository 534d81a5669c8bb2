//! The count of every driver call and the faults planned for them, by function name.
//!
//! Calls are counted under their name without the `_vN` suffix (`cuMemAlloc_v2` counts as
//! `cuMemAlloc`), which is also the name faults are planned for.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::abi::CuResult;
use crate::config::Fault;
use crate::names::base_name;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi;
    use crate::config::Config;

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

    #[test]
    fn a_fault_on_a_v2_name_fires_on_its_calls() {
        // Issue 48: `cuMemAlloc_v2:1` was planned under that name, calls are counted under
        // `cuMemAlloc`, and the fault never fired.
        let plan = |name: &str| (name == "EMULATED_CUDA_FAIL").then(|| "cuMemAlloc_v2:1:OUT_OF_MEMORY".to_string());
        let config = Config::from_lookup(plan, |name| name == "cuMemAlloc_v2").unwrap();
        assert_eq!(config.faults, [Fault { function: "cuMemAlloc".into(), nth: 1, code: abi::OUT_OF_MEMORY }]);
        let calls = Calls::new(&config.faults);
        assert_eq!(calls.count("cuMemAlloc_v2"), Some(abi::OUT_OF_MEMORY));
        assert_eq!(calls.count("cuMemAlloc_v2"), None);
    }
}
