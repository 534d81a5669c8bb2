//! A recorded iteration turned into a schedule: the steps a later iteration takes, in order, to be
//! served from the arena, and where in its stream's region each arena buffer lies.
//!
//! A plan only promises that buffers live at the same step of the recorded sequence share no byte.
//! While a later iteration takes the same steps (each allocation the same size on the same stream,
//! each arena buffer freed where the recording freed it), the arena buffers live at each step are
//! exactly those the plan saw live there, so they never overlap. Frees of the pool's buffers and
//! `record_stream` on them change nothing in the arena, so a step of the schedule only asks for "a
//! free of some pool buffer" and record_stream is no step at all.

use std::collections::BTreeSet;
use std::time::Duration;

use vrampool_core::StreamId;
use vrampool_plan::{plan, quick_plan, Algorithm, Buffer, PlanOptions, QuickPlacement};

use crate::peaks::Four;

/// One event of an iteration as it was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    Alloc {
        size: u64,
        stream: StreamId,
    },
    /// The free of the iteration's `index`-th allocation, naming stream `on` (its own when the
    /// caller named none).
    Free {
        index: u32,
        on: StreamId,
    },
    /// The free of a buffer born before the iteration, or whose birth the record does not know, of
    /// `size` bytes as requested (0 where the free named none): the pool holds it when the
    /// iteration begins, and no longer from here.
    FreeOlder {
        size: u64,
    },
    /// `record_stream` of the iteration's `index`-th allocation on another stream.
    UsedOn {
        index: u32,
    },
}

const FREE: u64 = 1 << 63;
const ARENA: u64 = 1 << 62;
/// A free of a pool buffer the iteration allocated (its index in `offset`).
const KNOWN: u64 = 1 << 61;
const STREAM_SHIFT: u32 = 48;
const SIZE_MASK: u64 = (1 << STREAM_SHIFT) - 1;
/// Streams one schedule can name (its steps keep a stream's index in 13 bits).
const MAX_STREAMS: usize = 1 << 13;

/// One step of a schedule, in two words for the serving path: an allocation (from the arena at
/// `offset` in its stream's region, or from the pool, `offset` then its index among the
/// iteration's allocations), or a free (of an arena buffer at `offset`, of a pool buffer the
/// iteration allocated, by its index, or of an older one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// FREE | ARENA | KNOWN | stream index << 48 | size.
    word: u64,
    offset: u64,
}

impl Step {
    const OLDER_FREE: Step = Step { word: FREE, offset: 0 };

    fn alloc(size: u64, stream: usize, arena: Option<u64>, index: u32) -> Step {
        match arena {
            Some(offset) => Step { word: ARENA | (stream as u64) << STREAM_SHIFT | size, offset },
            None => Step { word: (stream as u64) << STREAM_SHIFT | size, offset: u64::from(index) },
        }
    }

    fn arena_free(size: u64, stream: usize, offset: u64) -> Step {
        Step { word: FREE | ARENA | (stream as u64) << STREAM_SHIFT | size, offset }
    }

    /// The free of the iteration's pool buffer `index`, naming stream `on`.
    fn pool_free(index: u32, on: usize) -> Step {
        Step { word: FREE | KNOWN | (on as u64) << STREAM_SHIFT, offset: u64::from(index) }
    }

    /// Whether this step is the allocation of `size` bytes on the schedule's `stream`-th stream.
    #[inline(always)]
    pub fn allocates(&self, size: u64, stream: usize) -> bool {
        size <= SIZE_MASK && self.word & !ARENA == (stream as u64) << STREAM_SHIFT | size
    }

    #[inline(always)]
    pub fn is_free(&self) -> bool {
        self.word & FREE != 0
    }

    #[inline(always)]
    pub fn in_arena(&self) -> bool {
        self.word & ARENA != 0
    }

    /// Whether this step frees a buffer born before the iteration (any of the pool's).
    #[inline(always)]
    pub fn is_older_free(&self) -> bool {
        *self == Step::OLDER_FREE
    }

    /// For a free of a pool buffer: the iteration's allocation it frees, if the iteration made it.
    #[inline(always)]
    pub fn frees_index(&self) -> Option<usize> {
        (self.word & (FREE | ARENA | KNOWN) == FREE | KNOWN).then_some(self.offset as usize)
    }

    #[inline(always)]
    pub fn stream(&self) -> usize {
        ((self.word & !(FREE | ARENA | KNOWN)) >> STREAM_SHIFT) as usize
    }

    #[inline(always)]
    pub fn size(&self) -> u64 {
        self.word & SIZE_MASK
    }

    /// The arena offset (arena steps), or the allocation's index (a pool allocation, a known free).
    #[inline(always)]
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// A buffer of the iteration live at some step: where the schedule put it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    /// The iteration's allocation it is (its index among the allocations).
    pub index: u32,
    pub stream: usize,
    /// Its offset in its stream's region, or None for a pool buffer.
    pub offset: Option<u64>,
    pub size: u64,
}

/// How the regions of a schedule were planned (the planner's stage, for the figures).
pub(crate) type Planner = &'static str;

/// What the first steps of a schedule served: allocations from the arena and from the pool, the
/// arena's bytes, and the arena buffers (and bytes) still live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Served {
    pub arena: u64,
    /// The arena buffers' bytes, as requested and as blocks (each rounded up to the alignment).
    pub arena_bytes: u64,
    pub arena_block_bytes: u64,
    pub pool: u64,
    pub live: u64,
    pub live_bytes: u64,
    /// The live buffers' bytes as blocks: each rounded up to the schedule's alignment.
    pub live_block_bytes: u64,
}

impl Served {
    fn take(&mut self, step: &Step, alignment: u64) {
        let block = step.size().next_multiple_of(alignment);
        match (step.is_free(), step.in_arena()) {
            (false, true) => {
                self.arena += 1;
                self.arena_bytes += step.size();
                self.arena_block_bytes += block;
                self.live += 1;
                self.live_bytes += step.size();
                self.live_block_bytes += block;
            }
            (false, false) => self.pool += 1,
            (true, true) => {
                self.live -= 1;
                self.live_bytes -= step.size();
                self.live_block_bytes -= block;
            }
            (true, false) => {}
        }
    }
}

/// The most an iteration holds at once of its own buffers, the arena's and the pool's (each
/// rounded up to the alignment), less the older buffers it has freed by then, as `peaks::Four`
/// counts them, each at its own step; and the first step count by which all four were reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LivePeak {
    pub most: Four,
    pub reached: usize,
    /// What the pool holds more after each iteration: the pool buffers it keeps past its end, less
    /// the older ones it frees (a loss kept in a list each step).
    pub drift: Four,
}

/// Steps between the schedule's checkpoints of `Served`: the figures at any step cost at most this
/// many steps' reading, for a sixty-fourth of the steps' memory.
const CHECKPOINT_EVERY: usize = 64;

/// A recorded sequence, planned.
#[derive(Debug)]
pub(crate) struct Schedule {
    pub steps: Box<[Step]>,
    /// `Served` after every `CHECKPOINT_EVERY` steps.
    checkpoints: Box<[Served]>,
    /// Per step: the next allocation step at or after it (the end of a group of frees, which may
    /// come in any order: nothing is handed out between them).
    next_allocation: Box<[u32]>,
    /// Per step that frees one of the iteration's buffers: which allocation (`u32::MAX` otherwise).
    frees: Box<[u32]>,
    /// Each arena buffer by (stream, offset): its allocation and free steps, in order.
    arena_buffers_at: foldhash::HashMap<(usize, u64), Vec<(u32, u32)>>,
    /// The streams the steps name, by index.
    pub streams: Box<[StreamId]>,
    /// The streams' indices in stream order, for a lookup in O(log n) where there are many.
    stream_order: Box<[(StreamId, u32)]>,
    /// Per allocation: used on another stream (`record_stream`), so left to the pool.
    pub used_elsewhere: Box<[bool]>,
    /// The requested sizes of the older buffers freed, by step, where the recording knew them.
    older_sizes: foldhash::HashMap<u32, u64>,
    /// The bytes each stream's region needs.
    pub region_bytes: Box<[u64]>,
    /// The most bytes of arena buffers live at once (per stream, summed): no plan needs less.
    pub lower_bound_bytes: u64,
    pub allocations: u64,
    /// Allocations served from the arena in one iteration (their bytes: `served_in`).
    pub arena_buffers: u64,
    /// The blocks' alignment: an arena buffer holds its size rounded up to it.
    pub alignment: u64,
    pub peak: LivePeak,
    pub planner: Planner,
}

impl Schedule {
    /// The arena bytes the schedule needs, all regions together.
    pub fn arena_bytes(&self) -> u64 {
        self.region_bytes.iter().sum()
    }

    /// The index of `stream` among the schedule's streams.
    #[inline(always)]
    pub fn stream_index(&self, stream: StreamId) -> Option<usize> {
        // A loop runs on a stream or two: a scan; thousands of streams, a binary search.
        if self.streams.len() <= 8 {
            return self.streams.iter().position(|&s| s == stream);
        }
        let at = self.stream_order.binary_search_by_key(&stream, |&(s, _)| s).ok()?;
        Some(self.stream_order[at].1 as usize)
    }

    /// Whether an iteration that began with `lead` frees of older buffers, then an allocation of
    /// `size` bytes on `stream`, begins as this schedule does.
    pub fn starts_with(&self, lead: usize, size: u64, stream: StreamId) -> bool {
        let Some(index) = self.stream_index(stream) else { return false };
        self.steps.get(lead).is_some_and(|s| s.allocates(size, index)) && self.steps[..lead].iter().all(|&s| s == Step::OLDER_FREE)
    }

    /// The iteration's buffers live once the first `steps` steps are taken (arena ones, and pool
    /// ones whose free the schedule knows), by allocation. O(steps).
    pub fn live_after(&self, steps: usize, early: &BTreeSet<usize>) -> Vec<Placed> {
        let mut born: Vec<Placed> = Vec::new();
        let mut arena: foldhash::HashMap<(usize, u64), usize> = foldhash::HashMap::default();
        let mut freed: Vec<bool> = Vec::new();
        for step in &self.steps[..steps] {
            if !step.is_free() {
                let index = born.len() as u32;
                let offset = step.in_arena().then_some(step.offset());
                if let Some(offset) = offset {
                    arena.insert((step.stream(), offset), born.len());
                }
                born.push(Placed { index, stream: step.stream(), offset, size: step.size() });
                freed.push(false);
            } else if step.in_arena() {
                let at = arena.remove(&(step.stream(), step.offset())).expect("a schedule frees what it placed");
                freed[at] = true;
            } else if let Some(index) = step.frees_index() {
                freed[index] = true;
            }
        }
        for index in early.iter().filter_map(|&at| self.freed_by(at)) {
            freed[index as usize] = true;
        }
        let known = self.freed_in_iteration();
        born.into_iter().zip(freed).filter(|(p, f)| !f && (p.offset.is_some() || known[p.index as usize])).map(|(p, _)| p).collect()
    }

    /// Per allocation: whether the iteration frees it (where the schedule knows the free).
    fn freed_in_iteration(&self) -> Vec<bool> {
        let mut freed = vec![false; self.allocations as usize];
        let mut index = 0usize;
        for step in self.steps.iter() {
            if !step.is_free() {
                freed[index] = step.in_arena();
                index += 1;
            } else if let Some(i) = step.frees_index() {
                freed[i] = true;
            }
        }
        freed
    }

    /// The end of the group of frees that `position` is in (the next allocation step).
    pub fn group_end(&self, position: usize) -> usize {
        self.next_allocation.get(position).map_or(self.steps.len(), |&end| end as usize)
    }

    /// Which of the iteration's allocations step `at` frees, if it frees one.
    pub fn freed_by(&self, at: usize) -> Option<u32> {
        self.frees.get(at).copied().filter(|&index| index != u32::MAX)
    }

    /// The arena buffer at `offset` of stream `stream`'s region that lives once `position` steps
    /// are taken (whatever frees were taken out of order): its free step.
    pub fn arena_buffer_at(&self, stream: usize, offset: u64, position: usize) -> Option<usize> {
        let buffers = self.arena_buffers_at.get(&(stream, offset))?;
        buffers.iter().find(|&&(born, freed)| (born as usize) < position && position <= freed as usize).map(|&(_, freed)| freed as usize)
    }

    /// What the first `steps` steps served. O(1): from the checkpoint before, at most 63 steps on.
    pub fn served_in(&self, steps: usize) -> Served {
        let at = steps / CHECKPOINT_EVERY;
        let mut served = self.checkpoints[at];
        self.steps[at * CHECKPOINT_EVERY..steps].iter().for_each(|step| served.take(step, self.alignment));
        served
    }

    /// The free of an older buffer at step `at`, with its size where the recording knew it.
    fn older_free(&self, at: usize) -> Recorded {
        Recorded::FreeOlder { size: self.older_sizes.get(&(at as u32)).copied().unwrap_or(0) }
    }

    /// The first `steps` steps as a recording would have seen them, for a recording that goes on from
    /// there. Frees of older buffers stay so; `record_stream` on another stream comes back as an event
    /// right after the allocation it marks (when, exactly, does not matter to a plan).
    pub fn recorded_prefix(&self, steps: usize, early: &BTreeSet<usize>) -> Vec<Recorded> {
        let mut live: foldhash::HashMap<(usize, u64), u32> = foldhash::HashMap::default();
        let mut index = 0u32;
        let mut events = Vec::with_capacity(steps);
        for (at, step) in self.steps[..steps].iter().enumerate() {
            match (step.is_free(), step.in_arena()) {
                (false, arena) => {
                    if arena {
                        live.insert((step.stream(), step.offset()), index);
                    }
                    events.push(Recorded::Alloc { size: step.size(), stream: self.streams[step.stream()] });
                    if self.used_elsewhere[index as usize] {
                        events.push(Recorded::UsedOn { index });
                    }
                    index += 1;
                }
                (true, true) => {
                    let index = live.remove(&(step.stream(), step.offset())).expect("a schedule frees what it placed");
                    events.push(Recorded::Free { index, on: self.streams[step.stream()] });
                }
                (true, false) => events.push(match step.frees_index() {
                    Some(index) => Recorded::Free { index: index as u32, on: self.streams[step.stream()] },
                    None => self.older_free(at),
                }),
            }
        }
        // Frees taken ahead of their step, in the order of their steps.
        events.extend(early.iter().map(|&at| match self.freed_by(at) {
            Some(index) => Recorded::Free { index, on: self.streams[self.steps[at].stream()] },
            None => self.older_free(at),
        }));
        events
    }
}

/// What planning a region may spend: the search's budget and the offsets' alignment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planning {
    pub budget: Duration,
    pub alignment: u64,
}

/// Plans the buffers born and freed inside `events` on their own stream and used on no other, each
/// stream in a region of its own (a GPU stream may still be using bytes that the host's order says
/// are free: only the same stream's later work is ordered after it). None when the planner refuses
/// the sizes (they overflow once aligned), or the sequence names too many streams.
pub(crate) fn plan_schedule(events: &[Recorded], planning: Planning) -> Option<Schedule> {
    // Per allocation: (stream, size, born at, freed at).
    let mut births: Vec<(StreamId, u64, u64, Option<u64>)> = Vec::new();
    let mut elsewhere: Vec<bool> = Vec::new();
    for (time, event) in events.iter().enumerate() {
        match *event {
            Recorded::Alloc { size, stream } => {
                births.push((stream, size, time as u64, None));
                elsewhere.push(false);
            }
            Recorded::Free { index, on } => {
                let birth = &mut births[index as usize];
                if birth.0 == on && !elsewhere[index as usize] {
                    birth.3 = Some(time as u64);
                }
            }
            Recorded::UsedOn { index } => elsewhere[index as usize] = true,
            Recorded::FreeOlder { .. } => {}
        }
    }
    // The allocations' streams, then those that frees name, each once.
    let (mut streams, mut seen) = (Vec::new(), foldhash::HashSet::default());
    let frees_on = events.iter().filter_map(|e| match *e {
        Recorded::Free { on, .. } => Some(on),
        _ => None,
    });
    for stream in births.iter().map(|b| b.0).chain(frees_on) {
        if seen.insert(stream) {
            streams.push(stream);
        }
    }
    if streams.len() > MAX_STREAMS {
        return None;
    }
    let mut offsets: Vec<Option<u64>> = vec![None; births.len()];
    let (mut region_bytes, mut lower_bound_bytes, mut planners) = (Vec::new(), 0u64, Vec::new());
    let allocating: foldhash::HashSet<StreamId> = births.iter().map(|b| b.0).collect();
    let mut members: foldhash::HashMap<StreamId, Vec<usize>> = foldhash::HashMap::default();
    for (i, b) in births.iter().enumerate() {
        members.entry(b.0).or_default().push(i);
    }
    for &stream in &streams {
        if !allocating.contains(&stream) {
            region_bytes.push(0);
            planners.push("none");
            continue;
        }
        let (indices, buffers): (Vec<usize>, Vec<Buffer>) = members[&stream]
            .iter()
            .filter_map(|&i| {
                let (_, size, born, freed) = births[i];
                Some((i, Buffer::new(i as u64, born, freed?, size)))
            })
            .unzip();
        let region = plan_region(&buffers, planning)?;
        for (&i, &offset) in indices.iter().zip(&region.offsets) {
            offsets[i] = Some(offset);
        }
        region_bytes.push(region.arena_bytes);
        lower_bound_bytes = lower_bound_bytes.checked_add(region.lower_bound_bytes)?;
        planners.push(region.planner);
    }
    let mut stream_order: Vec<(StreamId, u32)> = streams.iter().enumerate().map(|(i, &s)| (s, i as u32)).collect();
    stream_order.sort_unstable();
    let stream_index =
        |s: StreamId| stream_order[stream_order.binary_search_by_key(&s, |&(t, _)| t).expect("every stream has a region")].1 as usize;
    let mut steps = Vec::with_capacity(events.len());
    let mut older_sizes = foldhash::HashMap::default();
    let (mut allocations, mut arena_buffers) = (0u64, 0u64);
    for event in events {
        steps.push(match *event {
            Recorded::Alloc { size, stream } => {
                let offset = offsets[allocations as usize];
                allocations += 1;
                arena_buffers += u64::from(offset.is_some());
                Step::alloc(size, stream_index(stream), offset, (allocations - 1) as u32)
            }
            Recorded::Free { index, on } => match offsets[index as usize] {
                Some(offset) => {
                    let (stream, size, ..) = births[index as usize];
                    Step::arena_free(size, stream_index(stream), offset)
                }
                None => Step::pool_free(index, stream_index(on)),
            },
            Recorded::FreeOlder { size } => {
                if size > 0 {
                    older_sizes.insert(steps.len() as u32, size);
                }
                Step::OLDER_FREE
            }
            Recorded::UsedOn { .. } => continue,
        });
    }
    let mut next_allocation = vec![0u32; steps.len()];
    let mut next = steps.len() as u32;
    for (at, step) in steps.iter().enumerate().rev() {
        if !step.is_free() {
            next = at as u32;
        }
        next_allocation[at] = next;
    }
    let (mut frees, mut arena_buffers_at) = (vec![u32::MAX; steps.len()], foldhash::HashMap::default());
    let mut born_at: foldhash::HashMap<(usize, u64), (u32, u32)> = foldhash::HashMap::default();
    let mut index = 0u32;
    for (at, step) in steps.iter().enumerate() {
        match (step.is_free(), step.in_arena()) {
            (false, arena) => {
                if arena {
                    born_at.insert((step.stream(), step.offset()), (at as u32, index));
                }
                index += 1;
            }
            (true, true) => {
                let (born, index) = born_at.remove(&(step.stream(), step.offset())).expect("a schedule frees what it placed");
                frees[at] = index;
                arena_buffers_at.entry((step.stream(), step.offset())).or_insert_with(Vec::new).push((born, at as u32));
            }
            (true, false) => frees[at] = step.frees_index().map_or(u32::MAX, |i| i as u32),
        }
    }
    let alignment = planning.alignment.max(1);
    let (mut checkpoints, mut served, mut peak) = (vec![Served::default()], Served::default(), LivePeak::default());
    // The iteration's pool buffers live, as `Four`: those it frees itself, by their allocation's size;
    // and the older buffers it has freed, which the pool held when it began.
    let (mut pool_live, mut older_freed): (Four, Four) = ([0; 4], [0; 4]);
    let counts = |size: u64| [size.next_multiple_of(alignment), size, size.next_multiple_of(alignment), 1];
    for (at, step) in steps.iter().enumerate() {
        served.take(step, alignment);
        let pool_size = match (step.is_free(), step.in_arena()) {
            (false, false) => Some((step.size(), true)),
            (true, false) => step.frees_index().map(|i| (births[i].1, false)),
            _ => None,
        };
        if let Some((size, born)) = pool_size {
            for (live, n) in pool_live.iter_mut().zip(counts(size)) {
                *live = if born { *live + n } else { live.saturating_sub(n) };
            }
        }
        if let Some(&size) = older_sizes.get(&(at as u32)) {
            older_freed.iter_mut().zip(counts(size)).for_each(|(freed, n)| *freed += n);
        }
        let now = [served.live_block_bytes, served.live_bytes, served.live_block_bytes, served.live];
        for (((most, arena), pool), older) in peak.most.iter_mut().zip(now).zip(pool_live).zip(older_freed) {
            let held = (arena + pool).saturating_sub(older);
            if held > *most {
                (*most, peak.reached) = (held, at + 1);
            }
        }
        if (at + 1) % CHECKPOINT_EVERY == 0 {
            checkpoints.push(served);
        }
    }
    if steps.len() % CHECKPOINT_EVERY != 0 {
        checkpoints.push(served);
    }
    peak.drift = std::array::from_fn(|k| pool_live[k].saturating_sub(older_freed[k]));
    // The planner that placed the largest region names the schedule's.
    let largest = region_bytes.iter().enumerate().max_by_key(|&(_, b)| *b).map(|(i, _)| i);
    Some(Schedule {
        steps: steps.into(),
        checkpoints: checkpoints.into(),
        stream_order: stream_order.into(),
        next_allocation: next_allocation.into(),
        frees: frees.into(),
        arena_buffers_at,
        streams: streams.into(),
        used_elsewhere: elsewhere.into(),
        older_sizes,
        region_bytes: region_bytes.into(),
        lower_bound_bytes,
        allocations,
        arena_buffers,
        alignment,
        peak,
        planner: largest.map_or("none", |i| planners[i]),
    })
}

/// One region's plan.
struct Region {
    offsets: Vec<u64>,
    arena_bytes: u64,
    lower_bound_bytes: u64,
    planner: Planner,
}

/// A region within this of its lower bound is not searched further (a hundredth: the search's gain
/// there is less than its budget's cost to the step that waits for it).
const CLOSE_ENOUGH: f64 = 1.01;

/// A region's buffers placed: first in O(n log n) with no clock (`quick_plan`), so that ending an
/// iteration never costs more than that whatever its buffers; then, where that plan is more than a
/// hundredth above the lower bound (and not best fit by start's within a sixteenth of it), the
/// planner's search within the budget, kept where it does better.
fn plan_region(buffers: &[Buffer], planning: Planning) -> Option<Region> {
    if buffers.is_empty() {
        return Some(Region { offsets: Vec::new(), arena_bytes: 0, lower_bound_bytes: 0, planner: "none" });
    }
    let quick = quick_plan(buffers, planning.alignment).ok()?;
    // Best fit by start wins where greedy by size is poor (caches grown by copy), and the search, which
    // starts from greedy by size and best fit decreasing, did not come near it in its budget (a decode of
    // 3,088 buffers: 1.74x the bound after 50 ms, against 1.05x): where it placed them within a
    // sixteenth of the bound, the search is not run.
    let by_start_close = quick.placement == QuickPlacement::BestFitByStart && !quick.is_poor();
    let mut region = Region {
        arena_bytes: quick.plan.arena_bytes,
        lower_bound_bytes: quick.plan.lower_bound_bytes,
        offsets: quick.plan.offsets,
        planner: quick.placement.name(),
    };
    if region.arena_bytes as f64 > region.lower_bound_bytes as f64 * CLOSE_ENOUGH && !planning.budget.is_zero() && !by_start_close {
        let options = PlanOptions { algorithm: Algorithm::Auto, budget: planning.budget, alignment: planning.alignment };
        if let Ok(searched) = plan(buffers, &options) {
            if searched.arena_bytes < region.arena_bytes {
                (region.offsets, region.arena_bytes, region.planner) = (searched.offsets, searched.arena_bytes, "search");
            }
        }
    }
    Some(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S0: StreamId = StreamId(0);
    const S1: StreamId = StreamId(1);
    const PLANNING: Planning = Planning { budget: Duration::from_millis(10), alignment: 512 };

    fn alloc(size: u64, stream: StreamId) -> Recorded {
        Recorded::Alloc { size, stream }
    }

    fn free(index: u32, on: StreamId) -> Recorded {
        Recorded::Free { index, on }
    }

    #[test]
    fn steps_pack_and_match_only_their_own_allocation() {
        let step = Step::alloc(4096, 3, Some(1 << 20), 9);
        assert!(step.allocates(4096, 3) && step.in_arena() && !step.is_free());
        assert!(!step.allocates(4096, 2) && !step.allocates(4608, 3));
        assert!(!step.allocates(4096 | 3 << 48, 0), "a size past 48 bits never aliases a stream");
        assert_eq!((step.stream(), step.size(), step.offset()), (3, 4096, 1 << 20));
        let freed = Step::arena_free(4096, 3, 1 << 20);
        assert!(freed.is_free() && freed.in_arena() && !freed.allocates(4096, 3));
        assert!(Step::OLDER_FREE.is_free() && !Step::OLDER_FREE.in_arena() && Step::OLDER_FREE.frees_index().is_none());
        let pool = Step::alloc(512, 0, None, 9);
        assert!(!pool.in_arena() && pool.allocates(512, 0) && pool.offset() == 9);
        let known = Step::pool_free(9, 2);
        assert!(known.is_free() && !known.in_arena() && known.frees_index() == Some(9) && known.stream() == 2);
        assert_eq!(freed.frees_index(), None);
    }

    #[test]
    fn buffers_freed_inside_on_their_stream_go_to_the_arena_the_rest_to_the_pool() {
        let events = [
            alloc(4096, S0), // 0: freed inside
            alloc(8192, S0), // 1: outlives the iteration
            alloc(4096, S1), // 2: on its own stream's region
            alloc(1024, S0), // 3: used on another stream
            Recorded::UsedOn { index: 3 },
            free(0, S0),
            free(2, S1),
            free(3, S0),
            Recorded::FreeOlder { size: 0 },
            alloc(2048, S0), // 4: freed on another stream
            free(4, S1),
        ];
        let s = plan_schedule(&events, PLANNING).unwrap();
        assert_eq!(s.steps.len(), events.len() - 1, "record_stream is no step");
        assert_eq!((s.allocations, s.arena_buffers, s.served_in(s.steps.len()).arena_bytes), (5, 2, 8192));
        assert_eq!(&*s.streams, &[S0, S1]);
        assert_eq!(&*s.region_bytes, &[4096, 4096]);
        assert_eq!(&*s.used_elsewhere, &[false, false, false, true, false]);
        let in_arena: Vec<bool> = s.steps.iter().filter(|s| !s.is_free()).map(Step::in_arena).collect();
        assert_eq!(in_arena, [true, false, true, false, false]);
        assert_eq!(s.steps[4], Step::arena_free(4096, 0, 0));
        assert_eq!(s.steps[6], Step::pool_free(3, 0), "a pool buffer of the iteration: which one is kept");
        assert_eq!(s.steps[7], Step::OLDER_FREE);
        // Live: the arena's, and the pool's whose free the iteration holds (not 1, which outlives it).
        assert_eq!(s.live_after(4, &BTreeSet::new()).iter().map(|p| p.index).collect::<Vec<_>>(), [0, 2, 3]);
        assert_eq!(s.live_after(5, &BTreeSet::new()).iter().map(|p| (p.index, p.offset)).collect::<Vec<_>>(), [(2, Some(0)), (3, None)]);
        let served = s.served_in(4);
        assert_eq!((served.arena, served.arena_bytes, served.pool, served.live, served.live_bytes), (2, 8192, 2, 2, 8192));
        assert_eq!(s.served_in(s.steps.len()).live, 0);
        assert_eq!(s.recorded_prefix(s.steps.len(), &BTreeSet::new()), events, "a schedule knows its recording back");
        // Steps 4 to 7 are one group of frees (no allocation between them), which may come in any order.
        assert_eq!((s.group_end(4), s.group_end(7), s.group_end(8)), (8, 8, 8));
        assert_eq!((s.freed_by(4), s.freed_by(6), s.freed_by(7)), (Some(0), Some(3), None));
        assert_eq!(s.arena_buffer_at(0, 0, 1), Some(4), "buffer 0, born at step 0, freed at step 4");
        assert_eq!(s.arena_buffer_at(0, 0, 5), None, "freed");
        // Buffer 2's free (step 5) taken ahead of step 4: it is no longer live, and the recording says so.
        assert_eq!(s.live_after(4, &BTreeSet::from([5])).iter().map(|p| p.index).collect::<Vec<_>>(), [0, 3]);
        assert_eq!(s.recorded_prefix(4, &BTreeSet::from([5])).last(), Some(&Recorded::Free { index: 2, on: S1 }));
    }

    #[test]
    fn many_streams_each_have_a_region_and_are_found_by_a_binary_search() {
        let streams: Vec<StreamId> = (0..40).map(|i| StreamId(1000 - 7 * i)).collect();
        let mut events = Vec::new();
        for (i, &stream) in streams.iter().enumerate() {
            events.extend([alloc(4096, stream), free(i as u32, stream)]);
        }
        let s = plan_schedule(&events, PLANNING).unwrap();
        assert_eq!(s.streams.len(), 40);
        for (i, &stream) in streams.iter().enumerate() {
            assert_eq!(s.stream_index(stream), Some(i));
        }
        assert_eq!(s.stream_index(StreamId(3)), None);
        assert!(s.region_bytes.iter().all(|&b| b == 4096));
    }

    #[test]
    fn a_schedule_replans_to_itself() {
        let events = [alloc(4096, S0), alloc(4096, S0), free(0, S0), alloc(2048, S0), free(1, S0), free(2, S0)];
        let s = plan_schedule(&events, PLANNING).unwrap();
        assert_eq!(s.recorded_prefix(s.steps.len(), &BTreeSet::new()), events);
        assert_eq!((s.arena_bytes(), s.lower_bound_bytes), (8192, 8192));
        assert!(s.starts_with(0, 4096, S0) && !s.starts_with(0, 4096, S1) && !s.starts_with(1, 4096, S0));
    }
}
