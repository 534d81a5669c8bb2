//! The emulated machine, read once from the environment at the first driver call.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `EMULATED_CUDA_DEVICES` | 1 | number of devices |
//! | `EMULATED_CUDA_MEMORY` | 8GiB | memory of each device (`cuMemGetInfo`'s total); suffixes K, M, G, T (binary) |
//! | `EMULATED_CUDA_DRIVER_VERSION` | 13000 | what `cuDriverGetVersion` says |
//! | `EMULATED_CUDA_VMM` | 1 | 0: no virtual-memory management (the attribute reads 0, the calls fail) |
//! | `EMULATED_CUDA_GRANULARITY` | 2MiB | the virtual-memory granularity |
//! | `EMULATED_CUDA_FAIL` | | `cuMemCreate:3,cuMemMap:1:OUT_OF_MEMORY`: fail the Nth call of a function (code: name or number; default CUDA_ERROR_UNKNOWN); `cuMemAlloc_v2` and `cuMemAlloc` name the same function; a name the driver does not export, or an entry it cannot read, stops the process at the first driver call |
//! | `EMULATED_CUDA_STRICT` | 0 | 1: a stream-order race or an illegal address aborts the process |
//! | `EMULATED_CUDA_TRACE` | 0 | 1: every driver call is printed to stderr |

use crate::abi::{self, CuResult};
use crate::names::base_name;
use crate::symbols;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct Config {
    pub devices: i32,
    pub memory: u64,
    pub driver_version: i32,
    pub vmm: bool,
    pub granularity: u64,
    pub faults: Vec<Fault>,
    pub strict: bool,
    pub trace: bool,
}

/// Fail the `nth` call (1-based, counted from the start) of `function` with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Without its `_vN` suffix, the name calls are counted under.
    pub function: String,
    pub nth: u64,
    pub code: CuResult,
}

impl Config {
    /// The configuration from the environment; a malformed value is reported on stderr and its
    /// default used (the driver has no caller to return an error to at this point). A bad fault
    /// plan ends the process instead: a fault that never fires would let a test pass unexercised.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok(), symbols::exports).unwrap_or_else(|message| {
            eprintln!("emulated CUDA driver: {message}");
            std::process::exit(2)
        })
    }

    /// The configuration from `get`'s variables; an error for a fault plan that names a
    /// function `exports` denies, or that cannot be read.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, exports: impl Fn(&str) -> bool) -> Result<Self, String> {
        let read = |name: &str, default: u64, parse: fn(&str) -> Option<u64>| match get(name) {
            None => default,
            Some(text) => parse(text.trim()).unwrap_or_else(|| {
                eprintln!("emulated CUDA driver: ignoring {name}={text:?} (not understood); using {default}");
                default
            }),
        };
        let granularity = read("EMULATED_CUDA_GRANULARITY", 2 * MIB, |t| parse_bytes(t).filter(|g| g.is_power_of_two() && *g >= 4096));
        Ok(Self {
            devices: read("EMULATED_CUDA_DEVICES", 1, |t| t.parse().ok().filter(|&n| n <= 64)) as i32,
            memory: read("EMULATED_CUDA_MEMORY", 8 * GIB, |t| parse_bytes(t).filter(|&m| m > 0)),
            driver_version: read("EMULATED_CUDA_DRIVER_VERSION", 13000, |t| t.parse().ok().filter(|&v| v > 0 && v < i32::MAX as u64))
                as i32,
            vmm: read("EMULATED_CUDA_VMM", 1, parse_flag) == 1,
            granularity,
            faults: get("EMULATED_CUDA_FAIL").map(|t| parse_faults(&t, exports)).transpose()?.unwrap_or_default(),
            strict: read("EMULATED_CUDA_STRICT", 0, parse_flag) == 1,
            trace: read("EMULATED_CUDA_TRACE", 0, parse_flag) == 1,
        })
    }
}

fn parse_flag(text: &str) -> Option<u64> {
    match text {
        "0" | "" | "false" | "off" => Some(0),
        "1" | "true" | "on" => Some(1),
        _ => None,
    }
}

/// `4096`, `64K`, `2MiB`, `8G`, `1TB` (binary units).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    number.checked_mul(1 << shift)
}

/// `cuMemCreate:3,cuMemMap:1:OUT_OF_MEMORY`; an entry that cannot be read, or that names a
/// function `exports` denies, is an error.
pub fn parse_faults(text: &str, exports: impl Fn(&str) -> bool) -> Result<Vec<Fault>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|entry| {
            let fault = parse_fault(entry).ok_or_else(|| {
                format!("EMULATED_CUDA_FAIL entry {entry:?} is not FUNCTION:N[:CODE] (N from 1, CODE a CUDA_ERROR_ name or number)")
            })?;
            let function = entry.split(':').next().unwrap_or_default();
            match exports(function) {
                true => Ok(fault),
                false => Err(format!("EMULATED_CUDA_FAIL entry {entry:?}: the driver has no function {function}")),
            }
        })
        .collect()
}

fn parse_fault(entry: &str) -> Option<Fault> {
    let mut parts = entry.split(':');
    let function = base_name(parts.next().filter(|f| f.starts_with("cu"))?).to_string();
    let nth = parts.next()?.parse().ok().filter(|&n| n > 0)?;
    let code = match parts.next() {
        None => 999,
        Some(code) => abi::code_by_name(code).filter(|&c| c != abi::SUCCESS)?,
    };
    parts.next().is_none().then_some(Fault { function, nth, code })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Some of the driver's exports (the library's own symbol table is not the test binary's).
    fn exports(name: &str) -> bool {
        ["cuInit", "cuMemAlloc_v2", "cuMemCreate", "cuMemMap"].contains(&name)
    }

    fn with(vars: &[(&str, &str)]) -> Config {
        Config::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()), exports).unwrap()
    }

    #[test]
    fn defaults() {
        let c = with(&[]);
        assert_eq!((c.devices, c.memory, c.driver_version, c.vmm, c.granularity), (1, 8 * GIB, 13000, true, 2 * MIB));
        assert!(c.faults.is_empty() && !c.strict && !c.trace);
    }

    #[test]
    fn values_are_read_and_bad_ones_ignored() {
        let c = with(&[
            ("EMULATED_CUDA_DEVICES", "2"),
            ("EMULATED_CUDA_MEMORY", "512MiB"),
            ("EMULATED_CUDA_VMM", "0"),
            ("EMULATED_CUDA_GRANULARITY", "3000"),
        ]);
        assert_eq!((c.devices, c.memory, c.vmm, c.granularity), (2, 512 * MIB, false, 2 * MIB));
        assert_eq!(with(&[("EMULATED_CUDA_MEMORY", "lots")]).memory, 8 * GIB);
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("2MiB"), Some(2 * MIB));
        assert_eq!(parse_bytes("8GB"), Some(8 * GIB));
        assert_eq!(parse_bytes("1T"), Some(1 << 40));
        assert_eq!(parse_bytes("1X"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999T"), None);
    }

    #[test]
    fn fault_lists() {
        let f = parse_faults("cuMemCreate:3, cuMemMap:1:OUT_OF_MEMORY,,cuInit:2:2", exports).unwrap();
        assert_eq!(
            f,
            vec![
                Fault { function: "cuMemCreate".into(), nth: 3, code: 999 },
                Fault { function: "cuMemMap".into(), nth: 1, code: abi::OUT_OF_MEMORY },
                Fault { function: "cuInit".into(), nth: 2, code: abi::OUT_OF_MEMORY },
            ]
        );
    }

    #[test]
    fn a_bad_fault_plan_is_refused_with_the_reason() {
        for (text, says) in [
            ("cuMemAllocate:1", "the driver has no function cuMemAllocate"),
            ("cuInit:1,cuBogus_v2:1", "the driver has no function cuBogus_v2"),
            ("bogus", "is not FUNCTION:N[:CODE]"),
            ("cuInit:0", "is not FUNCTION:N[:CODE]"),
            ("cuInit:1:NOPE", "is not FUNCTION:N[:CODE]"),
            ("cuInit:2:2:9", "is not FUNCTION:N[:CODE]"),
        ] {
            let err = Config::from_lookup(|n| (n == "EMULATED_CUDA_FAIL").then(|| text.to_string()), exports).unwrap_err();
            assert!(err.starts_with("EMULATED_CUDA_FAIL entry") && err.contains(says), "{text}: {err}");
        }
    }
}
