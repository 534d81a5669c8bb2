//! One stream's memory: a strategy instance per tier, each behind its own lock, and the lock-free
//! magazines of cached blocks in front of them.
//!
//! Blocks belong to the stream they were allocated on and go back to that stream's arena, so a
//! block freed on a stream is reusable at once on that stream and on no other (PyTorch's
//! per-stream pools). Memory moves between streams only as whole segments given back to the device.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::{AcqRel, Relaxed, Release}};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::device::StreamId;
use crate::magazine::Ring;
use crate::sizes::{classes_up_to, size_class_index, size_class_of, MIB};
use crate::strategy::Strategy;

/// Threads spread over this many magazine shards, so that two threads freeing and allocating the
/// same size class touch different rings.
const SHARDS: usize = 8;
/// Each magazine ring holds about this many bytes of blocks (at least two blocks).
const MAGAZINE_BYTES: u64 = MIB;
const MAGAZINE_MAX_DEPTH: u64 = 64;
/// Blocks up to this size are cached, in every tier: a training loop asks for the same sizes each
/// step, and a cached block comes back without the tier's lock. Larger blocks are rare enough
/// that the lock costs nothing beside their use.
pub const CACHED_MAX: u64 = 1 << 30;

fn shard_of_this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SHARD: usize = NEXT.fetch_add(1, Relaxed) % SHARDS);
    SHARD.with(|s| *s)
}

/// Per size class rings of freed blocks whose real size is exactly the class size.
pub struct Magazines {
    classes: usize,
    shards: [OnceLock<Box<[Ring]>>; SHARDS],
}

impl Magazines {
    /// Magazines for the size classes of at most `max_size` bytes.
    pub fn new(max_size: u64) -> Self {
        Self { classes: classes_up_to(max_size), shards: Default::default() }
    }

    /// The class index a block of real size `size` is cached under, if it is cacheable.
    pub fn class_of_block(&self, size: u64) -> Option<usize> {
        let class = size_class_of(size);
        let index = size_class_index(class);
        (class == size && index < self.classes).then_some(index)
    }

    fn rings(&self, shard: usize) -> &[Ring] {
        self.shards[shard].get_or_init(|| {
            (0..self.classes)
                .map(|i| {
                    let class = crate::sizes::class_size(i);
                    Ring::new((MAGAZINE_BYTES / class).clamp(2, MAGAZINE_MAX_DEPTH) as usize)
                })
                .collect()
        })
    }

    /// A cached block of class `index`: this thread's shard first, then the others.
    pub fn pop(&self, index: usize) -> Option<u64> {
        let home = shard_of_this_thread();
        (0..SHARDS).map(|i| (home + i) % SHARDS).find_map(|s| self.shards[s].get()?[index].pop())
    }

    /// Caches a block of class `index`; false when this thread's ring is full.
    pub fn push(&self, index: usize, addr: u64) -> bool {
        self.rings(shard_of_this_thread())[index].push(addr)
    }

    /// Takes out every cached block of the classes `wanted` selects, calling `f(index, addr)` for
    /// each.
    pub fn drain(&self, wanted: impl Fn(usize) -> bool, mut f: impl FnMut(usize, u64)) {
        for rings in self.shards.iter().filter_map(OnceLock::get) {
            for (index, ring) in rings.iter().enumerate().filter(|&(index, _)| wanted(index)) {
                while let Some(addr) = ring.pop() {
                    f(index, addr);
                }
            }
        }
    }
}

pub struct Arena {
    pub stream: StreamId,
    pub tiers: Box<[Mutex<Box<dyn Strategy>>]>,
    pub magazines: Magazines,
    /// Per tier: the magazines may hold some of its large blocks (set after a push, cleared by
    /// the drain that files them back), so that a tier with none skips the scan.
    large_cached: Box<[AtomicBool]>,
}

impl Arena {
    pub fn new(stream: StreamId, tiers: Vec<Box<dyn Strategy>>) -> Self {
        let large_cached = tiers.iter().map(|_| AtomicBool::new(false)).collect();
        Self { stream, tiers: tiers.into_iter().map(Mutex::new).collect(), magazines: Magazines::new(CACHED_MAX), large_cached }
    }

    /// Notes that a large block of `tier` was just cached (after the push). The mark is a hint:
    /// a block pushed while another thread drains may be missed by both, and then stays cached
    /// until a hit, a trim or a growth takes it; never lost.
    pub fn note_large_cached(&self, tier: u8) {
        let mark = &self.large_cached[tier as usize];
        // A plain load first: the line stays shared while the mark is already set.
        if !mark.load(Relaxed) {
            mark.store(true, Release);
        }
    }

    /// Clears the mark of `tier`; true if it was set (some large blocks may be cached).
    pub fn take_large_cached(&self, tier: u8) -> bool {
        self.large_cached[tier as usize].swap(false, AcqRel)
    }
}
