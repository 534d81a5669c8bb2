//! What every exported function does first: count the call, fail it if a fault is planned for
//! it, print it when tracing, and turn a panic into an error code instead of an abort.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::{self, CuResult};

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
