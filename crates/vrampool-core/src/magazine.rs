//! The lock-free fast path: per size class rings of freed blocks, sharded by thread, that alloc
//! pops and free pushes without taking a lock.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::ring::Ring;
use crate::sizes::{class_size, classes_up_to, exact_class_index, MIB};

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
        Self { classes: classes_up_to(max_size), shards: Default::default() }
    }

    /// The class index a block of real size `size` is cached under, if it is cacheable.
    pub fn class_of_block(&self, size: u64) -> Option<usize> {
        exact_class_index(size).filter(|&index| index < self.classes)
    }

    fn rings(&self, shard: usize) -> &[Ring] {
        self.shards[shard].get_or_init(|| {
            (0..self.classes)
                .map(|i| {
                    let class = class_size(i);
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn only_blocks_of_exactly_a_class_size_are_cached() {
        let magazines = Magazines::new(1 << 20);
        let index = magazines.class_of_block(4096).unwrap();
        assert_eq!(magazines.class_of_block(4096 + 512), None, "between two classes");
        assert_eq!(magazines.class_of_block(2 << 20), None, "above the largest class");
        assert!(magazines.push(index, 0x1000));
        assert_eq!(magazines.pop(index), Some(0x1000));
        assert_eq!(magazines.pop(index), None);
    }

    #[test]
    fn a_drain_takes_the_classes_it_wants_and_leaves_the_rest() {
        let magazines = Magazines::new(1 << 20);
        let (small, large) = (magazines.class_of_block(512).unwrap(), magazines.class_of_block(1 << 20).unwrap());
        assert!(magazines.push(small, 0x200) && magazines.push(large, 0x10_0000));
        let mut taken = Vec::new();
        magazines.drain(|index| index == large, |index, addr| taken.push((index, addr)));
        assert_eq!(taken, [(large, 0x10_0000)]);
        assert_eq!((magazines.pop(large), magazines.pop(small)), (None, Some(0x200)));
    }
}
