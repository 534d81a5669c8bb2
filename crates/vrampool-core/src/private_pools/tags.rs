//! Tagged regions: allocations made while a tag's region is open go to that tag's private pool,
//! whose memory can be paused and resumed on its own (`PoolCore::pause`), as
//! `torch_memory_saver`'s `region(tag)` / `pause(tag)` / `resume(tag)` do.
//!
//! A tag's pool is a best-fit pool of expandable segments whatever the resource's strategy:
//! every block then lies in a reserved address range, which keeps its addresses while its memory
//! is away. A device without virtual-memory mapping, or a pool shared with other processes
//! (whose blocks each lie in one allocation), has no tags.

use super::*;
use crate::pool::PauseReport;
use crate::strategy::StrategyKind;

/// Tagged pools' ids: `first` is this, which PyTorch's pool ids never are; `second` counts.
const TAG_POOL: u64 = u64::MAX;

/// A tag's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagInfo {
    pub name: String,
    pub paused: bool,
    /// Bytes of live blocks.
    pub allocated: u64,
    /// Bytes mapped now.
    pub reserved: u64,
    /// Bytes a pause gave back, mapped again on resume.
    pub paused_bytes: u64,
}

impl<U: MemoryResource> PrivatePools<U> {
    /// Opens `tag`'s region (its pool made on first use): allocations go to it until
    /// `end_tag(tag)`, and regions or private pools opened inside it take over until they end.
    pub fn begin_tag(&self, tag: &str) -> Result<()> {
        let mut pools = self.pools.lock();
        let id = match pools.pools.iter().find(|p| p.tag.as_deref() == Some(tag)) {
            Some(p) => p.id,
            None => {
                let pool = Pool::new(Arc::clone(&self.device), self.tag_config()?)?;
                if let Some(limit) = *self.limit.lock() {
                    pool.set_limit(Some(limit))?;
                }
                let id = PoolId { first: TAG_POOL, second: pools.pools.iter().filter(|p| p.tag.is_some()).count() as u64 };
                pools.pools.push(Private { id, pool: Arc::new(pool), released: false, tag: Some(tag.to_string()) });
                id
            }
        };
        pools.open.push(id);
        self.sync_counts(&pools);
        Ok(())
    }

    /// Closes the innermost open region of `tag`; false when none is open.
    pub fn end_tag(&self, tag: &str) -> bool {
        let id = self.pools.lock().pools.iter().find(|p| p.tag.as_deref() == Some(tag)).map(|p| p.id);
        id.is_some_and(|id| self.end(id))
    }

    /// Pauses `tag`'s memory, or every tag's with None (see `PoolCore::pause`); returns what the
    /// pauses did, added up. Untagged memory is never paused.
    pub fn pause(&self, tag: Option<&str>, backup: bool) -> Result<PauseReport> {
        let mut total = PauseReport::default();
        for (name, pool) in self.tagged(tag)? {
            let report = pool.pause(backup).map_err(|e| named(e, &name))?;
            total.released += report.released;
            total.backed_up += report.backed_up;
        }
        Ok(total)
    }

    /// Resumes `tag`'s memory, or every tag's with None (see `PoolCore::resume`); returns the
    /// bytes mapped again.
    pub fn resume(&self, tag: Option<&str>, cached: bool) -> Result<u64> {
        let mut bytes = 0;
        for (name, pool) in self.tagged(tag)? {
            bytes += pool.resume(cached).map_err(|e| named(e, &name))?;
        }
        Ok(bytes)
    }

    /// Every tag, in the order their regions were first opened.
    pub fn tags(&self) -> Vec<TagInfo> {
        self.tagged(None)
            .unwrap_or_default()
            .into_iter()
            .map(|(name, pool)| {
                let stats = pool.stats();
                TagInfo {
                    name,
                    paused: pool.is_paused(),
                    allocated: stats.allocated_bytes.current,
                    reserved: stats.reserved_bytes.current,
                    paused_bytes: stats.paused_bytes,
                }
            })
            .collect()
    }

    /// `tag`'s pool, or every tagged pool for None; an error naming a tag no region had.
    fn tagged(&self, tag: Option<&str>) -> Result<Vec<(String, Arc<Pool>)>> {
        let pools = self.pools.lock();
        let all = pools.pools.iter().filter_map(|p| Some((p.tag.clone()?, Arc::clone(&p.pool))));
        let chosen: Vec<_> = all.filter(|(name, _)| tag.is_none_or(|t| t == name)).collect();
        match (tag, chosen.is_empty()) {
            (Some(tag), true) => Err(PoolError::CannotPause(format!("no region was ever opened with tag {tag:?}"))),
            _ => Ok(chosen),
        }
    }

    /// The configuration of a tag's pool: the resource's, with expandable best-fit segments.
    fn tag_config(&self) -> Result<PoolConfig> {
        if self.config.ipc {
            return Err(PoolError::CannotPause(
                "a pool shared with other processes keeps each block in one allocation that importers map whole; \
                 tagged regions, which pause memory, need a pool made without ipc"
                    .into(),
            ));
        }
        if self.device.vm_granularity().is_none() {
            return Err(PoolError::CannotPause(
                "the device cannot map virtual memory (cuMemCreate/cuMemMap), so memory cannot leave while its \
                 addresses stay: tagged regions need it"
                    .into(),
            ));
        }
        Ok(PoolConfig { strategy: StrategyKind::BestFit, expandable: true, ..self.config.clone() })
    }
}

/// `error`, naming the tag it is about.
fn named(error: PoolError, tag: &str) -> PoolError {
    match error {
        PoolError::Paused(why) => PoolError::Paused(format!("tag {tag:?}: {why}")),
        PoolError::CannotPause(why) => PoolError::CannotPause(format!("tag {tag:?}: {why}")),
        other => other,
    }
}
