//! The rows of a replay (`vrampool replay --strategy`), by name, with their options.
//!
//! `default` is the pool as `vrampool.torch.install()` sets it up; a strategy's name (`slab`,
//! `best_fit`, `buddy`, `hybrid`) is the pool with that strategy and plain segments, and with
//! `+vm` grows by mapping virtual memory; an allocator model's name (`torch`, ...) is that
//! model. A row's name says what it runs, so its options may not change that: `strategy:slab`
//! for the row `best_fit`, or `expandable_segments:True` for the row `torch`, is an error rather
//! than a slab (or expandable) replay under the other name. `ahead` is the `default` pool served
//! by a plan made ahead from one step (`vrampool_steady::AheadPlan`).

use std::sync::Arc;

use crate::peers::{PeerConfig, PEER_NAMES};
use vrampool_core::config::PoolConfig;
use vrampool_core::error::PoolError;
use vrampool_core::strategy::StrategyKind;
use vrampool_steady::AheadPlan;

/// The suffix of a pool row that grows by mapping virtual memory.
pub const VM_SUFFIX: &str = "+vm";
/// The pool row configured as the pool is by default.
pub const DEFAULT_ROW: &str = "default";
/// The `default` pool served by a plan made ahead.
pub const AHEAD_ROW: &str = "ahead";

/// What a replay runs: the pool with a configuration, a model of another allocator, or the pool
/// with the steady option served by a plan made ahead (`ahead`: see [`ahead_target`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayTarget {
    Pool(PoolConfig),
    Peer(PeerConfig),
    Ahead(PoolConfig, Arc<AheadPlan>),
}

impl ReplayTarget {
    /// The pool's strategy name, the model's name, or `ahead`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pool(config) => config.strategy.name(),
            Self::Peer(peer) => peer.name(),
            Self::Ahead(..) => AHEAD_ROW,
        }
    }
}

/// The pool row `row`'s configuration text: what its name sets, then `conf`. An error for a
/// name that is no pool row, for bad options, and for options that change what the name sets.
pub fn pool_row_conf(row: &str, conf: &str) -> Result<String, PoolError> {
    if row == DEFAULT_ROW {
        PoolConfig::default().apply_text(conf)?;
        return Ok(conf.to_string());
    }
    let strategy = row.strip_suffix(VM_SUFFIX).unwrap_or(row);
    if StrategyKind::parse(strategy).is_none_or(|kind| kind.name() != strategy) {
        return Err(PoolError::InvalidConfig(format!(
            "`{row}` is no pool row (default, or a strategy: slab, best_fit, buddy, hybrid, each with {VM_SUFFIX} or not)"
        )));
    }
    // A strategy's row is the pool alone: no planned steps over it.
    let named = format!("strategy:{strategy},expandable:{},steady:false", row.ends_with(VM_SUFFIX));
    let mut by_name = PoolConfig::default();
    by_name.apply_text(&named)?;
    let text = if conf.trim().is_empty() { named } else { format!("{named},{conf}") };
    let mut config = PoolConfig::default();
    config.apply_text(&text)?;
    if (config.strategy, config.expandable) != (by_name.strategy, by_name.expandable) {
        let ran = format!("{}{}", config.strategy.name(), if config.expandable { VM_SUFFIX } else { "" });
        return Err(PoolError::InvalidConfig(format!(
            "the row `{row}` is named for its strategy and growth; `{conf}` would run it as {ran}: name that row instead (--strategy {ran})"
        )));
    }
    Ok(text)
}

/// The `ahead` row with `conf` (pool options): the `default` pool served by `plan`, set when
/// `vrampool.torch.install(plan=)` would set it (see [`crate::replay::replay_prepared`]).
pub fn ahead_target(conf: &str, plan: Arc<AheadPlan>) -> Result<ReplayTarget, PoolError> {
    let mut config = PoolConfig::default();
    config.apply_text(conf)?;
    if !config.steady {
        return Err(PoolError::InvalidConfig(format!(
            "the row `{AHEAD_ROW}` serves its plan from the steady arena; `{conf}` would turn that off"
        )));
    }
    Ok(ReplayTarget::Ahead(config, plan))
}

/// What the row `row` replays, with `conf` (its share of `--conf`) applied.
pub fn row_target(row: &str, conf: &str) -> Result<ReplayTarget, PoolError> {
    if !PEER_NAMES.contains(&row) {
        let mut config = PoolConfig::default();
        config.apply_text(&pool_row_conf(row, conf)?)?;
        return Ok(ReplayTarget::Pool(config));
    }
    let peer = PeerConfig::parse(row, conf)?;
    if peer.name() != row {
        return Err(PoolError::InvalidConfig(format!(
            "the row `{row}` is the model its name says; `{conf}` would run it as {}: name that row instead (--strategy {})",
            peer.name(),
            peer.name()
        )));
    }
    Ok(ReplayTarget::Peer(peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(row: &str, conf: &str) -> PoolConfig {
        match row_target(row, conf).unwrap() {
            ReplayTarget::Pool(config) => config,
            other => panic!("{row}: {other:?}"),
        }
    }

    #[test]
    fn a_row_runs_what_its_name_says() {
        assert_eq!(pool("default", ""), PoolConfig::default());
        let slab = pool("slab", "small_max:64KB");
        assert_eq!((slab.strategy, slab.expandable, slab.small_max), (StrategyKind::Slab, false, 64 << 10));
        let vm = pool("best_fit+vm", "");
        assert_eq!((vm.strategy, vm.expandable), (StrategyKind::BestFit, true));
        assert_eq!(pool("default", "strategy:slab").strategy, StrategyKind::Slab, "the default row takes any pool option");
        assert_eq!(pool("hybrid", "strategy:hybrid").strategy, StrategyKind::Hybrid, "restating the name is no change");
        assert_eq!(row_target("torch", "max_split_size_mb:256").unwrap().name(), "torch");
        assert_eq!(row_target("torch+expandable", "").unwrap().name(), "torch+expandable");
        assert_eq!(pool_row_conf("buddy+vm", "").unwrap(), "strategy:buddy,expandable:true,steady:false");
        assert!(pool("default", "").steady && !pool("hybrid+vm", "").steady, "a strategy's row is the pool alone");
    }

    #[test]
    fn options_that_change_what_a_row_runs_are_refused() {
        for row in ["best_fit", "buddy", "hybrid", "buddy+vm"] {
            let err = row_target(row, "strategy:slab").unwrap_err().to_string();
            assert!(err.contains(&format!("the row `{row}` is named for its strategy")) && err.contains("--strategy slab"), "{row}: {err}");
        }
        for (row, conf) in [("best_fit", "expandable:true"), ("best_fit", "expandable_segments:true"), ("best_fit+vm", "expandable:false")]
        {
            assert!(row_target(row, conf).is_err(), "{row} {conf}");
        }
        let err = row_target("torch", "expandable_segments:True").unwrap_err().to_string();
        assert!(err.contains("as torch+expandable"), "{err}");
        assert!(row_target("torch+expandable", "expandable_segments:False").is_err());
    }

    #[test]
    fn unknown_rows_and_bad_options_are_errors() {
        for row in ["first_fit", "best-fit", "HYBRID", "torch+vm", "plan", ""] {
            assert!(row_target(row, "").is_err(), "{row}");
        }
        assert!(row_target("slab", "alignment:4096.9").is_err());
        assert!(row_target("default", "limit:1.5").is_err());
        assert!(row_target("default", "device:sim").is_err(), "a replay has no device to choose");
    }

    #[test]
    fn the_ahead_row_is_the_default_pool_with_a_plan_of_its_step() {
        let s0 = vrampool_core::StreamId(0);
        let step = [vrampool_steady::AheadBuffer::new(s0, 4096, 0, 2), vrampool_steady::AheadBuffer::new(s0, 4096, 1, 3)];
        let plan = Arc::new(AheadPlan::plan(&step, 512, std::time::Duration::from_millis(10)).unwrap());
        let Ok(ReplayTarget::Ahead(config, planned)) = ahead_target("small_max:64KB", plan.clone()) else { panic!("an ahead row") };
        assert_eq!((config.small_max, config.steady, planned.arena_bytes()), (64 << 10, true, 8192));
        assert_eq!(ahead_target("", plan.clone()).unwrap().name(), AHEAD_ROW);
        let err = ahead_target("steady:false", plan.clone()).unwrap_err().to_string();
        assert!(err.contains("would turn that off"), "{err}");
        assert!(ahead_target("limit:1.5", plan).is_err());
        assert!(row_target(AHEAD_ROW, "").is_err(), "the row needs its step");
    }
}
