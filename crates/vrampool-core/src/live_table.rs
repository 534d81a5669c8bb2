//! The fast path's record of live blocks: a direct-mapped, lock-free table keyed by address.
//!
//! Each address hashes to one slot; no probing, so no tombstones and no resizing. An insert that
//! finds its slot taken returns false and the caller keeps that block in the (slower, lock-free)
//! overflow map instead. With the table much larger than the number of live small blocks, nearly
//! every alloc and free is one compare-and-swap here.
//!
//! A slot's key word is the block address (512-aligned, so its low bits are free) with a state in
//! the low bits: empty (0), being written, live, or being removed. The key's Release store after
//! writing the metadata, and the Acquire CAS before reading it, order the metadata words.

use crate::sync::{AtomicU64, Ordering};

const WRITING: u64 = 1;
const LIVE: u64 = 2;
const REMOVING: u64 = 3;
const STATE: u64 = 0b11;

/// What the pool records about a live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockMeta {
    pub size: u64,
    pub requested: u64,
    pub stream: u64,
    pub tier: u8,
}

struct Slot {
    key: AtomicU64,
    /// size | tier << 56
    size_tier: AtomicU64,
    requested: AtomicU64,
    stream: AtomicU64,
}

/// Why `remove_if` did not remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Not in the table (it may be in the overflow map).
    Absent,
    /// In the table, but the predicate refused: nothing changed.
    Refused(BlockMeta),
}

pub struct LiveTable {
    shift: u32,
    slots: Box<[Slot]>,
}

impl LiveTable {
    /// A table of 2^`bits` slots.
    pub fn new(bits: u32) -> Self {
        let slots = (0..1usize << bits)
            .map(|_| Slot {
                key: AtomicU64::new(0),
                size_tier: AtomicU64::new(0),
                requested: AtomicU64::new(0),
                stream: AtomicU64::new(0),
            })
            .collect();
        Self { shift: 64 - bits, slots }
    }

    fn slot(&self, addr: u64) -> &Slot {
        // Fibonacci hashing of the 512-byte granule number spreads neighbouring blocks.
        let index = ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize;
        &self.slots[index]
    }

    /// Records `addr` (512-aligned, non-zero); false when its slot is taken by another block.
    pub fn insert(&self, addr: u64, meta: BlockMeta) -> bool {
        debug_assert!(addr != 0 && addr & 511 == 0);
        let slot = self.slot(addr);
        if slot.key.compare_exchange(0, addr | WRITING, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        slot.size_tier.store(meta.size | (meta.tier as u64) << 56, Ordering::Relaxed);
        slot.requested.store(meta.requested, Ordering::Relaxed);
        slot.stream.store(meta.stream, Ordering::Relaxed);
        slot.key.store(addr | LIVE, Ordering::Release);
        true
    }

    /// Whether `addr` could be a block's address. One with state bits set would match the key of
    /// the block just below it (`addr + 2 | LIVE == addr | LIVE`), and 0 would take an empty
    /// slot for a block being written and wait on it forever.
    fn may_be_key(addr: u64) -> bool {
        addr != 0 && addr & STATE == 0
    }

    fn read(slot: &Slot) -> BlockMeta {
        let size_tier = slot.size_tier.load(Ordering::Relaxed);
        BlockMeta {
            size: size_tier & ((1 << 56) - 1),
            tier: (size_tier >> 56) as u8,
            requested: slot.requested.load(Ordering::Relaxed),
            stream: slot.stream.load(Ordering::Relaxed),
        }
    }

    /// Takes `addr` out if `keep_going(meta)` agrees.
    pub fn remove_if(&self, addr: u64, mut agree: impl FnMut(&BlockMeta) -> bool) -> Result<BlockMeta, Removal> {
        if !Self::may_be_key(addr) {
            return Err(Removal::Absent);
        }
        let slot = self.slot(addr);
        loop {
            match slot.key.compare_exchange(addr | LIVE, addr | REMOVING, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => {
                    let meta = Self::read(slot);
                    if agree(&meta) {
                        slot.key.store(0, Ordering::Release);
                        return Ok(meta);
                    }
                    slot.key.store(addr | LIVE, Ordering::Release);
                    return Err(Removal::Refused(meta));
                }
                // Another thread is between two steps on this very block (a racing free or a
                // refused one): wait the few instructions until it is done.
                Err(key) if key & !STATE == addr && key & STATE != LIVE => std::hint::spin_loop(),
                Err(_) => return Err(Removal::Absent),
            }
            #[cfg(loom)]
            loom::thread::yield_now();
        }
    }

    /// The metadata of `addr` if it is live here.
    pub fn get(&self, addr: u64) -> Option<BlockMeta> {
        if !Self::may_be_key(addr) {
            return None;
        }
        let slot = self.slot(addr);
        if slot.key.load(Ordering::Acquire) != addr | LIVE {
            return None;
        }
        let meta = Self::read(slot);
        // Checked again: the block was not freed (and the slot reused) while we read.
        (slot.key.load(Ordering::Acquire) == addr | LIVE).then_some(meta)
    }

    /// Every live block (a snapshot; blocks allocated or freed meanwhile may or may not show).
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockMeta)> + '_ {
        self.slots.iter().filter_map(|slot| {
            let key = slot.key.load(Ordering::Acquire);
            (key & STATE == LIVE).then(|| (key & !STATE, Self::read(slot)))
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn meta(size: u64) -> BlockMeta {
        BlockMeta { size, requested: size - 1, stream: 7, tier: 2 }
    }

    #[test]
    fn insert_get_remove() {
        let table = LiveTable::new(4);
        assert!(table.insert(512, meta(1024)));
        assert_eq!(table.get(512), Some(meta(1024)));
        assert_eq!(table.get(1024), None);
        assert_eq!(table.remove_if(512, |m| m.size == 4), Err(Removal::Refused(meta(1024))));
        assert_eq!(table.remove_if(512, |_| true), Ok(meta(1024)));
        assert_eq!(table.remove_if(512, |_| true), Err(Removal::Absent), "a second removal finds nothing");
        assert_eq!(table.iter().count(), 0);
    }

    #[test]
    fn an_address_inside_a_block_is_not_the_block() {
        let table = LiveTable::new(4);
        assert!(table.insert(512, meta(1024)));
        assert_eq!(table.remove_if(0, |_| true), Err(Removal::Absent), "null is never live (and does not hang)");
        assert_eq!(table.get(0), None);
        for inside in [513, 514, 515, 516, 1000] {
            assert_eq!(table.get(inside), None, "{inside}");
            assert_eq!(table.remove_if(inside, |_| true), Err(Removal::Absent), "{inside}");
        }
        assert_eq!(table.get(512), Some(meta(1024)));
    }

    #[test]
    fn a_taken_slot_refuses_and_others_still_work() {
        let table = LiveTable::new(1);
        let addrs: Vec<u64> = (1..=16).map(|i| i * 512).collect();
        let inserted: Vec<u64> = addrs.iter().copied().filter(|&a| table.insert(a, meta(512))).collect();
        assert_eq!(inserted.len(), 2, "two slots, two blocks");
        for &a in &addrs {
            assert_eq!(table.get(a).is_some(), inserted.contains(&a));
        }
        let mut live: Vec<u64> = table.iter().map(|(a, _)| a).collect();
        live.sort();
        assert_eq!(live, inserted);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn meta(size: u64) -> BlockMeta {
        BlockMeta { size, requested: size, stream: 1, tier: 0 }
    }

    /// Two threads free the same block at once: exactly one succeeds, and sees whole metadata.
    #[test]
    fn racing_double_free_succeeds_once() {
        loom::model(|| {
            let table = Arc::new(LiveTable::new(1));
            assert!(table.insert(512, meta(4096)));
            let other = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.remove_if(512, |_| true))
            };
            let mine = table.remove_if(512, |_| true);
            let theirs = other.join().unwrap();
            assert_eq!(mine.is_ok() as u8 + theirs.is_ok() as u8, 1);
            assert_eq!(mine.or(theirs), Ok(meta(4096)));
        });
    }

    /// An insert published on one thread is read whole by a free on another.
    #[test]
    fn insert_then_free_across_threads() {
        loom::model(|| {
            let table = Arc::new(LiveTable::new(1));
            let writer = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.insert(1024, meta(2048)))
            };
            let seen = table.remove_if(1024, |_| true);
            assert!(writer.join().unwrap());
            match seen {
                Ok(m) => assert_eq!(m, meta(2048)),
                Err(Removal::Absent) => assert_eq!(table.remove_if(1024, |_| true), Ok(meta(2048))),
                Err(Removal::Refused(_)) => unreachable!(),
            }
        });
    }

    /// A refused free (wrong size) racing a good one: the good one still succeeds.
    #[test]
    fn refused_free_does_not_lose_the_block() {
        loom::model(|| {
            let table = Arc::new(LiveTable::new(1));
            assert!(table.insert(512, meta(512)));
            let wrong = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.remove_if(512, |m| m.size == 1))
            };
            assert_eq!(table.remove_if(512, |m| m.size == 512), Ok(meta(512)));
            assert!(wrong.join().unwrap().is_err());
        });
    }
}
