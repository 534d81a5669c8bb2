//! PyTorch's CUDACachingAllocator, plain and with expandable segments, and (approximately) the
//! driver's stream-ordered pool behind `cudaMallocAsync`, which behaves like one expandable
//! segment per stream with the driver's pages.
//!
//! The rules are those of `c10/cuda/CUDACachingAllocator.cpp` and `c10/core/AllocatorConfig.cpp`
//! in pytorch/pytorch at commit 001074d2 (the PyTorch 2.x allocator; the same rules hold from 2.1
//! on). Each rule below names the function it comes from.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use foldhash::fast::FixedState;

use super::blocks::{BlockList, State, NIL};
use super::held::{BlockModel, Held};
use super::mappings::Mappings;
use super::{parse_flag, parse_mb, parse_size, parse_u64};
use vrampool_core::device::Device;
use vrampool_core::error::PoolError;
use vrampool_core::sizes::MIB;

/// `size` rounded up to a multiple of `unit` (any unit: PyTorch's pages are 20 MiB); None on overflow.
fn round_up(size: u64, unit: u64) -> Option<u64> {
    size.checked_next_multiple_of(unit)
}

/// `kMinBlockSize`: every size is rounded up to a multiple of 512 B.
const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: the largest request of the small pool.
const SMALL_SIZE: u64 = MIB;
/// `kSmallBuffer`: small requests are packed into 2 MiB segments (and 2 MiB expandable pages).
const SMALL_BUFFER: u64 = 2 * MIB;
/// `kLargeBuffer`: requests between 1 and 10 MiB share 20 MiB segments; expandable segments of
/// the large pool map 20 MiB pages.
const LARGE_BUFFER: u64 = 20 * MIB;
/// `kMinLargeAlloc`: from 10 MiB on, a request gets a segment of its own size...
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// `kRoundLarge`: ...rounded up to 2 MiB.
const ROUND_LARGE: u64 = 2 * MIB;
/// `roundup_power2_divisions` has one setting per power of two from 1 MiB to 64 GiB.
const DIVISION_INTERVALS: usize = 16;
/// The driver maps a stream-ordered pool's memory in pages of its allocation granularity.
const DRIVER_PAGE: u64 = 2 * MIB;

/// `PYTORCH_CUDA_ALLOC_CONF` options of the native allocator (`AllocatorConfig::parseArgs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TorchOptions {
    pub expandable: bool,
    /// Blocks this large or larger are never split (`max_split_size_mb`; unlimited by default).
    pub max_split_size: u64,
    /// How much larger than an oversize request a cached block may be and still serve it
    /// (`max_non_split_rounding_mb`; 20 MiB by default).
    pub max_non_split_rounding: u64,
    /// Divisions per power of two for each interval from 1 MiB (`roundup_power2_divisions`; 0 is off).
    pub roundup_power2_divisions: [u64; DIVISION_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are reclaimed oldest first
    /// (`garbage_collection_threshold`; 0 is off). PyTorch applies it only under a memory fraction:
    /// the model applies it when the replay's device has a capacity, that capacity being the
    /// fraction's memory.
    pub garbage_collection_threshold: f64,
}

impl Default for TorchOptions {
    fn default() -> Self {
        Self {
            expandable: false,
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; DIVISION_INTERVALS],
            garbage_collection_threshold: 0.0,
        }
    }
}

impl TorchOptions {
    pub const KEYS: [&'static str; 5] = [
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "roundup_power2_divisions",
        "garbage_collection_threshold",
        "expandable_segments",
    ];

    /// None for an unknown key; limits as `AllocatorConfig::parse*` checks them.
    pub(super) fn apply(&mut self, key: &str, value: &str) -> Option<Result<(), String>> {
        let least = LARGE_BUFFER / MIB;
        Some(match key {
            "max_split_size_mb" => parse_mb(value, least).map(|v| self.max_split_size = v),
            "max_non_split_rounding_mb" => parse_mb(value, least).map(|v| self.max_non_split_rounding = v),
            "roundup_power2_divisions" => parse_divisions(value).map(|v| self.roundup_power2_divisions = v),
            "garbage_collection_threshold" => match value.parse::<f64>() {
                Ok(t) if t > 0.0 && t < 1.0 => {
                    self.garbage_collection_threshold = t;
                    Ok(())
                }
                _ => Err(format!("`{value}` must lie in (0.0, 1.0)")),
            },
            "expandable_segments" => parse_flag(value).map(|v| self.expandable = v),
            _ => return None,
        })
    }
}

/// `AllocatorConfig::parseRoundUpPower2Divisions`: one power of two for every interval, or
/// `[size_mb:divisions,...,>:divisions]`, where the first entry also covers the sizes below it and
/// `>` the intervals after the last one named.
fn parse_divisions(value: &str) -> Result<[u64; DIVISION_INTERVALS], String> {
    let check = |d: u64| if d == 0 || d.is_power_of_two() { Ok(d) } else { Err(format!("divisions must be a power of two or 0, got {d}")) };
    let mut out = [0; DIVISION_INTERVALS];
    let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        let d = parse_u64(value)?;
        if !d.is_power_of_two() {
            return Err(format!("divisions must be a power of two, got {d}"));
        }
        return Ok([d; DIVISION_INTERVALS]);
    };
    let (mut first, mut last_index) = (true, 0usize);
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (interval, divisions) = entry.split_once(':').ok_or_else(|| format!("`{entry}` is not size:divisions"))?;
        let divisions = check(parse_u64(divisions.trim())?)?;
        if interval.trim() == ">" {
            out[last_index..].fill(divisions);
            continue;
        }
        let mb = parse_u64(interval.trim())?;
        if !mb.is_power_of_two() {
            return Err(format!("intervals must be powers of two, got {mb}"));
        }
        let index = (mb.trailing_zeros() as usize).min(DIVISION_INTERVALS - 1);
        if first {
            out[..index].fill(divisions);
            first = false;
        }
        out[index] = divisions;
        last_index = index;
    }
    Ok(out)
}

/// Options of the driver's pool (`cudaMemPoolAttrReleaseThreshold`).
#[derive(Debug, Clone, PartialEq)]
pub struct AsyncOptions {
    /// Memory the pool keeps cached before it gives pages back; PyTorch's `cudaMallocAsync`
    /// backend sets it to the maximum (`CUDAMallocAsyncAllocator.cpp`), which is the default here.
    pub release_threshold: u64,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        Self { release_threshold: u64::MAX }
    }
}

impl AsyncOptions {
    pub const KEYS: [&'static str; 1] = ["release_threshold"];

    pub(super) fn apply(&mut self, key: &str, value: &str) -> Option<Result<(), String>> {
        (key == "release_threshold").then(|| parse_size(value).map(|v| self.release_threshold = v))
    }
}

/// The rules a caching model follows: PyTorch's, or the driver pool's.
#[derive(Debug, Clone)]
struct Rules {
    torch: TorchOptions,
    /// Requests up to 1 MiB go to a pool of their own (PyTorch); the driver has one pool.
    small_pool: bool,
    /// Expandable pages of the small and the large pool.
    pages: (u64, u64),
    /// Gives pages back after a free while more than this is reserved (the driver's threshold).
    release_threshold: u64,
}

/// A free list: one per stream and pool (`BlockPool` keyed by stream, `get_pool`).
#[derive(Debug, Clone, Copy)]
struct PoolInfo {
    small: bool,
}

pub(super) struct Caching {
    rules: Rules,
    held: Held,
    pools: HashMap<(u64, bool), u32, FixedState>,
    pool_info: Vec<PoolInfo>,
    /// Expandable segments: base -> (reserved size, pool).
    expandable: BTreeMap<u64, (u64, u32)>,
    /// What is mapped inside them.
    mappings: Mappings,
    /// `get_free_blocks_call_count` of the small and the large pool (garbage collection's clock).
    free_block_calls: [u64; 2],
    /// The memory garbage collection counts against (`allowed_memory_maximum`), when on.
    gc_limit: Option<u64>,
    /// Address space of one expandable segment: the device's memory and an eighth
    /// (`ExpandableSegment`'s constructor).
    reservation: u64,
}

impl Caching {
    pub fn torch(options: TorchOptions, device: Arc<dyn Device>, capacity: Option<u64>) -> Self {
        let rules = Rules { torch: options, small_pool: true, pages: (SMALL_BUFFER, LARGE_BUFFER), release_threshold: u64::MAX };
        Self::new(rules, device, capacity)
    }

    /// The driver's pool, approximately: one expandable segment per stream, mapped in 2 MiB pages,
    /// best fit with any remainder split off, pages given back above the release threshold and,
    /// on out of memory, all of them (`cudaMemPoolTrimTo(0)`, as PyTorch's backend retries).
    pub fn driver_async(options: AsyncOptions, device: Arc<dyn Device>, capacity: Option<u64>) -> Self {
        let torch = TorchOptions { expandable: true, ..TorchOptions::default() };
        let rules = Rules { torch, small_pool: false, pages: (DRIVER_PAGE, DRIVER_PAGE), release_threshold: options.release_threshold };
        Self::new(rules, device, capacity)
    }

    fn new(rules: Rules, device: Arc<dyn Device>, capacity: Option<u64>) -> Self {
        let total = device.mem_info().map(|m| m.total).unwrap_or(u64::MAX / 4);
        let gc_limit = (rules.torch.garbage_collection_threshold > 0.0).then_some(capacity).flatten();
        let page = rules.pages.1.max(rules.pages.0);
        let reservation = round_up(total.saturating_add(total / 8), page).unwrap_or(total);
        Self {
            rules,
            held: Held::new(device),
            pools: HashMap::default(),
            pool_info: Vec::new(),
            expandable: BTreeMap::new(),
            mappings: Mappings::default(),
            free_block_calls: [0; 2],
            gc_limit,
            reservation,
        }
    }

    fn options(&self) -> &TorchOptions {
        &self.rules.torch
    }

    fn pool(&mut self, stream: u64, small: bool) -> u32 {
        let next = self.pool_info.len() as u32;
        let id = *self.pools.entry((stream, small)).or_insert(next);
        if id == next {
            self.pool_info.push(PoolInfo { small });
        }
        id
    }

    fn is_small(&self, pool: u32) -> bool {
        self.pool_info[pool as usize].small
    }

    fn page(&self, pool: u32) -> u64 {
        if self.is_small(pool) {
            self.rules.pages.0
        } else {
            self.rules.pages.1
        }
    }

    /// `round_size`: 512 B multiples, or the next of `divisions` steps per power of two when the
    /// request's interval has divisions and the request exceeds 512 B times them.
    fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let log = 63 - size.leading_zeros() as usize;
        let index = log.saturating_sub(20).min(DIVISION_INTERVALS - 1);
        let divisions = self.options().roundup_power2_divisions[index];
        if divisions > 1 && size > MIN_BLOCK * divisions {
            return roundup_power2_next_division(size, divisions);
        }
        round_up(size, MIN_BLOCK).unwrap_or(u64::MAX)
    }

    /// `get_allocation_size`: the segment a request that finds no cached block asks for.
    fn allocation_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            round_up(size, ROUND_LARGE).unwrap_or(u64::MAX)
        }
    }

    fn gc_clock(&self, pool: u32) -> u64 {
        self.free_block_calls[usize::from(!self.is_small(pool))]
    }

    /// The bytes a free block could grow to in place: itself and an unmapped block after it.
    fn expandable_size(&self, n: u32) -> u64 {
        let node = self.held.blocks.node(n);
        let next = (node.next != NIL).then(|| self.held.blocks.node(node.next)).filter(|b| b.state == State::Unmapped);
        node.size + next.map_or(0, |b| b.size)
    }

    /// `get_free_block`: the best fit of the stream's pool (size, then address). With expandable
    /// segments, a block that could grow into unmapped space counts that space, so the walk
    /// moves on to blocks that would leave less of it behind. Oversize blocks (at least
    /// `max_split_size`) serve only oversize requests, and only within `max_non_split_rounding`.
    fn get_free_block(&mut self, pool: u32, size: u64) -> Option<u32> {
        if self.gc_limit.is_some() {
            self.free_block_calls[usize::from(!self.is_small(pool))] += 1;
        }
        let mut fitting = self.held.blocks.fitting(pool, size);
        let mut found = fitting.next()?;
        if self.options().expandable {
            for next in fitting {
                if self.expandable_size(next) < self.expandable_size(found) {
                    found = next;
                } else {
                    break;
                }
            }
        }
        let (block, max_split) = (self.held.blocks.node(found).size, self.options().max_split_size);
        if size < max_split && block >= max_split {
            return None;
        }
        if size >= max_split && block >= size.saturating_add(self.options().max_non_split_rounding) {
            return None;
        }
        Some(found)
    }

    /// `should_split`: the small pool and expandable segments split off any remainder of at
    /// least 512 B; the large pool only a remainder above 1 MiB of a block below `max_split_size`.
    fn should_split(&self, pool: u32, block: u64, size: u64) -> bool {
        let remaining = block - size;
        if self.is_small(pool) || self.options().expandable {
            remaining >= MIN_BLOCK
        } else {
            size < self.options().max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `alloc_block`: a new segment of `alloc_size` bytes, or expandable pages for `size`; None
    /// when the device (or the garbage collector's memory fraction) has no room.
    fn alloc_block(&mut self, pool: u32, size: u64, alloc_size: u64) -> Option<u32> {
        if self.gc_limit.is_some_and(|limit| self.held.figures.reserved.saturating_add(alloc_size) > limit) {
            return None;
        }
        if self.options().expandable {
            return self.allocate_expandable(pool, size);
        }
        let n = self.held.new_segment(pool, alloc_size)?;
        self.held.blocks.set_aux(n, self.gc_clock(pool));
        Some(n)
    }

    /// `try_allocate_expandable_block`: the lowest address where free and unmapped blocks in a row
    /// hold `size` bytes (a new segment if none), mapped as far as needed.
    fn allocate_expandable(&mut self, pool: u32, size: u64) -> Option<u32> {
        let mut candidate = self.find_expandable_block(pool, size)?;
        if self.held.blocks.node(candidate).state == State::Unmapped {
            let wanted = self.held.blocks.node(candidate).size.min(size);
            candidate = self.map_block(candidate, wanted)?;
        }
        while self.held.blocks.node(candidate).size < size {
            let remaining = size - self.held.blocks.node(candidate).size;
            let next = self.held.blocks.node(candidate).next;
            let wanted = self.held.blocks.node(next).size.min(remaining);
            candidate = self.map_block(next, wanted)?;
        }
        Some(candidate)
    }

    /// `find_expandable_block`.
    fn find_expandable_block(&mut self, pool: u32, size: u64) -> Option<u32> {
        for unmapped in self.held.blocks.unmapped(pool) {
            let prev = self.held.blocks.node(unmapped).prev;
            let start = if prev != NIL && self.held.blocks.node(prev).state == State::Free { prev } else { unmapped };
            let (mut bytes, mut at) = (0u64, start);
            while bytes < size && at != NIL && self.held.blocks.node(at).state != State::Allocated {
                bytes += self.held.blocks.node(at).size;
                at = self.held.blocks.node(at).next;
            }
            if bytes >= size {
                return Some(start);
            }
        }
        let base = self.held.device.reserve(self.reservation).ok()?;
        self.expandable.insert(base, (self.reservation, pool));
        Some(self.held.blocks.add_segment(pool, base, self.reservation, State::Unmapped))
    }

    /// `map_block`: maps whole pages (as one run) from the start of unmapped block `n` to cover
    /// `size` bytes, and merges the mapped part with a free block before it; returns the merged
    /// block.
    fn map_block(&mut self, n: u32, size: u64) -> Option<u32> {
        let page = self.page(self.held.blocks.node(n).pool);
        let node = *self.held.blocks.node(n);
        let bytes = round_up(size, page)?.min(node.size);
        if !self.mappings.map(self.held.device.as_ref(), node.addr, bytes) {
            return None;
        }
        if bytes < node.size {
            self.held.blocks.split(n, bytes);
        }
        self.held.blocks.set_state(n, State::Free);
        let merged = self.held.blocks.coalesce(n);
        self.held.figures.reserve(bytes);
        Some(merged)
    }

    /// `unmap_block`: unmaps the whole pages inside free block `n` (the parts before and after
    /// stay free), and gives a segment with nothing mapped back.
    fn unmap_block(&mut self, n: u32) {
        let node = *self.held.blocks.node(n);
        let Some((&base, &(reserved, _))) = self.expandable.range(..=node.addr).next_back() else { return };
        let page = self.page(node.pool);
        let begin = base + (node.addr - base).div_ceil(page) * page;
        let end = base + (node.addr + node.size - base) / page * page;
        if begin >= end {
            return;
        }
        let mut middle = n;
        if begin > node.addr {
            middle = self.held.blocks.split(n, begin - node.addr);
        }
        if end < node.addr + node.size {
            self.held.blocks.split(middle, end - begin);
        }
        self.mappings.unmap(self.held.device.as_ref(), begin, end);
        self.held.blocks.set_state(middle, State::Unmapped);
        let middle = self.held.blocks.coalesce(middle);
        self.held.figures.release(end - begin);
        if self.held.blocks.is_whole(middle) {
            self.held.blocks.remove_segment(middle);
            self.expandable.remove(&base);
            let _ = self.held.device.unreserve(base, reserved);
        }
    }

    /// `release_block`: gives a whole cached segment back to the device.
    fn release_block(&mut self, n: u32) {
        self.held.release_segment(n);
    }

    /// Gives back what a free block holds that the device can take: a whole plain segment, or
    /// the whole pages of an expandable block.
    fn release_free_block(&mut self, n: u32) {
        if self.options().expandable {
            self.unmap_block(n);
        } else if self.held.blocks.is_whole(n) {
            self.release_block(n);
        }
    }

    /// `release_cached_blocks`: every free block's memory (all pools and streams).
    fn release_cached_blocks(&mut self) {
        for n in self.held.blocks.all_free() {
            if self.held.blocks.node(n).state == State::Free {
                self.release_free_block(n);
            }
        }
    }

    /// `release_available_cached_blocks` (only with `max_split_size` set): the smallest oversize
    /// segment of the pool that holds the request, else oversize segments largest first until
    /// they add up to it.
    fn release_available_cached_blocks(&mut self, pool: u32, size: u64) -> bool {
        let max_split = self.options().max_split_size;
        if max_split == u64::MAX || self.options().expandable {
            return false;
        }
        let key = size.max(max_split);
        let whole = self.held.blocks.fitting(pool, key).find(|&n| self.held.blocks.is_whole(n));
        if let Some(n) = whole {
            self.release_block(n);
            return true;
        }
        let mut released = 0u64;
        for n in self.held.blocks.free_blocks(pool).into_iter().rev() {
            let block = self.held.blocks.node(n).size;
            if released >= key || block < max_split {
                break;
            }
            if self.held.blocks.is_whole(n) {
                released += block;
                self.release_block(n);
            }
        }
        released >= key
    }

    /// `garbage_collect_cached_blocks`: above the threshold, frees unsplit large-pool segments
    /// whose age (free-block lookups since they were cached) is at least the average, round after
    /// round, until enough is reclaimed or nothing more can be.
    fn garbage_collect(&mut self) {
        let Some(limit) = self.gc_limit else { return };
        let threshold = (self.options().garbage_collection_threshold * limit as f64) as u64;
        if self.held.figures.reserved <= threshold {
            return;
        }
        let target = self.held.figures.reserved - threshold;
        let clock = self.free_block_calls[1];
        let blocks = &self.held.blocks;
        let mut freeable: Vec<u32> =
            blocks.all_free().into_iter().filter(|&n| !self.is_small(blocks.node(n).pool) && blocks.is_whole(n)).collect();
        let age = |list: &BlockList, n: u32| clock - list.node(n).aux;
        let mut total_age: u64 = freeable.iter().map(|&n| age(&self.held.blocks, n)).sum();
        let mut reclaimed = 0u64;
        while reclaimed < target && !freeable.is_empty() {
            let threshold_age = total_age as f64 / freeable.len() as f64;
            let (old, young): (Vec<u32>, Vec<u32>) = freeable.iter().partition(|&&n| age(&self.held.blocks, n) as f64 >= threshold_age);
            if old.is_empty() {
                break;
            }
            for n in old {
                total_age -= age(&self.held.blocks, n);
                reclaimed += self.held.blocks.node(n).size;
                self.release_block(n);
            }
            freeable = young;
        }
    }

    /// The driver trims its pool to the release threshold (modelled at every free).
    fn trim_to_threshold(&mut self) {
        if self.held.figures.reserved <= self.rules.release_threshold {
            return;
        }
        for n in self.held.blocks.all_free() {
            if self.held.figures.reserved <= self.rules.release_threshold {
                break;
            }
            if self.held.blocks.node(n).state == State::Free {
                self.release_free_block(n);
            }
        }
    }
}

/// `roundup_power2_next_division`.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor << 1;
    }
    let rounded = size & !(step - 1);
    if rounded == size {
        size
    } else {
        rounded + step
    }
}

impl BlockModel for Caching {
    fn held(&self) -> &Held {
        &self.held
    }

    fn held_mut(&mut self) -> &mut Held {
        &mut self.held
    }

    /// `DeviceCachingAllocator::malloc`: a cached block, else garbage collection and a new
    /// block; on failure, oversize cached segments are released and it tries again, then every
    /// cached block is released and it tries a last time.
    fn serve(&mut self, orig_size: u64, stream: u64) -> Result<u64, PoolError> {
        let size = self.round_size(orig_size);
        let small = self.rules.small_pool && size <= SMALL_SIZE;
        let pool = self.pool(stream, small);
        let alloc_size = Self::allocation_size(size);
        let found = match self.get_free_block(pool, size) {
            Some(n) => Some(n),
            None => {
                self.garbage_collect();
                let mut block = self.alloc_block(pool, size, alloc_size);
                if block.is_none() && self.release_available_cached_blocks(pool, size) {
                    block = self.alloc_block(pool, size, alloc_size);
                }
                if block.is_none() {
                    self.release_cached_blocks();
                    self.held.figures.alloc_retries += 1;
                    block = self.alloc_block(pool, size, alloc_size);
                }
                block
            }
        };
        let n = found.ok_or_else(|| self.held.out_of_memory(orig_size, self.gc_limit))?;
        let block = self.held.blocks.node(n).size;
        if self.should_split(pool, block, size) {
            let rest = self.held.blocks.split(n, size);
            self.held.blocks.set_aux(rest, self.gc_clock(pool));
        }
        self.held.blocks.set_state(n, State::Allocated);
        let node = self.held.blocks.node(n);
        self.held.figures.allocate(node.size);
        Ok(node.addr)
    }

    /// `free` and `free_block`: back to its pool, merged with free neighbours ([`Held::free`]),
    /// the merged block's garbage-collection age starting again.
    fn after_free(&mut self, merged: u32) {
        let clock = self.gc_clock(self.held.blocks.node(merged).pool);
        self.held.blocks.set_aux(merged, clock);
        self.trim_to_threshold();
    }

    /// `emptyCache`: `release_cached_blocks`.
    fn release_cache(&mut self) {
        self.release_cached_blocks();
    }
}

#[cfg(test)]
mod tests;
