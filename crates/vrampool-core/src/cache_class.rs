//! Which size class a freed block is cached under, and the table that lets the fastest path
//! find a request's class with one load.

use crate::arena::Arena;
use crate::config::{PoolConfig, Scrub};
use crate::sizes::{class_size, classes_up_to, MIN_BLOCK};

/// The number of classes thread caches hold: the first tier's, up to `small_max` and to what that
/// tier caches at all (`PoolConfig::first_tier_cached_max`).
pub fn thread_classes(config: &PoolConfig) -> usize {
    classes_up_to(config.small_max.min(config.first_tier_cached_max()))
}

/// The class a block of `size` bytes from `tier` is cached under, if any: its size must be
/// exactly a class, and one that this tier hands out (a class just above `small_max` is the slab's
/// for some requests and best-fit's for others; only best-fit's blocks are cached). The first
/// tier's blocks above `PoolConfig::first_tier_cached_max` are cached only when their strategy
/// would place the next request of their size there anyway (`Strategy::placed_next`).
#[inline(always)]
pub fn cache_class(config: &PoolConfig, arena: &Arena, thread_classes: usize, size: u64, tier: u8) -> Option<usize> {
    let index = arena.magazines.class_of_block(size)?;
    // The thread-cache classes are at most `small_max`: the first tier's in every strategy.
    let ours = if index < thread_classes { tier == 0 } else { config.tier_of(size) == tier };
    ours.then_some(index)
}

/// The class `index` as `LiveBlock::class` keeps it (all cached classes fit: at most 80 are).
pub fn class_tag(index: usize) -> u8 {
    u8::try_from(index + 1).expect("fewer than 255 cached classes")
}

/// Per 512-byte granule of request size (the sizes `g * 512 + 1 ..= (g + 1) * 512`): the class
/// of the thread-cached blocks that serve them, or `NONE` when those are not thread-cached. One
/// lookup then does what `round_request`, `tier_of`, `block_size_for` and `cache_class` do for
/// them (the alignment is a multiple of 512, so every size in a granule pads alike).
///
/// Empty when an option needs every call on the general path: scrubbing, the event log and leak
/// tracking.
pub fn thread_class_table(config: &PoolConfig, arena: &Arena, thread_classes: usize) -> Box<[ThreadClass]> {
    if config.scrub != Scrub::Off || config.record_events || config.track_leaks || thread_classes == 0 {
        return Box::new([]);
    }
    let granules = class_size(thread_classes - 1) / MIN_BLOCK;
    (1..=granules)
        .map(|g| {
            let Some(rounded) = config.padded(g * MIN_BLOCK) else { return ThreadClass::NONE };
            let tier = config.tier_of(rounded);
            cache_class(config, arena, thread_classes, config.block_size_for(rounded, tier), tier)
                .filter(|&index| index < thread_classes)
                .map_or(ThreadClass::NONE, ThreadClass::new)
        })
        .collect()
}

/// A thread-cache class and its block size in one word, for one load on the fastest path: the
/// class index + 1 in the low byte (0 for none), the size in 512-byte units above.
#[derive(Clone, Copy)]
pub struct ThreadClass(u32);

impl ThreadClass {
    const NONE: Self = Self(0);

    /// Class `index` (a thread-cache class, so at most 64 MiB: its size in units always fits).
    fn new(index: usize) -> Self {
        let units = u32::try_from(class_size(index) / MIN_BLOCK).expect("a thread-cache class is at most 64 MiB");
        debug_assert!(units < 1 << 24);
        Self(u32::from(class_tag(index)) | units << 8)
    }

    #[inline(always)]
    pub fn index(self) -> Option<usize> {
        usize::from(self.tag()).checked_sub(1)
    }

    /// The class as `LiveBlock::class` keeps it.
    #[inline(always)]
    pub fn tag(self) -> u8 {
        self.0 as u8
    }

    #[inline(always)]
    pub fn size(self) -> u64 {
        u64::from(self.0 >> 8) * MIN_BLOCK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::StreamId;
    use crate::sizes::{KIB, MIB};
    use crate::strategy::StrategyKind;

    /// The table stands for `padded`, `tier_of`, `block_size_for` and `cache_class` on every
    /// request size it covers, in every strategy and with alignment and padding.
    #[test]
    fn the_table_agrees_with_the_general_path_for_every_request_size() {
        let configs = [
            PoolConfig::default(),
            PoolConfig { strategy: StrategyKind::Slab, ..PoolConfig::default() },
            PoolConfig { strategy: StrategyKind::BestFit, ..PoolConfig::default() },
            PoolConfig { strategy: StrategyKind::Buddy, ..PoolConfig::default() },
            PoolConfig { alignment: 4096, round_up_divisions: 4, ..PoolConfig::default() },
            PoolConfig {
                strategy: StrategyKind::BestFit,
                alignment: 2048,
                round_up_divisions: 2,
                small_max: 64 * KIB,
                ..PoolConfig::default()
            },
        ];
        for config in configs {
            let arena = crate::arena::Arena::for_config(&config, StreamId(0));
            let thread_classes = thread_classes(&config);
            let table = thread_class_table(&config, &arena, thread_classes);
            assert_eq!(table.len() as u64, class_size(thread_classes - 1) / MIN_BLOCK, "{config:?}");
            let mut cached = 0;
            for size in 1..=table.len() as u64 * MIN_BLOCK {
                let rounded = config.padded(size).unwrap();
                let tier = config.tier_of(rounded);
                let block = config.block_size_for(rounded, tier);
                let expected = cache_class(&config, &arena, thread_classes, block, tier).filter(|&i| i < thread_classes);
                let entry = table[((size - 1) / MIN_BLOCK) as usize];
                assert_eq!(entry.index(), expected, "{config:?}, {size} B");
                if expected.is_some() {
                    assert_eq!(entry.size(), block, "{config:?}, {size} B");
                    cached += 1;
                }
            }
            assert!(cached > 0, "{config:?}: some sizes take the fastest path");
        }
    }

    #[test]
    fn a_slab_keeps_its_runs_out_of_the_thread_caches() {
        for (strategy, runs_in_thread_caches) in
            [(StrategyKind::Hybrid, false), (StrategyKind::Slab, false), (StrategyKind::BestFit, true), (StrategyKind::Buddy, true)]
        {
            let config = PoolConfig { strategy, ..PoolConfig::default() };
            let arena = crate::arena::Arena::for_config(&config, StreamId(0));
            let classes = thread_classes(&config);
            let class = |size| cache_class(&config, &arena, classes, size, 0);
            assert!(class(32 * KIB).is_some_and(|i| i < classes), "{strategy:?}");
            // A run has its class (a kept run is taken by it), but no thread cache holds it.
            for run in [40 * KIB, MIB] {
                assert_eq!(class(run).map(|i| i < classes), Some(runs_in_thread_caches), "{strategy:?}: {run}");
            }
            assert_eq!(config.first_tier_cached_max() < MIB, !runs_in_thread_caches, "{strategy:?}");
            let largest = if runs_in_thread_caches { MIB } else { 32 * KIB };
            assert_eq!(class_size(classes - 1), largest, "{strategy:?}: the thread caches' classes");
        }
        // The hybrid's other tiers cache as before.
        let config = PoolConfig::default();
        let arena = crate::arena::Arena::for_config(&config, StreamId(0));
        assert!(cache_class(&config, &arena, thread_classes(&config), 4 * MIB, 1).is_some());
    }

    #[test]
    fn options_that_watch_every_call_turn_the_table_off() {
        let configs = [
            PoolConfig { scrub: Scrub::OnFree, ..PoolConfig::default() },
            PoolConfig { scrub: Scrub::OnAlloc, ..PoolConfig::default() },
            PoolConfig { record_events: true, ..PoolConfig::default() },
            PoolConfig { track_leaks: true, ..PoolConfig::default() },
        ];
        for config in configs {
            let arena = crate::arena::Arena::for_config(&config, StreamId(0));
            assert!(thread_class_table(&config, &arena, thread_classes(&config)).is_empty(), "{config:?}");
        }
    }
}
