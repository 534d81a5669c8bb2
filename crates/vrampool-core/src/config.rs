//! Configuration, and its one text form (`VRAMPOOL_CONF`, in the spirit of
//! `PYTORCH_CUDA_ALLOC_CONF`): `strategy:hybrid,limit:0.9,small_max:1MB`.
//!
//! Every layer reads its options through here (the pool, the C ABI's allocator, the Python
//! keyword options, `replay --conf`), so the same text means the same thing everywhere, and the
//! parsing is strict: bytes are a whole number with an optional binary unit (`4096`, `64KB`,
//! `2GiB`; `4096.9` is an error, not 4096), a fraction is written with a point and lies in
//! (0, 1] (`limit:0.9`; `limit:1.5` is an error, `limit:1` is one byte), names are spelt one
//! way. [`KEYS`] lists every key with the kind of value it takes.

use crate::error::PoolError;
use crate::sizes::{round_up, size_class_of, GIB, KIB, MIB, MIN_BLOCK};
use crate::strategy::{StrategyKind, SHARED_SLAB_MAX};

/// Zero-filling of blocks, so that one user's data never reaches the next (shared GPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scrub {
    /// No zero-filling (the default): a reused block holds what its last user left there.
    #[default]
    Off,
    /// Zero-fills a block when it is freed, before it can be handed out again (deferred frees
    /// when they complete). Memory of a fresh segment is not filled: the device hands it out.
    OnFree,
    /// Zero-fills a block just before it is handed out (fast path too).
    OnAlloc,
}

impl Scrub {
    pub const NAMES: [&'static str; 3] = ["off", "on_free", "on_alloc"];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "off" => Some(Self::Off),
            "on_free" => Some(Self::OnFree),
            "on_alloc" => Some(Self::OnAlloc),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::OnFree => "on_free",
            Self::OnAlloc => "on_alloc",
        }
    }
}

/// The handles an `ipc` pool's segments are shared by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IpcHandles {
    /// POSIX file descriptors of virtual-memory allocations where the device has virtual-memory
    /// management, legacy IPC handles elsewhere (the default).
    #[default]
    Auto,
    /// Always legacy IPC handles of `cuMemAlloc` segments (`cuIpcGetMemHandle`): what Numba's,
    /// CuPy's and PyTorch's importers open.
    Legacy,
}

impl IpcHandles {
    pub const NAMES: [&'static str; 2] = ["auto", "legacy"];

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(Self::Auto),
            "legacy" => Some(Self::Legacy),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Legacy => "legacy",
        }
    }
}

/// A cap on the memory a pool may reserve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    Bytes(u64),
    /// A fraction of the device's total memory, in (0, 1].
    Fraction(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    pub strategy: StrategyKind,
    /// Requests up to this size go to the slab (hybrid).
    pub small_max: u64,
    /// Requests of at least this size go to the buddy (hybrid); the ones between go to best-fit.
    pub large_min: u64,
    /// Alignment of every block; a power of two, at least 512.
    pub alignment: u64,
    /// Rounds each request up to one of this many evenly spaced sizes per power of two (the notes'
    /// padding, PyTorch's `roundup_power2_divisions`): fewer distinct sizes, less fragmentation,
    /// some padding. 0 turns it off.
    pub round_up_divisions: u32,
    pub limit: Option<Limit>,
    /// Record every alloc and free in the event log (the trace replay reads).
    pub record_events: bool,
    /// Grow the best-fit tier of each stream as one expandable segment: one reserved address
    /// range with physical memory mapped and unmapped in granularity chunks (PyTorch's
    /// `expandable_segments`). Takes effect only where the device supports virtual-memory
    /// growth; elsewhere the tier uses plain segments.
    pub expandable: bool,
    /// Before asking the device for more memory, empty the block caches into their strategies
    /// and give back the segments (and unmap the expandable chunks) that no block uses, in every
    /// tier and stream: one tier's cache then never stays reserved beside another tier's growth,
    /// nor a step's stale sizes beside the next step's. Only growth pays for it (a steady loop
    /// never grows), and only a growth that would take the pool past the most it has ever
    /// reserved: below that mark, giving back would not lower the peak, only make the pool grow
    /// the same segments again. On by default.
    pub reclaim: bool,
    /// Serve a repeating workload's steps from one planned arena once each has been seen
    /// (`vrampool_steady::PlannedMode::steady`, which the binding puts over the pool; the pool alone
    /// ignores it): after warm-up a step makes no device call and no sync, and reserves what its
    /// plan needs. A step ends at PyTorch's optimizer step, or once everything it allocated is
    /// freed. On by default.
    pub steady: bool,
    /// Zero-fill blocks on free or on allocation (off by default).
    pub scrub: Scrub,
    /// Record each live block's allocation time, for the ages in leak reports (`live_blocks`).
    /// Off by default, so the fast path reads no clock.
    pub track_leaks: bool,
    /// Make every segment shareable with other processes (a CUDA device makes each one
    /// physical allocation with a POSIX file-descriptor handle). Implies no expandable
    /// segments, so that every block lies in one physical allocation. Off by default.
    pub ipc: bool,
    /// The handles an `ipc` pool shares its segments by (`IpcHandles`).
    pub ipc_handles: IpcHandles,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            strategy: StrategyKind::Hybrid,
            small_max: MIB,
            large_min: 64 * MIB,
            alignment: MIN_BLOCK,
            round_up_divisions: 0,
            limit: None,
            record_events: false,
            expandable: true,
            reclaim: true,
            steady: true,
            scrub: Scrub::Off,
            track_leaks: false,
            ipc: false,
            ipc_handles: IpcHandles::Auto,
        }
    }
}

/// Where a request goes: its padded size, its tier, the size of the block it gets.
impl PoolConfig {
    /// `size` aligned, and padded to a bucket with `round_up_divisions`; None on overflow.
    pub fn padded(&self, size: u64) -> Option<u64> {
        let rounded = round_up(size, self.alignment)?;
        if self.round_up_divisions <= 1 || rounded <= MIN_BLOCK {
            return Some(rounded);
        }
        let floor_pow2 = 1u64 << (63 - rounded.leading_zeros());
        let step = (floor_pow2 / self.round_up_divisions as u64).max(self.alignment);
        round_up(rounded, step)
    }

    /// The tier (strategy instance) that serves a padded request of `rounded` bytes.
    #[inline(always)]
    pub fn tier_of(&self, rounded: u64) -> u8 {
        match self.strategy {
            StrategyKind::Hybrid if rounded <= self.small_max => 0,
            StrategyKind::Hybrid if rounded < self.large_min => 1,
            StrategyKind::Hybrid => 2,
            _ => 0,
        }
    }

    /// The real size `tier`'s strategy hands out for a request of `rounded` bytes, which is the
    /// size class its cached blocks are kept under.
    #[inline(always)]
    pub fn block_size_for(&self, rounded: u64, tier: u8) -> u64 {
        match (self.strategy, tier) {
            (StrategyKind::Slab, _) | (StrategyKind::Hybrid, 0) => size_class_of(rounded),
            (StrategyKind::Buddy, _) => rounded.next_power_of_two(),
            (StrategyKind::Hybrid, 2) => round_up(rounded, self.large_unit()).unwrap_or(u64::MAX),
            _ => rounded,
        }
    }

    /// The largest block of the first tier that is cached whenever it is freed: every one, unless
    /// the first tier is a slab, whose runs (classes above `SHARED_SLAB_MAX`) are cached only when
    /// the slab's first fit would place the next run of their size at the same address
    /// (`Strategy::placed_next`), and go back to it before the tier places or frees anything else.
    /// Design: a run cached anywhere else keeps its place while the slab carves other classes'
    /// runs elsewhere, so the small tier's segments fragment; given back, the run merges in the
    /// first fit, and the next run of any size is carved lowest address first, which keeps live
    /// runs packed into the lowest segments. The kept run changes no placement, and spares the
    /// next allocation of its class the tier's lock.
    #[inline(always)]
    pub fn first_tier_cached_max(&self) -> u64 {
        match self.strategy {
            StrategyKind::Slab | StrategyKind::Hybrid => SHARED_SLAB_MAX,
            StrategyKind::BestFit | StrategyKind::Buddy => u64::MAX,
        }
    }

    /// Whether a freed block of `size` bytes from `tier` is a run of the first tier, cached only as its
    /// kept run (above `first_tier_cached_max`).
    #[inline(always)]
    pub fn is_kept_run(&self, tier: u8, size: u64) -> bool {
        tier == 0 && size > self.first_tier_cached_max()
    }

    /// The smallest block of the hybrid's large tier, which cuts its blocks to the request in these
    /// units (a trimmed buddy): a thirty-second of `large_min` (so the rounding costs at most 3%),
    /// between 512 B and 2 MiB (the usual device page).
    pub fn large_unit(&self) -> u64 {
        let floor = 63 - self.large_min.leading_zeros();
        1 << floor.saturating_sub(5).clamp(MIN_BLOCK.trailing_zeros(), (2 * MIB).trailing_zeros())
    }
}

/// What a key's value is, in its text form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// One of a few names, spelt exactly.
    Choice(&'static [&'static str]),
    /// A whole number of bytes with an optional binary unit: `4096`, `64KB`, `2GiB`.
    Bytes,
    /// A whole number.
    Count,
    /// Bytes as above, or a fraction of the device's memory in (0, 1] written with a point.
    BytesOrFraction,
    /// `true` / `false` (also `1` / `0`, `yes` / `no`, `on` / `off`).
    Bool,
}

impl ValueKind {
    /// The kind's name, as the Python layer reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Choice(_) => "choice",
            Self::Bytes => "bytes",
            Self::Count => "count",
            Self::BytesOrFraction => "bytes_or_fraction",
            Self::Bool => "bool",
        }
    }
}

/// Who reads a key: every pool, or only the allocator the C ABI makes pools with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Pool,
    /// Which device the C ABI's pools are made on.
    Allocator,
}

/// A configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub kind: ValueKind,
    pub scope: Scope,
}

/// The strategies' names, as the `strategy` key takes them.
pub const STRATEGY_NAMES: [&str; 4] = ["slab", "best_fit", "buddy", "hybrid"];
const DEVICE_NAMES: [&str; 2] = ["cuda", "sim"];

const fn key(name: &'static str, kind: ValueKind, scope: Scope) -> Key {
    Key { name, kind, scope }
}

/// Every key, in the order the documentation lists them.
pub const KEYS: [Key; 17] = [
    key("strategy", ValueKind::Choice(&STRATEGY_NAMES), Scope::Pool),
    key("small_max", ValueKind::Bytes, Scope::Pool),
    key("large_min", ValueKind::Bytes, Scope::Pool),
    key("alignment", ValueKind::Bytes, Scope::Pool),
    key("round_up_divisions", ValueKind::Count, Scope::Pool),
    key("limit", ValueKind::BytesOrFraction, Scope::Pool),
    key("record_events", ValueKind::Bool, Scope::Pool),
    key("expandable", ValueKind::Bool, Scope::Pool),
    // PyTorch's name for it.
    key("expandable_segments", ValueKind::Bool, Scope::Pool),
    key("scrub", ValueKind::Choice(&Scrub::NAMES), Scope::Pool),
    key("track_leaks", ValueKind::Bool, Scope::Pool),
    key("reclaim", ValueKind::Bool, Scope::Pool),
    key("steady", ValueKind::Bool, Scope::Pool),
    key("ipc", ValueKind::Bool, Scope::Pool),
    key("ipc_handles", ValueKind::Choice(&IpcHandles::NAMES), Scope::Pool),
    key("device", ValueKind::Choice(&DEVICE_NAMES), Scope::Allocator),
    key("sim_capacity", ValueKind::Bytes, Scope::Allocator),
];

/// The names of the keys of `scope`.
pub fn key_names(scope: Scope) -> Vec<&'static str> {
    KEYS.iter().filter(|k| k.scope == scope).map(|k| k.name).collect()
}

fn invalid(message: String) -> PoolError {
    PoolError::InvalidConfig(message)
}

/// The `key:value` (or `key=value`) pairs of a text, separated by commas; a value may be a bracketed
/// list with commas inside (`roundup_power2_divisions:[256:1,>:4]`). Brackets must balance: an open
/// one would take the rest of the text into one value, and a stray `]` would join the pairs after it.
pub fn split_pairs(text: &str) -> Result<Vec<(&str, &str)>, PoolError> {
    let unbalanced = |what: &str| invalid(format!("unbalanced brackets in `{}`: {what}", text.trim()));
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or_else(|| unbalanced("a `]` closes no `[`"))?,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(unbalanced("a `[` is never closed"));
    }
    items.push(&text[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) =
                pair.split_once(':').or_else(|| pair.split_once('=')).ok_or_else(|| invalid(format!("`{pair}` is not key:value")))?;
            Ok((key.trim(), value.trim()))
        })
        .collect()
}

impl PoolConfig {
    pub fn validate(&self) -> Result<(), PoolError> {
        let bad = |msg: String| Err(invalid(msg));
        if !self.alignment.is_power_of_two() || self.alignment < MIN_BLOCK || self.alignment > GIB {
            return bad(format!("alignment must be a power of two between 512 B and 1 GiB, got {}", self.alignment));
        }
        if self.small_max < MIN_BLOCK || self.small_max > 64 * MIB {
            return bad(format!("small_max must lie between 512 B and 64 MiB, got {}", self.small_max));
        }
        if self.large_min <= self.small_max {
            return bad(format!("large_min ({}) must exceed small_max ({})", self.large_min, self.small_max));
        }
        if self.round_up_divisions != 0 && !self.round_up_divisions.is_power_of_two() || self.round_up_divisions > 64 {
            return bad(format!("round_up_divisions must be 0 or a power of two up to 64, got {}", self.round_up_divisions));
        }
        match self.limit {
            Some(Limit::Fraction(f)) if !(f > 0.0 && f <= 1.0) => bad(format!("limit fraction must lie in (0, 1], got {f}")),
            Some(Limit::Bytes(0)) => bad("limit of 0 bytes".into()),
            _ => Ok(()),
        }
    }

    /// Applies `key:value` pairs separated by commas over this configuration, then validates
    /// it. Every pool key of [`KEYS`] is taken; any other key is an error that lists them.
    /// Nothing is applied from a text with an error in it.
    pub fn apply_text(&mut self, text: &str) -> Result<(), PoolError> {
        let mut next = self.clone();
        for (key, value) in split_pairs(text)? {
            if !next.set(key, value)? {
                return Err(invalid(format!("unknown configuration key `{key}` (pool keys: {})", key_names(Scope::Pool).join(", "))));
            }
        }
        next.validate()?;
        *self = next;
        Ok(())
    }

    /// Sets one pool key; false when `key` is none of them.
    fn set(&mut self, key: &str, value: &str) -> Result<bool, PoolError> {
        match key {
            "strategy" => self.strategy = StrategyKind::parse(parse_choice(key, value, &STRATEGY_NAMES)?).expect("a strategy name"),
            "small_max" => self.small_max = parse_key_bytes(key, value)?,
            "large_min" => self.large_min = parse_key_bytes(key, value)?,
            "alignment" => self.alignment = parse_key_bytes(key, value)?,
            "round_up_divisions" => {
                self.round_up_divisions =
                    value.parse().map_err(|_| invalid(format!("round_up_divisions: `{value}` is not a whole number")))?
            }
            "limit" => self.limit = Some(parse_limit(value)?),
            "record_events" => self.record_events = parse_bool(key, value)?,
            "expandable" | "expandable_segments" => self.expandable = parse_bool(key, value)?,
            "scrub" => self.scrub = Scrub::parse(parse_choice(key, value, &Scrub::NAMES)?).expect("a scrub name"),
            "track_leaks" => self.track_leaks = parse_bool(key, value)?,
            "reclaim" => self.reclaim = parse_bool(key, value)?,
            "steady" => self.steady = parse_bool(key, value)?,
            "ipc" => self.ipc = parse_bool(key, value)?,
            "ipc_handles" => {
                self.ipc_handles = IpcHandles::parse(parse_choice(key, value, &IpcHandles::NAMES)?).expect("an ipc_handles name")
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// What the C ABI's pools are made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cuda,
    /// The host-backed simulated device (tests, and trying things on a machine without a GPU).
    Sim,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Sim => "sim",
        }
    }
}

/// The environment variable the allocator's configuration is read from first.
pub const ENV_VAR: &str = "VRAMPOOL_CONF";

/// The configuration the C ABI makes every device's pool from: the pool's keys and the
/// allocator's own (`device`, `sim_capacity`).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// The text it was parsed from: `VRAMPOOL_CONF`, then what `configure` was given.
    pub text: String,
    pub pool: PoolConfig,
    pub device: DeviceKind,
    /// The simulated device's memory, with `device:sim`.
    pub sim_capacity: u64,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self { text: String::new(), pool: PoolConfig::default(), device: DeviceKind::Cuda, sim_capacity: 16 * GIB }
    }
}

impl AllocatorConfig {
    /// Defaults, then `env` (`VRAMPOOL_CONF`'s text), then `text`; later keys win. An error names
    /// the text it comes from.
    pub fn parse(env: &str, text: &str) -> Result<Self, PoolError> {
        let mut config = Self::default();
        for (source, part) in [(ENV_VAR, env), ("configuration", text)] {
            config.apply_text(part).map_err(|e| invalid(format!("{source} `{part}`: {}", reason(&e))))?;
        }
        config.text = [env.trim(), text.trim()].into_iter().filter(|t| !t.is_empty()).collect::<Vec<_>>().join(",");
        Ok(config)
    }

    fn apply_text(&mut self, text: &str) -> Result<(), PoolError> {
        let mut next = self.clone();
        for (key, value) in split_pairs(text)? {
            match key {
                "device" => {
                    next.device = if parse_choice(key, value, &DEVICE_NAMES)? == "sim" { DeviceKind::Sim } else { DeviceKind::Cuda }
                }
                "sim_capacity" => {
                    next.sim_capacity = parse_key_bytes(key, value)?;
                    if next.sim_capacity == 0 {
                        return Err(invalid("sim_capacity must be positive".into()));
                    }
                }
                _ if next.pool.set(key, value)? => {}
                _ => {
                    return Err(invalid(format!(
                        "unknown configuration key `{key}` (pool keys: {}; allocator keys: {})",
                        key_names(Scope::Pool).join(", "),
                        key_names(Scope::Allocator).join(", ")
                    )))
                }
            }
        }
        next.pool.validate()?;
        *self = next;
        Ok(())
    }

    /// Whether pools made from `other` would be the same as from this (the texts may differ).
    pub fn makes_the_same_pools(&self, other: &Self) -> bool {
        (&self.pool, self.device, self.sim_capacity) == (&other.pool, other.device, other.sim_capacity)
    }
}

/// A key's value in a configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Name(&'static str),
    Bytes(u64),
    Count(u64),
    Limit(Option<Limit>),
    Bool(bool),
}

impl PoolConfig {
    /// The value of the pool key `key`; None for another key.
    pub fn value(&self, key: &str) -> Option<Value> {
        Some(match key {
            "strategy" => Value::Name(self.strategy.name()),
            "small_max" => Value::Bytes(self.small_max),
            "large_min" => Value::Bytes(self.large_min),
            "alignment" => Value::Bytes(self.alignment),
            "round_up_divisions" => Value::Count(self.round_up_divisions.into()),
            "limit" => Value::Limit(self.limit),
            "record_events" => Value::Bool(self.record_events),
            "expandable" | "expandable_segments" => Value::Bool(self.expandable),
            "scrub" => Value::Name(self.scrub.name()),
            "track_leaks" => Value::Bool(self.track_leaks),
            "reclaim" => Value::Bool(self.reclaim),
            "steady" => Value::Bool(self.steady),
            "ipc" => Value::Bool(self.ipc),
            "ipc_handles" => Value::Name(self.ipc_handles.name()),
            _ => return None,
        })
    }
}

impl AllocatorConfig {
    /// The value of any key of [`KEYS`]; None for another key.
    pub fn value(&self, key: &str) -> Option<Value> {
        match key {
            "device" => Some(Value::Name(self.device.name())),
            "sim_capacity" => Some(Value::Bytes(self.sim_capacity)),
            _ => self.pool.value(key),
        }
    }
}

/// An error's message without the "invalid configuration: " its display starts with.
fn reason(e: &PoolError) -> String {
    match e {
        PoolError::InvalidConfig(message) => message.clone(),
        other => other.to_string(),
    }
}

fn parse_choice<'a>(key: &str, value: &'a str, names: &[&str]) -> Result<&'a str, PoolError> {
    if names.contains(&value) {
        Ok(value)
    } else {
        Err(invalid(format!("unknown {key} `{value}`: {key} must be one of {}", names.join(", "))))
    }
}

fn parse_key_bytes(key: &str, value: &str) -> Result<u64, PoolError> {
    parse_bytes(value).map_err(|e| invalid(format!("{key}: {}", reason(&e))))
}

/// A whole number of bytes with an optional binary unit (as PyTorch's units are): `1024`,
/// `64KB`, `2GiB`, `1T`. A fractional number (`1.5MiB`, `4096.9`) is an error.
pub fn parse_bytes(text: &str) -> Result<u64, PoolError> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => 1024 * GIB,
        _ => return Err(invalid(format!("`{text}` is not a whole number of bytes with an optional unit (4096, 64KB, 2GiB)"))),
    };
    if number.is_empty() {
        return Err(invalid(format!("`{text}` is not a whole number of bytes with an optional unit (4096, 64KB, 2GiB)")));
    }
    number.parse::<u64>().ok().and_then(|n| n.checked_mul(scale)).ok_or_else(|| invalid(format!("size `{text}` is out of range")))
}

/// A limit: bytes (`40GB`, `1073741824`), or a fraction of the device written with a point
/// (`0.9`, `1.0`).
pub fn parse_limit(text: &str) -> Result<Limit, PoolError> {
    let text = text.trim();
    if let Ok(bytes) = parse_bytes(text) {
        return match bytes {
            0 => Err(invalid("limit of 0 bytes".into())),
            b => Ok(Limit::Bytes(b)),
        };
    }
    match text.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(Limit::Fraction(f)),
        _ => Err(invalid(format!(
            "limit must be bytes (a whole number with an optional unit: 40GB) or a fraction of the device in (0, 1] (0.9), got `{text}`"
        ))),
    }
}

fn parse_bool(key: &str, text: &str) -> Result<bool, PoolError> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(format!("{key}: `{text}` is not a boolean (true or false)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_sets_every_key() {
        let mut config = PoolConfig::default();
        config
            .apply_text("strategy:best_fit, small_max:256KB,large_min=128MiB,alignment:4096,limit:0.5,record_events:on,expandable:false")
            .unwrap();
        assert!(!config.expandable);
        assert!(PoolConfig::default().expandable, "expandable segments are the default");
        config.apply_text("expandable_segments:true").unwrap();
        assert!(config.expandable);
        assert_eq!(config.strategy, StrategyKind::BestFit);
        assert_eq!(config.small_max, 256 * KIB);
        assert_eq!(config.large_min, 128 * MIB);
        assert_eq!(config.alignment, 4096);
        assert_eq!(config.limit, Some(Limit::Fraction(0.5)));
        assert!(config.record_events);
        assert_eq!(config.scrub, Scrub::Off, "scrubbing is off by default");
        assert!(!config.track_leaks, "leak tracking is off by default");
        config.apply_text("scrub:on_free,track_leaks:true,reclaim:false,round_up_divisions:4").unwrap();
        assert_eq!((config.scrub, config.track_leaks, config.reclaim, config.round_up_divisions), (Scrub::OnFree, true, false, 4));
        assert!(!config.ipc, "sharing is off by default");
        config.apply_text("ipc:true").unwrap();
        assert!(config.ipc);
        assert_eq!(config.ipc_handles, IpcHandles::Auto);
        config.apply_text("ipc_handles:legacy").unwrap();
        assert_eq!(config.ipc_handles, IpcHandles::Legacy);
        assert!(config.apply_text("ipc_handles:fd").is_err(), "auto or legacy only");
        config.apply_text("scrub:on_alloc").unwrap();
        assert_eq!(config.scrub, Scrub::OnAlloc);
        config.apply_text("scrub:off").unwrap();
        assert_eq!(config.scrub, Scrub::Off);
    }

    /// A valid value of each key, by its kind.
    fn sample(key: Key) -> &'static str {
        match key.kind {
            ValueKind::Choice(names) => names[0],
            ValueKind::Bytes if key.name == "large_min" => "128MiB",
            ValueKind::Bytes => "512KB",
            ValueKind::Count => "4",
            ValueKind::BytesOrFraction => "0.5",
            ValueKind::Bool => "true",
        }
    }

    #[test]
    fn every_key_of_the_table_is_read_and_nothing_else() {
        for key in KEYS {
            let text = format!("{}:{}", key.name, sample(key));
            let mut allocator = AllocatorConfig::default();
            allocator.apply_text(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let pool = PoolConfig::default().apply_text(&text);
            assert_eq!(pool.is_ok(), key.scope == Scope::Pool, "{text}: {pool:?}");
            assert!(allocator.value(key.name).is_some(), "{} has a value", key.name);
            assert_eq!(PoolConfig::default().value(key.name).is_some(), key.scope == Scope::Pool, "{}", key.name);
            if let ValueKind::Choice(names) = key.kind {
                for name in names {
                    allocator.apply_text(&format!("{}:{name}", key.name)).unwrap();
                }
            }
        }
        assert_eq!(key_names(Scope::Allocator), ["device", "sim_capacity"]);
        assert_eq!(AllocatorConfig::default().value("colour"), None);
        let set = AllocatorConfig::parse("", "limit:0.5,device:sim,scrub:on_free").unwrap();
        assert_eq!(
            [set.value("limit"), set.value("device"), set.value("scrub")],
            [Some(Value::Limit(Some(Limit::Fraction(0.5)))), Some(Value::Name("sim")), Some(Value::Name("on_free"))]
        );
        let err = PoolConfig::default().apply_text("colour:blue").unwrap_err().to_string();
        assert!(err.contains("unknown configuration key `colour`") && err.contains("round_up_divisions, limit"), "{err}");
        let err = PoolConfig::default().apply_text("device:sim").unwrap_err().to_string();
        assert!(err.contains("unknown configuration key `device`"), "a pool has no device key: {err}");
    }

    #[test]
    fn bytes_are_whole_numbers_with_an_optional_unit() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes(" 64KB ").unwrap(), 64 * KIB);
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 * GIB);
        assert_eq!(parse_bytes("2 g").unwrap(), 2 * GIB);
        assert_eq!(parse_bytes("1T").unwrap(), 1024 * GIB);
        for bad in ["4096.9", "1.5MiB", "4096.0", "-1", "+1", "1e3", "", "KB", "12XB", "nan", "18446744073709551616", "17179869184GB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        let mut config = PoolConfig::default();
        let err = config.apply_text("alignment:4096.9").unwrap_err().to_string();
        assert!(err.contains("alignment: `4096.9` is not a whole number of bytes"), "{err}");
        assert_eq!(config.alignment, MIN_BLOCK);
        assert!(config.apply_text("small_max:64KB,alignment:3").is_err());
        assert_eq!(config, PoolConfig::default(), "nothing is applied from a text with an error in it");
    }

    #[test]
    fn a_limit_is_bytes_or_a_fraction_written_with_a_point() {
        assert_eq!(parse_limit("40GB").unwrap(), Limit::Bytes(40 * GIB));
        assert_eq!(parse_limit("1").unwrap(), Limit::Bytes(1), "a whole number is bytes, not the whole device");
        assert_eq!(parse_limit("1.0").unwrap(), Limit::Fraction(1.0));
        assert_eq!(parse_limit("0.9").unwrap(), Limit::Fraction(0.9));
        for bad in ["1.5", "0.0", "0", "-0.5", "-1", "nan", "inf", "half", "1.5GB", "2x"] {
            let err = parse_limit(bad).unwrap_err().to_string();
            assert!(err.contains("limit"), "{bad}: {err}");
        }
        assert!(parse_limit("1.5").unwrap_err().to_string().contains("limit must be bytes"), "limit:1.5 is refused, not one byte");
    }

    #[test]
    fn names_are_spelt_one_way() {
        for bad in ["strategy:best-fit", "strategy:HYBRID", "strategy:bestfit", "scrub:on-free", "scrub:none", "scrub:0"] {
            let err = PoolConfig::default().apply_text(bad).unwrap_err().to_string();
            assert!(err.contains("must be one of"), "{bad}: {err}");
        }
        let err = PoolConfig::default().apply_text("strategy:fastest").unwrap_err().to_string();
        assert!(err.contains("unknown strategy `fastest`: strategy must be one of slab, best_fit, buddy, hybrid"), "{err}");
    }

    #[test]
    fn bad_text_is_a_clear_error() {
        for text in [
            "expandable:maybe",
            "small_max:lots",
            "limit:-3",
            "alignment:1000",
            "small_max",
            "limit:1.5x",
            "scrub:sometimes",
            "track_leaks:maybe",
            "round_up_divisions:4.0",
            "round_up_divisions:3",
        ] {
            let err = PoolConfig::default().apply_text(text).unwrap_err();
            assert!(matches!(err, PoolError::InvalidConfig(_)), "{text}: {err}");
        }
    }

    #[test]
    fn unbalanced_brackets_are_an_error_not_a_lost_rest() {
        for (text, what) in [
            ("foo:[1", "a `[` is never closed"),
            ("strategy:slab,foo:[1,bar:2", "a `[` is never closed"),
            ("a:1],colour:blue", "a `]` closes no `[`"),
            ("a:[1]],b:2", "a `]` closes no `[`"),
        ] {
            let err = split_pairs(text).unwrap_err();
            assert!(matches!(err, PoolError::InvalidConfig(_)), "{text}: {err}");
            assert!(err.to_string().contains(&format!("unbalanced brackets in `{text}`: {what}")), "{text}: {err}");
            assert!(PoolConfig::default().apply_text(text).is_err(), "{text}");
            assert!(AllocatorConfig::parse(text, "").unwrap_err().to_string().contains("unbalanced brackets"), "{text}");
        }
        assert_eq!(split_pairs(" a:[1,2] , b=3,").unwrap(), [("a", "[1,2]"), ("b", "3")]);
    }

    #[test]
    fn the_allocator_reads_the_environment_then_the_call() {
        let c = AllocatorConfig::parse("device:sim,strategy:slab,sim_capacity:1GB", "strategy:best_fit,expandable:false").unwrap();
        assert_eq!((c.device, c.pool.strategy, c.sim_capacity, c.pool.expandable), (DeviceKind::Sim, StrategyKind::BestFit, GIB, false));
        assert_eq!(c.text, "device:sim,strategy:slab,sim_capacity:1GB,strategy:best_fit,expandable:false");
        let d = AllocatorConfig::parse("", "").unwrap();
        assert_eq!(d, AllocatorConfig::default());
        assert!(
            c.makes_the_same_pools(&AllocatorConfig::parse("", "device:sim,sim_capacity:1GB,strategy:best_fit,expandable:false").unwrap())
        );
        assert!(!c.makes_the_same_pools(&d));
    }

    #[test]
    fn a_bad_allocator_configuration_names_its_source() {
        let err = AllocatorConfig::parse("strategy:fastest", "").unwrap_err().to_string();
        assert!(err.contains("VRAMPOOL_CONF `strategy:fastest`: unknown strategy"), "{err}");
        for text in
            ["device:tpu", "device:gpu", "sim_capacity:0", "colour:blue", "expandable:maybe", "limit:2x", "limit:1.5", "sim_capacity:1.5GB"]
        {
            let err = AllocatorConfig::parse("", text).unwrap_err().to_string();
            assert!(err.contains(&format!("configuration `{text}`")), "{text}: {err}");
        }
        let err = AllocatorConfig::parse("", "colour:blue").unwrap_err().to_string();
        assert!(err.contains("unknown configuration key `colour`") && err.contains("allocator keys: device, sim_capacity"), "{err}");
    }

    #[test]
    fn the_large_tier_cuts_blocks_to_a_thirty_second_of_large_min_up_to_a_page() {
        let unit = |large_min| PoolConfig { large_min, ..PoolConfig::default() }.large_unit();
        assert_eq!(unit(64 * MIB), 2 * MIB);
        assert_eq!(unit(GIB), 2 * MIB);
        assert_eq!(unit(4 * MIB), 128 * KIB);
        assert_eq!(unit(6 * MIB), 128 * KIB);
        assert_eq!(unit(KIB), 512);
        let config = PoolConfig::default();
        assert_eq!(config.block_size_for(160 * MIB + 1, 2), 162 * MIB);
        assert_eq!(config.block_size_for(160 * MIB, 2), 160 * MIB);
    }
}
