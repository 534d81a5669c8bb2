//! Depth-first branch and bound: does a part fit under a given capacity?
//!
//! **Canonical placements** (MiniMalloc, ASPLOS 2023). Push every buffer of a plan down as far as it goes; the
//! arena does not grow, and each buffer then rests on a buffer that overlaps it in time, or on 0. Listing those
//! buffers by (offset, rank) and placing them one after the other, each lands exactly on its *floor*: the
//! highest top among the placed buffers that overlap it. So the search only chooses which buffer comes next;
//! it goes at its floor, and offsets never decrease along a branch (the current offset is the *level*).
//!
//! Every rule below only prunes branches that cannot lead to P, the plan that fits with the least potential
//! `sum(size^2 * offset)` (the least total offset, weighted so that the stacks rule holds too). Pushing one
//! buffer down lowers that potential, so P is canonical, and the search, which keeps P's branch, stays exact:
//! - **Order**: the next buffer's floor is at least the level, and if equal, its rank comes after the rank of
//!   the buffer placed last at that level.
//! - **Dominance**: placing at offset `x` is useless while some unplaced `c` has `floor(c) + size(c) <= x`: all
//!   buffers placed from now on lie at `x` or above, so `c` could drop to its floor, and P would not be least.
//! - **Sections**: the unplaced buffers live in one section all overlap each other and all lie above their
//!   floors and above the level, so the lowest floor there (or the level, if higher) plus their total must fit.
//! - **Level bound**: the same, read before choosing: the next offset plus the unplaced bytes of any section
//!   must fit, which rules out most candidates without trying them.
//! - **Stranded buffers**: a buffer that can no longer go at its floor must in P rest on a neighbour placed
//!   later, low enough to cover the slot at its floor; without such a neighbour the branch is dead.
//! - **Hatless buffers**: a buffer whose neighbours in time are all placed touches nothing else, so it goes at
//!   its floor at once, with no branching; in P it lies above the level as well.
//! - **Twins**: buffers of the same lifetime and size are interchangeable, so they go in rank order.
//! - **Stacks**: when a buffer rests right on one of exactly the same lifetime, swapping the two covers the
//!   same bytes, and putting the larger below lowers the potential; so in P the lower one is not the smaller.
//! - **Decomposition**: when no unplaced buffer is live at some moment, the unplaced buffers before and after
//!   it never meet again; each group is solved on its own, and when one has no plan the node fails at once
//!   instead of trying every combination of the others' choices. Under a re-ranking order (MiniMalloc's
//!   dynamic preordering) each group is ranked anew by the bytes still unplaced in its sections; the group's
//!   first placement then only keeps offsets at or above the level, since the tie-break with the buffer placed
//!   last was a comparison of the old ranks.
//! - **Failed groups**: a group that had no plan is remembered by its state (its buffers, their floors, and
//!   the level where it matters), since backtracking over a choice elsewhere in time brings it back unchanged.
//!
//! **Obstacles.** A part may have to stay clear of buffers fixed outside it (a band of a large part,
//! see `lowering.rs`). A buffer's floor is then the lowest offset above the placed buffers it overlaps where it
//! also clears its obstacles; pushed down, P's buffers lie at exactly those floors, so the search stays exact.
//! The bounds count only the part's own bytes, which keeps them necessary, if weaker.

use std::collections::HashSet;
use std::time::Instant;

use super::component::Component;
use crate::order::Order;

/// Groups of at least this many buffers look at the clock on every node, the others on every 64th: a node
/// scans its group (and hashes it for the memo), so on a large group one node can take milliseconds.
const LARGE_GROUP: usize = 256;

pub(crate) enum Outcome {
    /// Offsets (local order) of a plan whose every buffer ends at or below the capacity.
    Fits(Vec<u64>),
    /// No plan fits: the capacity is below the optimum.
    Infeasible,
    /// The deadline (or the node limit) came first.
    TimedOut,
}

const NONE: u32 = u32::MAX;

/// A search order: each buffer's rank (among candidates at one floor, lower ranks go first), and the order to
/// rank each group by anew at a decomposition, if any.
pub(crate) struct Ranking {
    pub rank: Vec<u32>,
    pub rerank: Option<Order>,
}

impl Ranking {
    /// The ranks of `order`, kept for the whole search.
    pub fn fixed(part: &Component, order: Order) -> Ranking {
        Ranking { rank: part.ranking(order), rerank: None }
    }

    /// The ranks of `order`, computed anew for each group at every decomposition.
    pub fn reranked(part: &Component, order: Order) -> Ranking {
        Ranking { rank: part.ranking(order), rerank: Some(order) }
    }
}

/// Failed group states kept at most (16 bytes each); past this the memory starts over.
const MAX_REMEMBERED: usize = 1 << 22;

/// Searches for a plan of `part` in which every buffer ends at or below `capacity`, until `deadline` or until
/// `nodes` (placements tried, counted across calls) reaches `node_limit`. `ranking` orders the buffers:
/// among candidates at the same floor the search tries lower ranks first. Recursion goes as deep as the part
/// has buffers: call it on a thread with a large stack.
pub(crate) fn fits(
    part: &Component,
    ranking: &Ranking,
    capacity: u64,
    deadline: Instant,
    nodes: &mut u64,
    node_limit: u64,
) -> Outcome {
    fits_reaching(part, ranking, capacity, deadline, nodes, node_limit).0
}

/// `fits`, and the most buffers the search had placed at once.
pub(crate) fn fits_reaching(
    part: &Component,
    ranking: &Ranking,
    capacity: u64,
    deadline: Instant,
    nodes: &mut u64,
    node_limit: u64,
) -> (Outcome, usize) {
    let mut search = Search::new(part, ranking, capacity, deadline, *nodes, node_limit);
    let outcome = search.run();
    *nodes = search.nodes;
    (outcome, search.deepest)
}

enum Undo {
    /// Restore a floor.
    Floor(u32, u64),
    /// Restore a section's lowest floor and how many unplaced buffers are at it.
    Lowest(u32, u64, u32),
    /// Take a buffer out again.
    Place(u32),
    /// Restore a rank.
    Rank(u32, u32),
}

struct Search<'a> {
    part: &'a Component,
    rank: Vec<u32>,
    rerank: Option<Order>,
    capacity: u64,
    floor: Vec<u64>,
    placed: Vec<bool>,
    /// Unplaced neighbours of each buffer.
    open: Vec<u32>,
    /// Unplaced bytes live in each section.
    remaining: Vec<u64>,
    /// The lowest floor among the unplaced buffers live in each section (`u64::MAX` if none), and how many are
    /// at it, so that it is looked for again only when the last of them leaves.
    lowest: Vec<u64>,
    at_lowest: Vec<u32>,
    /// For each buffer, its twin ranked just before it (`NONE` if none).
    twin_before: Vec<u32>,
    /// Capacity left in each section at its last check (to take the tightest group first).
    slack: Vec<u64>,
    log: Vec<Undo>,
    failed: HashSet<u128>,
    deadline: Instant,
    nodes: u64,
    node_limit: u64,
    timed_out: bool,
    /// Buffers placed now, and the most placed at once.
    depth: usize,
    deepest: usize,
    // Scratch for `place` and `refresh_lowest`.
    moved: Vec<(u32, u64)>,
    dirty: Vec<u32>,
    seen: Vec<u32>,
    left: Vec<u32>,
    stamp: u32,
}

impl<'a> Search<'a> {
    fn new(part: &'a Component, ranking: &Ranking, capacity: u64, deadline: Instant, nodes: u64, limit: u64) -> Self {
        let sections = part.live.len();
        let floor: Vec<u64> = (0..part.len()).map(|i| part.lift(i, 0)).collect();
        let lowest_of = |s: &Vec<u32>| s.iter().map(|&i| floor[i as usize]).min().unwrap_or(u64::MAX);
        let lowest: Vec<u64> = part.live.iter().map(lowest_of).collect();
        let at_lowest = part
            .live
            .iter()
            .zip(&lowest)
            .map(|(s, &low)| s.iter().filter(|&&i| floor[i as usize] == low).count() as u32)
            .collect();
        Search {
            part,
            rank: ranking.rank.clone(),
            rerank: ranking.rerank,
            capacity,
            floor,
            placed: vec![false; part.len()],
            open: part.neighbors.iter().map(|v| v.len() as u32).collect(),
            remaining: part.live.iter().map(|s| s.iter().map(|&i| part.size[i as usize]).sum()).collect(),
            lowest,
            at_lowest,
            twin_before: twin_before(part, &ranking.rank),
            slack: vec![0; sections],
            log: Vec::new(),
            failed: HashSet::new(),
            deadline,
            nodes,
            node_limit: limit,
            timed_out: false,
            depth: 0,
            deepest: 0,
            moved: Vec::new(),
            dirty: Vec::new(),
            seen: vec![0; sections],
            left: vec![0; sections],
            stamp: 0,
        }
    }

    fn run(&mut self) -> Outcome {
        let n = self.part.len() as u32;
        // Buffers that overlap nothing go at 0.
        for i in 0..n {
            if self.open[i as usize] == 0 && !self.place_hatless(i, 0, NONE) {
                return Outcome::Infeasible;
            }
        }
        let mut rest: Vec<u32> = (0..n).filter(|&i| !self.placed[i as usize]).collect();
        rest.sort_by_key(|&i| self.part.lo[i as usize]);
        if !rest.is_empty() && !self.solve_all(rest, 0, NONE) {
            return if self.timed_out { Outcome::TimedOut } else { Outcome::Infeasible };
        }
        // The floor of a placed buffer is its offset.
        Outcome::Fits(self.floor.clone())
    }

    /// Places the unplaced buffers `rest` (sorted by start) group by group. On failure the caller undoes.
    fn solve_all(&mut self, rest: Vec<u32>, level: u64, last: u32) -> bool {
        let (lo, hi) = span(self.part, &rest);
        if !self.sections_fit(lo, hi, level) {
            return false;
        }
        let mut groups = split(self.part, rest);
        let mut last = last;
        if groups.len() > 1 {
            // Tightest group first: if any group fails, the sooner the better.
            let (part, slack) = (self.part, &self.slack);
            groups.sort_by_cached_key(|g| {
                let (lo, hi) = span(part, g);
                slack[lo as usize..hi as usize].iter().copied().min().unwrap_or(u64::MAX)
            });
            if let Some(order) = self.rerank {
                groups.iter().for_each(|g| self.rank_anew(g, order));
                last = NONE;
            }
        }
        groups.into_iter().all(|g| self.solve(&g, level, last))
    }

    /// Ranks `group` by `order`, with the bytes still unplaced in each section as the T key. The group keeps
    /// the set of rank values it had, so ranks stay distinct across groups.
    fn rank_anew(&mut self, group: &[u32], order: Order) {
        let part = self.part;
        let mut by = group.to_vec();
        part.sort_by(order, &mut by, |i| part.tightest(i, &self.remaining));
        let mut values: Vec<u32> = group.iter().map(|&i| self.rank[i as usize]).collect();
        values.sort_unstable();
        for (&i, r) in by.iter().zip(values) {
            if self.rank[i as usize] != r {
                self.log.push(Undo::Rank(i, self.rank[i as usize]));
                self.rank[i as usize] = r;
            }
        }
    }

    /// Places all of `group` (connected in time, sorted by start). On success the placements stay; on failure
    /// the state is as it was.
    fn solve(&mut self, group: &[u32], level: u64, last: u32) -> bool {
        let key = self.key(group, level, last);
        if self.failed.contains(&key) {
            return false;
        }
        let solved = self.branch(group, level, last);
        if !solved && !self.timed_out {
            if self.failed.len() >= MAX_REMEMBERED {
                self.failed.clear();
            }
            self.failed.insert(key);
        }
        solved
    }

    fn branch(&mut self, group: &[u32], level: u64, last: u32) -> bool {
        let part = self.part;
        // Dominance, then the level bound.
        let mut ceiling = u64::MAX;
        for &c in group {
            ceiling = ceiling.min(self.floor[c as usize] + part.size[c as usize]);
        }
        let (lo, hi) = span(part, group);
        let most = self.remaining[lo as usize..hi as usize].iter().copied().max().unwrap_or(0);
        match self.capacity.checked_sub(most) {
            Some(free) => ceiling = ceiling.min(free.saturating_add(1)),
            None => return false,
        }
        if !self.stranded_can_rise(group, level, last) {
            return false;
        }
        let mut candidates: Vec<u32> = group
            .iter()
            .copied()
            .filter(|&b| {
                let (f, twin) = (self.floor[b as usize], self.twin_before[b as usize]);
                f >= level
                    && f < ceiling
                    && (f > level || self.after(b, last))
                    && (twin == NONE || self.placed[twin as usize])
            })
            .collect();
        candidates.sort_unstable_by_key(|&b| (self.floor[b as usize], self.rank[b as usize]));
        for b in candidates {
            self.nodes += 1;
            if self.nodes >= self.node_limit
                || ((self.nodes % 64 == 0 || group.len() >= LARGE_GROUP) && Instant::now() >= self.deadline)
            {
                self.timed_out = true;
                return false;
            }
            let mark = self.log.len();
            let x = self.floor[b as usize];
            if self.place(b, x) {
                let rest: Vec<u32> = group.iter().copied().filter(|&c| !self.placed[c as usize]).collect();
                if rest.is_empty() || self.solve_all(rest, x, b) {
                    return true;
                }
            }
            self.undo_to(mark);
            if self.timed_out {
                return false;
            }
        }
        false
    }

    /// The stranded rule: a buffer that can no longer go at its floor (below the level, or at it but ranked
    /// before the last placed there) must in P rest on a neighbour placed later, low enough to cover the slot at
    /// its floor (dominance). False if some such buffer has no unplaced neighbour that can go that low.
    fn stranded_can_rise(&self, group: &[u32], level: u64, last: u32) -> bool {
        let part = self.part;
        group.iter().all(|&c| {
            let f = self.floor[c as usize];
            if f > level || (f == level && self.after(c, last)) {
                return true;
            }
            let slot_top = f + part.size[c as usize];
            part.neighbors[c as usize]
                .iter()
                .any(|&d| !self.placed[d as usize] && self.floor[d as usize].max(level) < slot_top)
        })
    }

    /// A 128-bit fingerprint of what `solve` depends on: the group's buffers and floors, the offsets of placed
    /// buffers that share a lifetime with one of them (the stacks rule), the level and the last buffer, which
    /// matter only while some floor is at or below the level, and under a re-ranking order the group's ranks,
    /// which then depend on the way the search came.
    fn key(&self, group: &[u32], level: u64, last: u32) -> u128 {
        let mut hash = Fingerprint::default();
        if group.iter().any(|&c| self.floor[c as usize] <= level) {
            hash.add(level);
            hash.add(if last == NONE { u64::MAX } else { self.rank[last as usize] as u64 });
        }
        for &c in group {
            hash.add(c as u64);
            hash.add(self.floor[c as usize]);
            if self.rerank.is_some() {
                hash.add(self.rank[c as usize] as u64);
            }
            for &p in &self.part.same_life[c as usize] {
                if self.placed[p as usize] {
                    hash.add(p as u64 | 1 << 63);
                    hash.add(self.floor[p as usize]);
                }
            }
        }
        hash.finish()
    }

    /// Places `b` at its floor `x`, raises its neighbours' floors, and places the neighbours left hatless.
    /// False if the branch cannot fit (the caller undoes).
    fn place(&mut self, b: u32, x: u64) -> bool {
        let part = self.part;
        let top = x + part.size[b as usize];
        let mut ok = top <= self.capacity && self.stack_ok(b, x);
        self.mark_placed(b);
        let mut moved = std::mem::take(&mut self.moved);
        moved.clear();
        moved.push((b, x));
        for &c in &part.neighbors[b as usize] {
            let c_ = c as usize;
            if !self.placed[c_] && self.floor[c_] < top {
                let (old, new) = (self.floor[c_], part.lift(c_, top));
                self.log.push(Undo::Floor(c, old));
                self.floor[c_] = new;
                moved.push((c, old));
                ok &= new + part.size[c_] <= self.capacity;
            }
        }
        self.refresh_lowest(&moved);
        self.moved = moved;
        if ok {
            for &c in &part.neighbors[b as usize] {
                if !self.placed[c as usize] && self.open[c as usize] == 0 {
                    ok &= self.place_hatless(c, x, b);
                }
            }
        }
        ok
    }

    /// Places a hatless buffer at its floor. False if it does not fit, or if P cannot have it there: it would
    /// come before (`level`, `last`) in placement order.
    fn place_hatless(&mut self, c: u32, level: u64, last: u32) -> bool {
        self.mark_placed(c);
        let f = self.floor[c as usize];
        self.refresh_lowest(&[(c, f)]);
        f + self.part.size[c as usize] <= self.capacity
            && (f > level || (f == level && self.after(c, last)))
            && self.stack_ok(c, f)
    }

    /// Whether `b` may follow `last` at the same level (`NONE`: nothing was placed at this level yet).
    fn after(&self, b: u32, last: u32) -> bool {
        last == NONE || self.rank[b as usize] > self.rank[last as usize]
    }

    /// False if `b` at `x` would rest right on a smaller placed buffer of the same lifetime (see **Stacks**).
    fn stack_ok(&self, b: u32, x: u64) -> bool {
        let part = self.part;
        let size = part.size[b as usize];
        part.same_life[b as usize].iter().all(|&p| {
            let p = p as usize;
            !(self.placed[p] && self.floor[p] + part.size[p] == x && part.size[p] < size)
        })
    }

    fn mark_placed(&mut self, b: u32) {
        self.depth += 1;
        self.deepest = self.deepest.max(self.depth);
        let part = self.part;
        let b_ = b as usize;
        self.placed[b_] = true;
        for s in part.lo[b_]..part.hi[b_] {
            self.remaining[s as usize] -= part.size[b_];
        }
        for &c in &part.neighbors[b_] {
            if !self.placed[c as usize] {
                self.open[c as usize] -= 1;
            }
        }
        self.log.push(Undo::Place(b));
    }

    fn undo_to(&mut self, mark: usize) {
        let part = self.part;
        while self.log.len() > mark {
            match self.log.pop().expect("above the mark") {
                Undo::Floor(c, f) => self.floor[c as usize] = f,
                Undo::Lowest(s, f, k) => {
                    self.lowest[s as usize] = f;
                    self.at_lowest[s as usize] = k;
                }
                Undo::Rank(i, r) => self.rank[i as usize] = r,
                Undo::Place(b) => {
                    self.depth -= 1;
                    let b_ = b as usize;
                    self.placed[b_] = false;
                    for s in part.lo[b_]..part.hi[b_] {
                        self.remaining[s as usize] += part.size[b_];
                    }
                    for &c in &part.neighbors[b_] {
                        if !self.placed[c as usize] {
                            self.open[c as usize] += 1;
                        }
                    }
                }
            }
        }
    }

    /// Buffers left their floors `old` (placed, or raised): in each section where one of them was at the
    /// lowest floor, the count at it drops, and when none is left the lowest floor is found again. Batched per
    /// placement, so that a section is logged and rescanned once however many of its buffers moved.
    fn refresh_lowest(&mut self, moved: &[(u32, u64)]) {
        let part = self.part;
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.seen.iter_mut().for_each(|v| *v = 0);
            self.stamp = 1;
        }
        self.dirty.clear();
        for &(c, old) in moved {
            let c = c as usize;
            for s in part.lo[c] as usize..part.hi[c] as usize {
                if self.lowest[s] == old {
                    if self.seen[s] != self.stamp {
                        self.seen[s] = self.stamp;
                        self.left[s] = 0;
                        self.dirty.push(s as u32);
                    }
                    self.left[s] += 1;
                }
            }
        }
        for k in 0..self.dirty.len() {
            let s = self.dirty[k];
            let s_ = s as usize;
            self.log.push(Undo::Lowest(s, self.lowest[s_], self.at_lowest[s_]));
            if self.left[s_] < self.at_lowest[s_] {
                self.at_lowest[s_] -= self.left[s_];
                continue;
            }
            let (mut lowest, mut count) = (u64::MAX, 0);
            for &i in &part.live[s_] {
                if !self.placed[i as usize] {
                    let f = self.floor[i as usize];
                    if f < lowest {
                        (lowest, count) = (f, 1);
                    } else if f == lowest {
                        count += 1;
                    }
                }
            }
            self.lowest[s_] = lowest;
            self.at_lowest[s_] = count;
        }
    }

    /// The sections rule over sections `lo..hi`. Records each section's slack.
    fn sections_fit(&mut self, lo: u32, hi: u32, level: u64) -> bool {
        for s in lo as usize..hi as usize {
            let remaining = self.remaining[s];
            if remaining == 0 {
                self.slack[s] = u64::MAX;
                continue;
            }
            let need = self.lowest[s].max(level) + remaining;
            if need > self.capacity {
                return false;
            }
            self.slack[s] = self.capacity - need;
        }
        true
    }
}

/// For each buffer, the buffer of the same lifetime and size ranked just before it, or `NONE`.
fn twin_before(part: &Component, rank: &[u32]) -> Vec<u32> {
    let mut by: Vec<u32> = (0..part.len() as u32).collect();
    by.sort_by_key(|&i| (part.lo[i as usize], part.hi[i as usize], part.size[i as usize], rank[i as usize]));
    let mut before = vec![NONE; part.len()];
    for pair in by.windows(2) {
        let (a, b) = (pair[0] as usize, pair[1] as usize);
        if (part.lo[a], part.hi[a], part.size[a]) == (part.lo[b], part.hi[b], part.size[b]) {
            before[b] = a as u32;
        }
    }
    before
}

/// The sections spanned by `buffers`.
fn span(part: &Component, buffers: &[u32]) -> (u32, u32) {
    let lo = buffers.iter().map(|&i| part.lo[i as usize]).min().unwrap_or(0);
    let hi = buffers.iter().map(|&i| part.hi[i as usize]).max().unwrap_or(0);
    (lo, hi)
}

/// Splits buffers sorted by start into groups connected in time.
fn split(part: &Component, sorted: Vec<u32>) -> Vec<Vec<u32>> {
    let mut groups: Vec<Vec<u32>> = Vec::new();
    let mut current: Vec<u32> = Vec::new();
    let mut reach = 0;
    for i in sorted {
        if !current.is_empty() && part.lo[i as usize] >= reach {
            groups.push(std::mem::take(&mut current));
        }
        reach = if current.is_empty() { part.hi[i as usize] } else { reach.max(part.hi[i as usize]) };
        current.push(i);
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// Two independent 64-bit streams over a sequence of words (splitmix64 finalisers with different seeds), so
/// that two different group states share a fingerprint with odds of about 2^-128 per pair.
#[derive(Default)]
struct Fingerprint(u64, u64);

impl Fingerprint {
    fn add(&mut self, word: u64) {
        self.0 = mix(self.0 ^ word, 0x9E37_79B9_7F4A_7C15);
        self.1 = mix(self.1.rotate_left(17) ^ word, 0xD1B5_4A32_D192_ED03);
    }

    fn finish(&self) -> u128 {
        (self.0 as u128) << 64 | self.1 as u128
    }
}

fn mix(x: u64, seed: u64) -> u64 {
    let mut z = x.wrapping_add(seed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
