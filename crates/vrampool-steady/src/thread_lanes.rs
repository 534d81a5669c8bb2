//! Threads whose iterations interleave get an arena each. One planned pool follows one sequence of
//! calls: two threads that repeat their steps at once (two training loops, a thread per stream)
//! interleave theirs into a sequence that never repeats, so neither was ever served. Once a
//! recording shows threads taking turns call by call (not a hand-over, as PyTorch's autograd thread
//! takes a step's backward from the thread that ran its forward, a few times an iteration), a
//! steady mode gives each thread a lane: a planned pool of its own over the same upstream, which
//! records, plans and serves that thread's sequence alone, with no lock or line shared with the
//! others on its serving path.
//!
//! A thread's lane is its number (in the order threads first ask) modulo [`LANES`]; lane 0 is the
//! mode's own planned pool, so a thread alone keeps its arena. Frees go to the lane whose arena
//! holds the address, whichever thread frees it; any other free to the freeing thread's lane.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Lanes of a steady mode, its own planned pool included.
pub(crate) const LANES: usize = 8;

/// A recording shows threads interleaving where they took turns at least this many times, and
/// each freed its own buffers (one free of another thread's buffer in `SWITCHES_PER_CROSS_FREE`
/// switches at most).
const INTERLEAVED_SWITCHES: u32 = 16;
const SWITCHES_PER_CROSS_FREE: u32 = 16;

const UNNUMBERED: u32 = u32::MAX;

thread_local! {
    static NUMBER: Cell<u32> = const { Cell::new(UNNUMBERED) };
}

/// The calling thread's number: threads are numbered from 0 in the order they first ask (a thread
/// that is exiting counts as 0).
#[inline(always)]
pub(crate) fn thread_number() -> u32 {
    NUMBER
        .try_with(|number| {
            let n = number.get();
            if n != UNNUMBERED {
                return n;
            }
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Relaxed) % UNNUMBERED;
            number.set(n);
            n
        })
        .unwrap_or(0)
}

/// The calling thread's lane.
#[inline(always)]
pub(crate) fn lane() -> usize {
    thread_number() as usize % LANES
}

/// Which threads made a recording's events, as far as telling a hand-over from interleaving goes:
/// threads that hand an iteration over free what the other allocated (PyTorch's backward frees the
/// forward's activations); threads running loops of their own take turns and free only their own.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Threads {
    last: Option<u32>,
    switches: u32,
    cross_frees: u32,
}

impl Threads {
    /// An event made by the calling thread.
    pub fn note(&mut self) {
        let thread = thread_number();
        if self.last.is_some_and(|last| last != thread) {
            self.switches += 1;
        }
        self.last = Some(thread);
    }

    /// A free, by the calling thread, of a buffer that thread `by` allocated.
    pub fn freed(&mut self, by: u32) {
        if by != thread_number() {
            self.cross_frees += 1;
        }
    }

    /// Whether the threads ran loops of their own, interleaved.
    pub fn interleaved(&self) -> bool {
        self.switches >= INTERLEAVED_SWITCHES && self.cross_frees * SWITCHES_PER_CROSS_FREE <= self.switches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_number_and_others_get_their_own() {
        let mine = thread_number();
        assert_eq!(thread_number(), mine);
        let theirs: Vec<u32> = (0..3).map(|_| std::thread::spawn(thread_number).join().unwrap()).collect();
        assert!(theirs.iter().all(|&n| n != mine));
        assert!(theirs.windows(2).all(|w| w[0] != w[1]));
        assert_eq!(lane(), mine as usize % LANES);
    }

    /// `threads` after `events` events of a new thread, each an allocation freed by that thread, or
    /// by another where `freer_is_other`.
    fn run(threads: &mut Threads, events: usize, freer_is_other: bool) {
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..events {
                    threads.note();
                    threads.freed(if freer_is_other { thread_number() + 1 } else { thread_number() });
                }
            });
        });
    }

    #[test]
    fn loops_of_their_own_interleave_and_a_hand_over_does_not() {
        let mut one = Threads::default();
        (0..1000).for_each(|_| {
            one.note();
            one.freed(thread_number());
        });
        assert!(!one.interleaved(), "one thread");
        // Turns, each thread freeing its own: interleaved once there are enough of them.
        let mut turns = Threads::default();
        (0..INTERLEAVED_SWITCHES).for_each(|_| run(&mut turns, 5, false));
        assert_eq!(turns.switches, INTERLEAVED_SWITCHES - 1);
        assert!(!turns.interleaved());
        run(&mut turns, 5, false);
        assert!(turns.interleaved());
        // Turns in which one frees what the other allocated: a hand-over, however often.
        let mut hand_over = Threads::default();
        (0..64).for_each(|_| run(&mut hand_over, 5, true));
        assert!(!hand_over.interleaved());
    }
}
