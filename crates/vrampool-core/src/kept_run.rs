//! One slot for the first tier's kept run (see `PoolConfig::first_tier_cached_max`): set under
//! that tier's lock, taken by a lock-free hit of the run's class or by the tier's next operation.

use crate::sizes::MIN_BLOCK;
use crate::sync::{AtomicU64, Ordering};

/// An empty slot (no run's class index is 0: the 512 B class shares its slabs).
const EMPTY: u64 = 0;

/// The run's address, with its class index in the low bits (addresses are multiples of 512 B).
pub struct KeptRun(AtomicU64);

impl Default for KeptRun {
    fn default() -> Self {
        Self(AtomicU64::new(EMPTY))
    }
}

impl KeptRun {
    /// Keeps the run at `addr`, of class `index` (1..512). Called once `take` emptied the slot,
    /// under the lock that every `keep` and `take` holds.
    pub fn keep(&self, addr: u64, index: usize) {
        debug_assert!(index > 0 && (index as u64) < MIN_BLOCK && addr % MIN_BLOCK == 0, "a run's class and address");
        self.0.store(addr | index as u64, Ordering::Release);
    }

    /// The kept run, if it is of class `index`; no lock needed.
    pub fn take_of(&self, index: usize) -> Option<u64> {
        let word = self.0.load(Ordering::Relaxed);
        let ours = word != EMPTY && word % MIN_BLOCK == index as u64;
        (ours && self.0.compare_exchange(word, EMPTY, Ordering::Acquire, Ordering::Relaxed).is_ok()).then(|| word - index as u64)
    }

    /// The kept run of any class, emptying the slot.
    pub fn take(&self) -> Option<u64> {
        // A plain load first: no locked swap on the tier's every operation when nothing is kept.
        if self.0.load(Ordering::Relaxed) == EMPTY {
            return None;
        }
        let word = self.0.swap(EMPTY, Ordering::Acquire);
        (word != EMPTY).then_some(word - word % MIN_BLOCK)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_taken_once_and_only_by_its_class() {
        let slot = KeptRun::default();
        assert_eq!((slot.take(), slot.take_of(3)), (None, None));
        slot.keep(0, 3);
        assert_eq!(slot.take_of(4), None, "another class");
        assert_eq!(slot.take_of(3), Some(0), "address 0 is a run like any other");
        assert_eq!(slot.take_of(3), None);
        slot.keep(7 * MIN_BLOCK, 511);
        assert_eq!(slot.take(), Some(7 * MIN_BLOCK));
        assert_eq!(slot.take(), None);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two hits of the run's class and the tier's own take race: exactly one gets the run.
    #[test]
    fn a_kept_run_goes_to_exactly_one_taker() {
        loom::model(|| {
            let slot = Arc::new(KeptRun::default());
            slot.keep(4 * MIN_BLOCK, 9);
            let hits: Vec<_> = (0..2)
                .map(|_| {
                    let slot = Arc::clone(&slot);
                    thread::spawn(move || slot.take_of(9))
                })
                .collect();
            let mut got: Vec<u64> = slot.take().into_iter().collect();
            got.extend(hits.into_iter().filter_map(|h| h.join().unwrap()));
            assert_eq!(got, vec![4 * MIN_BLOCK]);
        });
    }
}
