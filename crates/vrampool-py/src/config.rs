//! The core's configuration keys and size text, for the Python layer, which builds the text form
//! from keyword options and parses nothing itself.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use vrampool_core::config::{parse_bytes, split_pairs, Scope, KEYS, STRATEGY_NAMES};
use vrampool_core::PoolConfig;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(config_keys, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(conf_pairs, m)?)?;
    // The rules the Python side shows (size histograms, the what-if's rows) without restating them.
    let defaults = PoolConfig::default();
    m.add("STRATEGIES", STRATEGY_NAMES.to_vec())?;
    m.add("ALIGNMENT", defaults.alignment)?;
    m.add("SMALL_MAX", defaults.small_max)?;
    m.add("LARGE_MIN", defaults.large_min)?;
    Ok(())
}

/// Every configuration key as `(name, kind, scope)`: kind `choice`, `bytes`, `count`,
/// `bytes_or_fraction` or `bool`; scope `pool` (every pool's) or `allocator` (the C ABI's only).
#[pyfunction]
fn config_keys() -> Vec<(&'static str, &'static str, &'static str)> {
    KEYS.iter().map(|k| (k.name, k.kind.name(), if k.scope == Scope::Pool { "pool" } else { "allocator" })).collect()
}

/// Bytes from a size text: a whole number with an optional binary unit (`1024`, `64KB`, `80GB`).
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    parse_bytes(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The `(key, value)` pairs of a configuration text (`key:value` separated by commas; a bracketed
/// value may hold commas); unbalanced brackets or a pair without a value are a `ValueError`.
#[pyfunction]
fn conf_pairs(text: &str) -> PyResult<Vec<(String, String)>> {
    let pairs = split_pairs(text).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(pairs.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
}
