//! A bounded lock-free ring of block addresses, which the magazines keep one of per size class.
//!
//! The ring is Dmitry Vyukov's bounded multi-producer multi-consumer queue: every slot carries a
//! sequence number that says whose turn it is, so a slot is written by exactly one producer and
//! read by exactly one consumer per lap, with no ABA problem and no `unsafe`.

use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// Keeps the producer and consumer counters on separate cache lines.
#[repr(align(128))]
struct CachePadded<T>(T);

struct Slot {
    /// `pos` when free for the producer at `pos`; `pos + 1` when filled for the consumer at `pos`.
    seq: AtomicUsize,
    value: AtomicU64,
}

/// A bounded lock-free MPMC queue of block addresses.
pub struct Ring {
    mask: usize,
    slots: Box<[Slot]>,
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
}

impl Ring {
    /// A ring of at least `capacity` (rounded up to a power of two, at least 2) entries.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2).next_power_of_two();
        let slots = (0..capacity).map(|i| Slot { seq: AtomicUsize::new(i), value: AtomicU64::new(0) }).collect();
        Self { mask: capacity - 1, slots, head: CachePadded(AtomicUsize::new(0)), tail: CachePadded(AtomicUsize::new(0)) }
    }

    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Adds `value`; false when the ring is full (the caller takes the slow path).
    pub fn push(&self, value: u64) -> bool {
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            match (seq as isize).wrapping_sub(pos as isize) {
                0 => match self.tail.0.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        slot.value.store(value, Ordering::Relaxed);
                        // Release publishes the value to the consumer that acquires this seq.
                        slot.seq.store(pos + 1, Ordering::Release);
                        return true;
                    }
                    Err(current) => pos = current,
                },
                d if d < 0 => return false,
                _ => pos = self.tail.0.load(Ordering::Relaxed),
            }
        }
    }

    /// Takes the oldest value, or None when the ring is empty.
    pub fn pop(&self) -> Option<u64> {
        let mut pos = self.head.0.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            match (seq as isize).wrapping_sub(pos.wrapping_add(1) as isize) {
                0 => match self.head.0.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        let value = slot.value.load(Ordering::Relaxed);
                        // Hands the slot to the producer one lap ahead.
                        slot.seq.store(pos + self.mask + 1, Ordering::Release);
                        return Some(value);
                    }
                    Err(current) => pos = current,
                },
                d if d < 0 => return None,
                _ => pos = self.head.0.load(Ordering::Relaxed),
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn fifo_until_full_then_refuses() {
        let ring = Ring::new(3);
        assert_eq!(ring.capacity(), 4);
        for v in 1..=4 {
            assert!(ring.push(v));
        }
        assert!(!ring.push(5));
        assert_eq!(ring.pop(), Some(1));
        assert!(ring.push(5));
        assert_eq!((2..=5).map(|_| ring.pop().unwrap()).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        assert_eq!(ring.pop(), None);
    }

    #[test]
    fn many_threads_lose_and_duplicate_nothing() {
        let ring = Arc::new(Ring::new(64));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let ring = Arc::clone(&ring);
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for i in 0..20_000u64 {
                        let mut value = t << 32 | i;
                        // Push, spilling to `got` when full; pop about as often as we push.
                        if !ring.push(value) {
                            got.push(value);
                        }
                        if let Some(v) = ring.pop() {
                            value = v;
                            got.push(value);
                        }
                    }
                    got
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for v in t.join().unwrap() {
                assert!(seen.insert(v), "value {v:#x} came out twice");
            }
        }
        while let Some(v) = ring.pop() {
            assert!(seen.insert(v), "value {v:#x} came out twice");
        }
        assert_eq!(seen.len(), 4 * 20_000);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two producers and a consumer race on a ring of two slots: every value comes out once.
    #[test]
    fn concurrent_push_pop_is_linearizable() {
        loom::model(|| {
            let ring = Arc::new(Ring::new(2));
            let producers: Vec<_> = (1..=2u64)
                .map(|v| {
                    let ring = Arc::clone(&ring);
                    thread::spawn(move || ring.push(v))
                })
                .collect();
            let consumed = ring.pop();
            let pushed: Vec<bool> = producers.into_iter().map(|p| p.join().unwrap()).collect();
            assert!(pushed.iter().all(|&ok| ok), "a ring of two takes two values");
            let mut out: Vec<u64> = consumed.into_iter().collect();
            while let Some(v) = ring.pop() {
                out.push(v);
            }
            out.sort_unstable();
            assert_eq!(out, vec![1, 2]);
        });
    }

    /// A full ring refuses a push while a consumer frees a slot, without losing a value.
    #[test]
    fn full_ring_and_concurrent_pop() {
        loom::model(|| {
            let ring = Arc::new(Ring::new(2));
            assert!(ring.push(1) && ring.push(2));
            let consumer = {
                let ring = Arc::clone(&ring);
                thread::spawn(move || ring.pop())
            };
            let pushed = ring.push(3);
            let popped = consumer.join().unwrap();
            assert_eq!(popped, Some(1));
            let mut out = vec![];
            while let Some(v) = ring.pop() {
                out.push(v);
            }
            let expected: Vec<u64> = if pushed { vec![2, 3] } else { vec![2] };
            assert_eq!(out, expected);
        });
    }

    /// Two consumers race for one value: exactly one gets it.
    #[test]
    fn one_value_two_consumers() {
        loom::model(|| {
            let ring = Arc::new(Ring::new(2));
            ring.push(7);
            let other = {
                let ring = Arc::clone(&ring);
                thread::spawn(move || ring.pop())
            };
            let mine = ring.pop();
            let theirs = other.join().unwrap();
            assert_eq!(mine.is_some() as u8 + theirs.is_some() as u8, 1);
            assert_eq!(mine.or(theirs), Some(7));
        });
    }
}
