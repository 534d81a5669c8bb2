//! One stream's memory: a strategy instance per tier, each behind its own lock, and the lock-free
//! magazines of cached small blocks in front of them.
//!
//! Blocks belong to the stream they were allocated on and go back to that stream's arena, so a
//! block freed on a stream is reusable at once on that stream and on no other (PyTorch's
//! per-stream pools). Memory moves between streams only as whole segments given back to the device.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::device::StreamId;
use crate::magazine::Ring;
use crate::sizes::{size_class_index, size_class_of, MIB};
use crate::strategy::Strategy;

/// Threads spread over this many magazine shards, so that two threads freeing and allocating the
/// same size class touch different rings.
const SHARDS: usize = 8;
/// Each magazine ring holds about this many bytes of blocks (at least two blocks).
const MAGAZINE_BYTES: u64 = MIB;
const MAGAZINE_MAX_DEPTH: u64 = 64;

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
        let top = size_class_of(max_size);
        let classes = size_class_index(top) + usize::from(top == max_size);
        Self { classes, shards: Default::default() }
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

    /// Takes every cached block out, calling `f(addr)` for each.
    pub fn drain(&self, mut f: impl FnMut(u64)) {
        for rings in self.shards.iter().filter_map(OnceLock::get) {
            for ring in rings.iter() {
                while let Some(addr) = ring.pop() {
                    f(addr);
                }
            }
        }
    }
}

pub struct Arena {
    pub stream: StreamId,
    pub tiers: Box<[Mutex<Box<dyn Strategy>>]>,
    pub magazines: Magazines,
}

impl Arena {
    pub fn new(stream: StreamId, tiers: Vec<Box<dyn Strategy>>, cache_max: u64) -> Self {
        Self { stream, tiers: tiers.into_iter().map(Mutex::new).collect(), magazines: Magazines::new(cache_max) }
    }
}
