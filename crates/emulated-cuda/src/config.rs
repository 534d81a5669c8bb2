//! The emulated machine, read once from the environment at the first driver call.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `EMULATED_CUDA_DEVICES` | 1 | number of devices |
//! | `EMULATED_CUDA_MEMORY` | 8GiB | memory of each device (`cuMemGetInfo`'s total); suffixes K, M, G, T (binary) |
//! | `EMULATED_CUDA_DRIVER_VERSION` | 13000 | what `cuDriverGetVersion` says |
//! | `EMULATED_CUDA_VMM` | 1 | 0: no virtual-memory management (the attribute reads 0, the calls fail) |
//! | `EMULATED_CUDA_GRANULARITY` | 2MiB | the virtual-memory granularity |
//! | `EMULATED_CUDA_FAIL` | | `cuMemCreate:3,cuMemMap:1:OUT_OF_MEMORY`: fail the Nth call of a function (code: name or number; default CUDA_ERROR_UNKNOWN) |
//! | `EMULATED_CUDA_STRICT` | 0 | 1: a stream-order race or an illegal address aborts the process |
//! | `EMULATED_CUDA_TRACE` | 0 | 1: every driver call is printed to stderr |

use crate::abi::{self, CuResult};

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
    pub function: String,
    pub nth: u64,
    pub code: CuResult,
}

impl Config {
    /// The configuration from the environment; a malformed value is reported on stderr and its
    /// default used (the driver has no caller to return an error to at this point).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let read = |name: &str, default: u64, parse: fn(&str) -> Option<u64>| match get(name) {
            None => default,
            Some(text) => parse(text.trim()).unwrap_or_else(|| {
                eprintln!("emulated CUDA driver: ignoring {name}={text:?} (not understood); using {default}");
                default
            }),
        };
        let granularity = read("EMULATED_CUDA_GRANULARITY", 2 * MIB, |t| parse_bytes(t).filter(|g| g.is_power_of_two() && *g >= 4096));
        Self {
            devices: read("EMULATED_CUDA_DEVICES", 1, |t| t.parse().ok().filter(|&n| n <= 64)) as i32,
            memory: read("EMULATED_CUDA_MEMORY", 8 * GIB, |t| parse_bytes(t).filter(|&m| m > 0)),
            driver_version: read("EMULATED_CUDA_DRIVER_VERSION", 13000, |t| t.parse().ok().filter(|&v| v > 0 && v < i32::MAX as u64))
                as i32,
            vmm: read("EMULATED_CUDA_VMM", 1, parse_flag) == 1,
            granularity,
            faults: get("EMULATED_CUDA_FAIL").map(|t| parse_faults(&t)).unwrap_or_default(),
            strict: read("EMULATED_CUDA_STRICT", 0, parse_flag) == 1,
            trace: read("EMULATED_CUDA_TRACE", 0, parse_flag) == 1,
        }
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

/// `cuMemCreate:3,cuMemMap:1:OUT_OF_MEMORY`; malformed entries are reported and skipped.
pub fn parse_faults(text: &str) -> Vec<Fault> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .filter_map(|entry| {
            let parsed = parse_fault(entry);
            if parsed.is_none() {
                eprintln!("emulated CUDA driver: ignoring EMULATED_CUDA_FAIL entry {entry:?} (want FUNCTION:N[:CODE])");
            }
            parsed
        })
        .collect()
}

fn parse_fault(entry: &str) -> Option<Fault> {
    let mut parts = entry.split(':');
    let function = parts.next().filter(|f| f.starts_with("cu"))?.to_string();
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

    fn with(vars: &[(&str, &str)]) -> Config {
        Config::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
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
        let f = parse_faults("cuMemCreate:3, cuMemMap:1:OUT_OF_MEMORY,bogus,cuInit:0,cuX:1:NOPE,cuY:2:2:9");
        assert_eq!(
            f,
            vec![
                Fault { function: "cuMemCreate".into(), nth: 3, code: 999 },
                Fault { function: "cuMemMap".into(), nth: 1, code: abi::OUT_OF_MEMORY },
            ]
        );
    }
}
