//! The fast path's record of live blocks: a direct-mapped, lock-free table keyed by address.
//!
//! Each address hashes to one slot; no probing, so no tombstones and no resizing. An insert that
//! finds its slot taken returns false and the caller keeps that block in the (slower, lock-free)
//! overflow map instead. With the table much larger than the number of live small blocks, nearly
//! every alloc and free is one compare-and-swap here.
//!
//! A slot's key word is the block address (512-aligned, so its low bits are free) with a state in
//! the low bits: empty (0), being written, live, being removed, or parked. The key's Release store
//! after writing the metadata, and the Acquire CAS before reading it, order the metadata words.
//!
//! A removed block's slot stays *parked*: not live, but still holding the block's metadata, so
//! that when the same block is handed out again (from a thread cache) `revive` makes it live with
//! two plain stores, no compare-and-swap. Only the block's holder writes a parked slot (no insert
//! or removal can match it), and it must `unpark` the slot when the block goes back to its
//! strategy, which may split or merge it.

use crate::sync::{AtomicU64, Ordering};

const WRITING: u64 = 1;
const LIVE: u64 = 2;
const REMOVING: u64 = 3;
const PARKED: u64 = 4;
const STATE: u64 = 0b111;

/// What the pool records about a live block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    /// Below 2^48 (`sizes::MAX_REQUEST` keeps it there).
    pub size: u64,
    pub requested: u64,
    pub stream: u64,
    pub tier: u8,
    /// 1 + the size class the block is cached under when freed; 0 when it is not cached.
    pub class: u8,
}

impl LiveBlock {
    /// The size class the block is cached under when freed, if any.
    #[inline(always)]
    pub fn cache_index(&self) -> Option<usize> {
        usize::from(self.class).checked_sub(1)
    }
}

struct Slot {
    key: AtomicU64,
    /// size | class << 48 | tier << 56
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
    Refused(LiveBlock),
}

/// A table of `SLOTS` slots, a power of two. The size is a constant so that finding a slot
/// needs no load and no bounds check.
pub struct LiveTable<const SLOTS: usize> {
    slots: Box<[Slot; SLOTS]>,
}

impl<const SLOTS: usize> Default for LiveTable<SLOTS> {
    fn default() -> Self {
        let slots: Vec<Slot> = (0..SLOTS)
            .map(|_| Slot { key: AtomicU64::new(0), size_tier: AtomicU64::new(0), requested: AtomicU64::new(0), stream: AtomicU64::new(0) })
            .collect();
        let Ok(slots) = slots.into_boxed_slice().try_into() else { unreachable!("SLOTS slots were made") };
        Self { slots }
    }
}

impl<const SLOTS: usize> LiveTable<SLOTS> {
    const SHIFT: u32 = {
        assert!(SLOTS.is_power_of_two() && SLOTS > 1);
        64 - SLOTS.trailing_zeros()
    };

    fn slot(&self, addr: u64) -> &Slot {
        // Fibonacci hashing of the 512-byte granule number spreads neighbouring blocks.
        let index = ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> Self::SHIFT) as usize;
        &self.slots[index]
    }

    /// Records `addr` (512-aligned, non-zero); false when its slot is taken by another block.
    pub fn insert(&self, addr: u64, meta: LiveBlock) -> bool {
        debug_assert!(addr != 0 && addr & 511 == 0);
        let slot = self.slot(addr);
        if slot.key.compare_exchange(0, addr | WRITING, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        slot.size_tier.store(Self::size_tier(&meta), Ordering::Relaxed);
        slot.requested.store(meta.requested, Ordering::Relaxed);
        slot.stream.store(meta.stream, Ordering::Relaxed);
        slot.key.store(addr | LIVE, Ordering::Release);
        true
    }

    fn size_tier(meta: &LiveBlock) -> u64 {
        debug_assert!(meta.size < 1 << 48);
        meta.size | (meta.class as u64) << 48 | (meta.tier as u64) << 56
    }

    /// Whether `addr` could be a block's address. One with state bits set would match the key of
    /// the block just below it (`addr + 2 | LIVE == addr | LIVE`), and 0 would take an empty
    /// slot for a block being written and wait on it forever.
    fn may_be_key(addr: u64) -> bool {
        addr != 0 && addr & STATE == 0
    }

    fn read(slot: &Slot) -> LiveBlock {
        let size_tier = slot.size_tier.load(Ordering::Relaxed);
        LiveBlock {
            size: size_tier & ((1 << 48) - 1),
            class: (size_tier >> 48) as u8,
            tier: (size_tier >> 56) as u8,
            requested: slot.requested.load(Ordering::Relaxed),
            stream: slot.stream.load(Ordering::Relaxed),
        }
    }

    /// Takes `addr` out if `agree(meta)` agrees, leaving its slot parked (see the module doc).
    #[inline(always)]
    pub fn remove_if(&self, addr: u64, mut agree: impl FnMut(&LiveBlock) -> bool) -> Result<LiveBlock, Removal> {
        if !Self::may_be_key(addr) {
            return Err(Removal::Absent);
        }
        let slot = self.slot(addr);
        loop {
            match slot.key.compare_exchange(addr | LIVE, addr | REMOVING, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => {
                    let meta = Self::read(slot);
                    if agree(&meta) {
                        slot.key.store(addr | PARKED, Ordering::Release);
                        return Ok(meta);
                    }
                    slot.key.store(addr | LIVE, Ordering::Release);
                    return Err(Removal::Refused(meta));
                }
                // Another thread is between two steps on this very block (a racing free or a
                // refused one): wait the few instructions until it is done.
                Err(key) if key & !STATE == addr && matches!(key & STATE, WRITING | REMOVING) => std::hint::spin_loop(),
                Err(_) => return Err(Removal::Absent),
            }
            #[cfg(loom)]
            loom::thread::yield_now();
        }
    }

    /// Makes the block at `addr` live again if its slot is parked with the same size, tier and
    /// stream (it comes back from a cache); false otherwise (it was never in the table, or was
    /// unparked). The caller must hold the block: then nothing else writes this slot.
    #[inline(always)]
    pub fn revive(&self, addr: u64, meta: LiveBlock) -> bool {
        let slot = self.slot(addr);
        let parked = slot.key.load(Ordering::Relaxed) == addr | PARKED
            && slot.size_tier.load(Ordering::Relaxed) == Self::size_tier(&meta)
            && slot.stream.load(Ordering::Relaxed) == meta.stream;
        if !parked {
            return false;
        }
        slot.requested.store(meta.requested, Ordering::Relaxed);
        slot.key.store(addr | LIVE, Ordering::Release);
        true
    }

    /// The metadata of the parked block at `addr`, if it is parked. The caller must hold the
    /// block.
    pub fn parked(&self, addr: u64) -> Option<LiveBlock> {
        let slot = self.slot(addr);
        (slot.key.load(Ordering::Relaxed) == addr | PARKED).then(|| Self::read(slot))
    }

    /// Frees the slot of the parked block at `addr`, if it is parked. The caller must hold the
    /// block.
    pub fn unpark(&self, addr: u64) {
        let slot = self.slot(addr);
        if slot.key.load(Ordering::Relaxed) == addr | PARKED {
            slot.key.store(0, Ordering::Release);
        }
    }

    /// The metadata of `addr` if it is live here.
    pub fn get(&self, addr: u64) -> Option<LiveBlock> {
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
    pub fn iter(&self) -> impl Iterator<Item = (u64, LiveBlock)> + '_ {
        self.slots.iter().filter_map(|slot| {
            let key = slot.key.load(Ordering::Acquire);
            (key & STATE == LIVE).then(|| (key & !STATE, Self::read(slot)))
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn meta(size: u64) -> LiveBlock {
        LiveBlock { size, requested: size - 1, stream: 7, tier: 2, class: 3 }
    }

    #[test]
    fn insert_get_remove() {
        let table = LiveTable::<16>::default();
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
        let table = LiveTable::<16>::default();
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
    fn a_removed_block_stays_parked_until_revived_or_unparked() {
        let table = LiveTable::<2>::default();
        assert!(table.insert(512, meta(1024)));
        assert_eq!(table.remove_if(512, |_| true), Ok(meta(1024)));
        assert_eq!(table.get(512), None, "parked is not live");
        assert_eq!(table.iter().count(), 0);
        assert_eq!(table.remove_if(512, |_| true), Err(Removal::Absent), "a double free finds nothing (and does not spin)");
        // Another block whose slot is the parked one's must go elsewhere.
        let neighbour = (2..).map(|i| i * 512).find(|&a| std::ptr::eq(table.slot(a), table.slot(512))).unwrap();
        assert!(!table.insert(neighbour, meta(512)));
        // Only the same block, with the same size, tier and stream, comes back to life.
        assert!(!table.revive(512, LiveBlock { stream: 8, ..meta(1024) }));
        assert!(!table.revive(512, meta(2048)));
        assert!(table.revive(512, LiveBlock { requested: 600, ..meta(1024) }));
        assert_eq!(table.get(512), Some(LiveBlock { requested: 600, ..meta(1024) }));
        assert_eq!(table.remove_if(512, |_| true), Ok(LiveBlock { requested: 600, ..meta(1024) }));
        // Unparked, the slot is free for anyone, and the old block cannot be revived.
        table.unpark(512);
        assert!(!table.revive(512, meta(1024)));
        assert!(table.insert(neighbour, meta(512)));
        table.unpark(neighbour);
        assert_eq!(table.get(neighbour), Some(meta(512)), "unpark leaves a live block alone");
    }

    #[test]
    fn a_taken_slot_refuses_and_others_still_work() {
        let table = LiveTable::<2>::default();
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

    fn meta(size: u64) -> LiveBlock {
        LiveBlock { size, requested: size, stream: 1, tier: 0, class: 0 }
    }

    /// Two threads free the same block at once: exactly one succeeds, and sees whole metadata.
    #[test]
    fn racing_double_free_succeeds_once() {
        loom::model(|| {
            let table = Arc::new(LiveTable::<2>::default());
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
            let table = Arc::new(LiveTable::<2>::default());
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

    /// A block handed out again from a cache (revived) while another thread frees it twice: the
    /// double free finds it parked (nothing happens) or live again (and frees it, as a free
    /// after the new alloc would); never both, and never torn metadata.
    #[test]
    fn a_double_free_racing_a_revive_sees_the_block_parked_or_live() {
        loom::model(|| {
            let table = Arc::new(LiveTable::<2>::default());
            assert!(table.insert(512, meta(4096)));
            assert!(table.remove_if(512, |_| true).is_ok());
            let again = LiveBlock { requested: 100, ..meta(4096) };
            let double_free = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.remove_if(512, |_| true))
            };
            assert!(table.revive(512, again));
            match double_free.join().unwrap() {
                Ok(m) => {
                    assert_eq!(m, again);
                    assert_eq!(table.get(512), None);
                }
                Err(Removal::Absent) => assert_eq!(table.get(512), Some(again)),
                Err(Removal::Refused(_)) => unreachable!(),
            }
        });
    }

    /// A refused free (wrong size) racing a good one: the good one still succeeds.
    #[test]
    fn refused_free_does_not_lose_the_block() {
        loom::model(|| {
            let table = Arc::new(LiveTable::<2>::default());
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
