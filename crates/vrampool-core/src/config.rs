//! Pool configuration, and its text form (`VRAMPOOL_CONF`, in the spirit of
//! `PYTORCH_CUDA_ALLOC_CONF`): `strategy:hybrid,limit:0.9,small_max:1MB`.

use crate::error::PoolError;
use crate::sizes::{round_up, size_class_of, GIB, KIB, MIB, MIN_BLOCK};
use crate::strategy::StrategyKind;

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
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().replace('-', "_").as_str() {
            "off" | "none" | "false" | "0" => Some(Self::Off),
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
    /// Zero-fill blocks on free or on allocation (off by default).
    pub scrub: Scrub,
    /// Record each live block's allocation time, for the ages in leak reports (`live_blocks`).
    /// Off by default, so the fast path reads no clock.
    pub track_leaks: bool,
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
            scrub: Scrub::Off,
            track_leaks: false,
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

    /// The smallest block of the hybrid's large tier, which cuts its blocks to the request in these
    /// units (a trimmed buddy): a thirty-second of `large_min` (so the rounding costs at most 3%),
    /// between 512 B and 2 MiB (the usual device page).
    pub fn large_unit(&self) -> u64 {
        let floor = 63 - self.large_min.leading_zeros();
        1 << floor.saturating_sub(5).clamp(MIN_BLOCK.trailing_zeros(), (2 * MIB).trailing_zeros())
    }
}

impl PoolConfig {
    /// The keys `apply_text` takes.
    pub const KEYS: [&'static str; 12] = [
        "strategy",
        "small_max",
        "large_min",
        "alignment",
        "round_up_divisions",
        "limit",
        "record_events",
        "expandable",
        "expandable_segments",
        "scrub",
        "track_leaks",
        "reclaim",
    ];

    pub fn validate(&self) -> Result<(), PoolError> {
        let bad = |msg: String| Err(PoolError::InvalidConfig(msg));
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

    /// Applies `key:value` pairs separated by commas over this configuration. Keys: `strategy`,
    /// `small_max`, `large_min`, `alignment`, `round_up_divisions`, `limit` (bytes with an optional
    /// unit, or a fraction <= 1), `record_events`, `expandable` (or `expandable_segments`),
    /// `scrub` (`off`, `on_free`, `on_alloc`), `track_leaks`, `reclaim`.
    /// Unknown keys are errors, so typos don't pass silently; keys other layers own (e.g.
    /// `device`) are returned for them.
    pub fn apply_text(&mut self, text: &str) -> Result<Vec<(String, String)>, PoolError> {
        let mut others = Vec::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once(':')
                .or_else(|| pair.split_once('='))
                .ok_or_else(|| PoolError::InvalidConfig(format!("`{pair}` is not key:value")))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "strategy" => {
                    self.strategy = StrategyKind::parse(value).ok_or_else(|| {
                        PoolError::InvalidConfig(format!("unknown strategy `{value}` (slab, best_fit, buddy, hybrid)"))
                    })?
                }
                "small_max" => self.small_max = parse_bytes(value)?,
                "large_min" => self.large_min = parse_bytes(value)?,
                "alignment" => self.alignment = parse_bytes(value)?,
                "round_up_divisions" => {
                    self.round_up_divisions = value
                        .parse()
                        .map_err(|_| PoolError::InvalidConfig(format!("round_up_divisions: `{value}` is not a number")))?
                }
                "limit" => self.limit = Some(parse_limit(value)?),
                "record_events" => self.record_events = parse_bool(value)?,
                "expandable" | "expandable_segments" => self.expandable = parse_bool(value)?,
                "scrub" => {
                    self.scrub = Scrub::parse(value)
                        .ok_or_else(|| PoolError::InvalidConfig(format!("unknown scrub mode `{value}` (off, on_free, on_alloc)")))?
                }
                "track_leaks" => self.track_leaks = parse_bool(value)?,
                "reclaim" => self.reclaim = parse_bool(value)?,
                _ => others.push((key.to_string(), value.to_string())),
            }
        }
        self.validate()?;
        Ok(others)
    }
}

/// `1024`, `64KB`, `1.5MiB`, `2GB` (units are binary, as PyTorch's are).
pub fn parse_bytes(text: &str) -> Result<u64, PoolError> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => 1024 * GIB,
        other => return Err(PoolError::InvalidConfig(format!("unknown size unit `{other}` in `{text}`"))),
    };
    let value: f64 = number.trim().parse().map_err(|_| PoolError::InvalidConfig(format!("`{text}` is not a size")))?;
    let bytes = value * scale as f64;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
        return Err(PoolError::InvalidConfig(format!("size `{text}` is out of range")));
    }
    Ok(bytes as u64)
}

/// A fraction of the device (`0.9`) or a size (`40GB`).
pub fn parse_limit(text: &str) -> Result<Limit, PoolError> {
    match text.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(Limit::Fraction(f)),
        _ => parse_bytes(text).map(Limit::Bytes),
    }
}

fn parse_bool(text: &str) -> Result<bool, PoolError> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(PoolError::InvalidConfig(format!("`{text}` is not a boolean"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_sets_every_key_and_passes_on_others() {
        let mut config = PoolConfig::default();
        let others = config
            .apply_text("strategy:best-fit, small_max:256KB,large_min=128MiB,alignment:4096,limit:0.5,record_events:on,device:sim,expandable:false")
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
        assert_eq!(others, vec![("device".to_string(), "sim".to_string())]);
        assert_eq!(config.scrub, Scrub::Off, "scrubbing is off by default");
        assert!(!config.track_leaks, "leak tracking is off by default");
        config.apply_text("scrub:on_free,track_leaks:true").unwrap();
        assert_eq!(config.scrub, Scrub::OnFree);
        assert!(config.track_leaks);
        config.apply_text("scrub:on-alloc").unwrap();
        assert_eq!(config.scrub, Scrub::OnAlloc);
        config.apply_text("scrub:off").unwrap();
        assert_eq!(config.scrub, Scrub::Off);
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

    #[test]
    fn bad_text_is_a_clear_error() {
        for text in ["expandable:maybe", "strategy:fastest", "small_max:lots", "limit:-3", "alignment:1000", "small_max", "limit:1.5x", "scrub:sometimes", "track_leaks:maybe"] {
            let err = PoolConfig::default().apply_text(text).unwrap_err();
            assert!(matches!(err, PoolError::InvalidConfig(_)), "{text}: {err}");
        }
        assert_eq!(parse_limit("40GB").unwrap(), Limit::Bytes(40 * GIB));
        assert_eq!(parse_bytes("1.5MiB").unwrap(), 3 * MIB / 2);
    }
}
