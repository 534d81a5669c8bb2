//! A value that one thread, its owner, uses on its fast path without a read-modify-write, and
//! that any other thread can take over for a moment, even from an owner that never calls again:
//! how a trim reaches the blocks cached by an idle thread.
//!
//! The owner marks the cell `held`, then (after the light barrier) checks that no thief
//! `claimed` it; a thief claims it, issues the heavy barrier, then waits until the cell is not
//! held. The barrier pair (`barrier`) rules out both missing each other's mark, so the two never
//! use the value at once. The owner never waits: a claimed cell sends it to its slow path. A
//! thief waits only for an owner inside its section, which is short and makes no call.

use std::mem::ManuallyDrop;

use crate::barrier;
use crate::sync::{
    spin_once, AtomicBool, MutPtr,
    Ordering::{Acquire, Relaxed, Release},
    UnsafeCell,
};

pub struct StealCell<T> {
    held: AtomicBool,
    claimed: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached by one thread at a time, its owner inside a section or a thief
// that claimed it (see the module doc), each handing it on with a Release that the next Acquires.
unsafe impl<T: Send> Sync for StealCell<T> {}

/// The owner's section: the cell is held while this lives, and let go when it goes (even by a
/// panic, so that a thief never waits for a section that ended).
pub struct Owned<'a, T> {
    cell: &'a StealCell<T>,
    value: ManuallyDrop<MutPtr<T>>,
}

impl<T> std::ops::Deref for Owned<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the section makes this the only access to the value (see `StealCell::own`).
        unsafe { MutPtr::deref(&self.value) }
    }
}

impl<T> std::ops::DerefMut for Owned<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`.
        unsafe { MutPtr::deref(&self.value) }
    }
}

impl<T> Drop for Owned<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: dropped once, here; the access ends before the cell is let go.
        unsafe { ManuallyDrop::drop(&mut self.value) };
        self.cell.held.store(false, Release);
    }
}

impl<T> StealCell<T> {
    pub fn new(value: T) -> Self {
        Self { held: AtomicBool::new(false), claimed: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// The value, as its owner, until the guard goes; None while a thief has it.
    ///
    /// # Safety
    ///
    /// Only the owner, one thread, calls this (or `own_waiting`), and only while it holds no
    /// guard of this cell.
    #[inline(always)]
    pub unsafe fn own(&self) -> Option<Owned<'_, T>> {
        self.held.store(true, Relaxed);
        barrier::light();
        if self.claimed.load(Acquire) {
            self.held.store(false, Release);
            return None;
        }
        // Held, and not claimed after the barrier: no thief touches the value until the guard
        // lets the cell go (module doc); the caller makes the guard the only one.
        Some(Owned { cell: self, value: ManuallyDrop::new(self.value.get_mut()) })
    }

    /// As `own`, waiting for a thief to be done: for an owner that must have the value (a thread
    /// giving its cache back as it exits).
    ///
    /// # Safety
    ///
    /// As for `own`.
    pub unsafe fn own_waiting(&self) -> Owned<'_, T> {
        loop {
            // SAFETY: the caller's promise.
            if let Some(owned) = unsafe { self.own() } {
                return owned;
            }
            spin_once();
        }
    }
}

/// Takes each cell in `cells` over from its owner in turn and runs `f` on its value; one heavy
/// barrier serves them all. A cell that another thief holds is left to it. `all_mine` says that
/// the calling thread owns every cell (and is outside their sections): then no barrier is
/// needed. False when the barrier could not be made: then no value was touched.
pub fn steal_each<'a, T: 'a>(cells: impl IntoIterator<Item = &'a StealCell<T>>, all_mine: bool, mut f: impl FnMut(&mut T)) -> bool {
    let claimed: Vec<&StealCell<T>> =
        cells.into_iter().filter(|c| c.claimed.compare_exchange(false, true, Acquire, Relaxed).is_ok()).collect();
    let ok = all_mine || claimed.is_empty() || barrier::heavy();
    for cell in claimed {
        if ok {
            while cell.held.load(Acquire) {
                spin_once();
            }
            // SAFETY: claimed, and (after the barrier) not held: the owner's sections stay out
            // until the claim is let go below.
            cell.value.with_mut(|value| f(unsafe { &mut *value }));
        }
        cell.claimed.store(false, Release);
    }
    ok
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// An owner that keeps adding to its cell while thieves keep emptying it: every value comes
    /// out exactly once (a section refused while a thief has the cell keeps its value).
    #[test]
    fn thieves_and_a_busy_owner_lose_and_duplicate_nothing() {
        const N: u64 = 200_000;
        let cell = Arc::new(StealCell::new(Vec::<u64>::new()));
        let stolen = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let thieves: Vec<_> = (0..3)
            .map(|_| {
                let (cell, stolen, done) = (Arc::clone(&cell), Arc::clone(&stolen), Arc::clone(&done));
                std::thread::spawn(move || {
                    let mut sum = 0;
                    while !done.load(Acquire) {
                        assert!(steal_each([&*cell], false, |v| sum += v.drain(..).sum::<u64>()));
                    }
                    stolen.fetch_add(sum, Relaxed);
                })
            })
            .collect();
        let mut kept = 0u64;
        for i in 1..=N {
            // SAFETY: this thread is the cell's only owner, and sections do not nest.
            if let Some(mut v) = unsafe { cell.own() } {
                v.push(i);
            } else {
                kept += i;
            }
        }
        done.store(true, Release);
        thieves.into_iter().for_each(|t| t.join().unwrap());
        // SAFETY: as above.
        let left: u64 = unsafe { cell.own_waiting() }.iter().sum();
        assert_eq!(stolen.load(Relaxed) + left + kept, N * (N + 1) / 2);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// The owner pushes two values, each in its own section, while a thief empties the cell:
    /// loom checks that the two never use the value at once (its `UnsafeCell` tracks every
    /// access) and that each value ends up in exactly one place.
    #[test]
    fn a_thief_and_the_owner_never_use_the_value_at_once() {
        loom::model(|| {
            let cell = Arc::new(StealCell::new(Vec::<u64>::new()));
            let thief = {
                let cell = Arc::clone(&cell);
                thread::spawn(move || {
                    let mut got = Vec::new();
                    assert!(steal_each([&*cell], false, |v| got.append(v)));
                    got
                })
            };
            let mut refused = Vec::new();
            for value in [1, 2] {
                // SAFETY: this thread is the only owner, and sections do not nest.
                if let Some(mut v) = unsafe { cell.own() } {
                    v.push(value);
                } else {
                    refused.push(value);
                }
            }
            let mut all = thief.join().unwrap();
            all.extend(refused);
            // SAFETY: as above.
            all.append(&mut *unsafe { cell.own_waiting() });
            all.sort_unstable();
            assert_eq!(all, vec![1, 2]);
        });
    }

    /// Two thieves at once: one claims the cell, the other leaves it to the first; the value is
    /// taken once.
    #[test]
    fn two_thieves_take_the_value_once() {
        loom::model(|| {
            let cell = Arc::new(StealCell::new(vec![7u64]));
            let other = {
                let cell = Arc::clone(&cell);
                thread::spawn(move || {
                    let mut got = Vec::new();
                    steal_each([&*cell], false, |v| got.append(v));
                    got
                })
            };
            let mut mine = Vec::new();
            steal_each([&*cell], false, |v| mine.append(v));
            mine.extend(other.join().unwrap());
            // SAFETY: this thread is the only owner.
            mine.append(&mut *unsafe { cell.own_waiting() });
            assert_eq!(mine, vec![7]);
        });
    }
}
