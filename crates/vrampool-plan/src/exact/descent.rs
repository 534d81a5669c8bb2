//! The descent stage: many short searches below a small part's best plan, for parts whose optimum lies
//! above the bound (`minimise.rs` gives it its share of the nodes).

use std::time::Instant;

use super::component::Component;
use super::jitter::{jitter, SWAPS};
use super::probe::MINIMALLOC_ORDERS;
use super::search::{fits, Outcome, Ranking};

/// Nodes the bound's prober gets for each node of the descent, at least and at most.
pub(crate) const BOUND_SHARE: u64 = 1;
pub(crate) const MAX_BOUND_SHARE: u64 = 16;

/// Node limit of the descent's shortest tries; Luby's sequence multiplies it.
const TRY_NODES: u64 = 1_000;
/// Tries in a row that time out before the descent moves its next capacity halfway up towards the best plan.
const PATIENCE: u32 = 12;

/// Many short searches (tries) below the best plan, each under its own order and node limit: at each new capacity,
/// first each of the round robin's orders, then jittered copies (`jitter`) of MiniMalloc's three, the one that has
/// fitted most often first (`Descent::base`). A fixed order that fails at one capacity may fit the next at once: on
/// MiniMalloc's instances with one buffer in twenty left out, where the jittered tries stall a unit or more above the
/// bound, the plans come closer to it on 11 of 48 and fall back on 2 (BENCHMARKS.md); MiniMalloc's D pays for the fixed
/// orders' nodes with a plan 5 units higher. A try that times out proves nothing, but on D, where no fixed order fits a
/// few percent above the optimum in seconds, one jittered try in five fits within thousands of nodes. (Jittering all
/// seven orders in turn left D 17 units higher in 5 s: the other orders rarely fit there.) The capacity tried starts
/// halfway between the bound and the best plan, and moves halfway up only after `PATIENCE` jittered misses in a row, so
/// that a few unlucky tries do not rule out a range for good. Node limits follow Luby's sequence, so that now and then
/// a try runs long enough to prove its capacity infeasible.
pub(crate) struct Descent {
    /// Jittered tries so far.
    turn: u64,
    /// The capacity of the last try, and how many of the fixed orders have been tried at it.
    at: u64,
    fixed: usize,
    /// Steps of `unit` below the best plan's next lower capacity.
    gap: u64,
    misses: u32,
    /// Tries that timed out since the last that fitted.
    since_fit: u32,
    /// Jittered tries of each of MiniMalloc's orders, and how many fitted.
    tries: [u32; MINIMALLOC_ORDERS],
    fitted: [u32; MINIMALLOC_ORDERS],
}

impl Descent {
    pub(crate) fn new() -> Descent {
        Descent {
            turn: 0,
            at: 0,
            fixed: 0,
            gap: u64::MAX,
            misses: 0,
            since_fit: 0,
            tries: [0; MINIMALLOC_ORDERS],
            fitted: [0; MINIMALLOC_ORDERS],
        }
    }

    /// The order to jitter next: the one whose jittered tries have fitted most often, counting one fit and
    /// one miss before any try, so that each is tried and one that keeps missing gives way. Which order fits
    /// best differs from instance to instance (on MiniMalloc's D, jittered TWA fits most often, and taking
    /// the three in turn left D 7 units higher in 5 s).
    fn base(&self) -> usize {
        let score = |b: usize| (self.fitted[b] as u64 + 1) * 1_000_000 / (self.tries[b] as u64 + 2);
        (0..MINIMALLOC_ORDERS).max_by_key(|&b| (score(b), std::cmp::Reverse(b))).expect("three orders")
    }

    /// Nodes the bound's prober gets for each node of the descent: one more for each `PATIENCE` tries that
    /// timed out since the last fit. A descent that keeps missing is stalled in the band above the optimum,
    /// where the prober may still fit the bound; on MiniMalloc's A and B, whose optimum is the bound, `plan`
    /// then reaches it in about three quarters of the time, and D, whose optimum lies above it, ends a unit
    /// or two higher (BENCHMARKS.md).
    pub(crate) fn share(&self) -> u64 {
        (BOUND_SHARE + u64::from(self.since_fit / PATIENCE)).min(MAX_BOUND_SHARE)
    }

    /// The capacity to try next, if one lies above `floor` (the capacity the bound's prober asks about).
    pub(crate) fn capacity(&mut self, unit: u64, best: u64, floor: u64) -> Option<u64> {
        let high = (best - 1) / unit * unit;
        if high <= floor {
            return None;
        }
        self.gap = self.gap.min((high - floor) / unit / 2);
        Some(high - self.gap * unit)
    }

    pub(crate) fn try_at(
        &mut self,
        part: &Component,
        orders: &[Ranking],
        capacity: u64,
        deadline: Instant,
        nodes: &mut u64,
    ) -> Outcome {
        if capacity != self.at {
            (self.at, self.fixed) = (capacity, 0);
        }
        let jittered = self.fixed == orders.len();
        let outcome = if let Some(ranking) = orders.get(self.fixed) {
            self.fixed += 1;
            let limit = nodes.saturating_add(TRY_NODES.saturating_mul(luby(self.fixed as u64)));
            fits(part, ranking, capacity, deadline, nodes, limit)
        } else {
            self.turn += 1;
            // Numbered after the fixed orders, so that the first jittered tries are those of a descent that tried
            // the fixed orders once.
            let index = orders.len() as u64 + self.turn;
            let b = self.base();
            let ranking = Ranking { rank: jitter(&orders[b].rank, index, SWAPS), rerank: None };
            let limit = nodes.saturating_add(TRY_NODES.saturating_mul(luby(index)));
            let outcome = fits(part, &ranking, capacity, deadline, nodes, limit);
            self.tries[b] += 1;
            self.fitted[b] += u32::from(matches!(outcome, Outcome::Fits(_)));
            outcome
        };
        match outcome {
            // A fixed order that misses says nothing of the jittered ones: it is not counted a miss.
            Outcome::TimedOut if !jittered => {}
            Outcome::TimedOut => {
                self.misses += 1;
                self.since_fit += 1;
                if self.misses == PATIENCE {
                    (self.gap, self.misses) = (self.gap / 2, 0);
                }
            }
            Outcome::Fits(_) => (self.misses, self.since_fit) = (0, 0),
            Outcome::Infeasible => self.misses = 0,
        }
        outcome
    }
}

/// Luby's restart sequence: 1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8, ... (`i` from 1).
fn luby(mut i: u64) -> u64 {
    loop {
        // The smallest k with i <= 2^k - 1.
        let k = 64 - i.leading_zeros() as u64;
        if i == (1 << k) - 1 {
            return 1 << (k - 1);
        }
        i -= (1 << (k - 1)) - 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::exact::probe::orders;
    use crate::instance::Instance;

    #[test]
    fn the_descent_jitters_the_order_that_fits_most_often() {
        let mut descent = Descent::new();
        assert_eq!(descent.base(), 0, "untried, the first");
        descent.tries = [6, 0, 0];
        assert_eq!(descent.base(), 1, "an untried order before one that missed six times");
        descent.tries = [6, 6, 6];
        descent.fitted = [1, 0, 3];
        assert_eq!(descent.base(), 2);
        descent.tries = [6, 6, 40];
        assert_eq!(descent.base(), 0, "one that keeps missing gives way");
    }

    /// A square of 1 MiB cut into 200 rectangles, as one part (so a plan at 1 MiB exists).
    fn square() -> Component {
        let inst = Instance::new(&crate::packed_instance(200, 1024, 1024, 0, 3), 1).unwrap();
        Component::new(&inst, &(0..inst.len() as u32).collect::<Vec<_>>())
    }

    #[test]
    fn a_descent_that_keeps_missing_yields_nodes_to_the_bound() {
        let part = square();
        let orders = orders(&part);
        let mut descent = Descent::new();
        assert_eq!(descent.share(), BOUND_SHARE);
        let (past, later) = (Instant::now(), Instant::now() + Duration::from_secs(60));
        for _ in 0..orders.len() + 3 * PATIENCE as usize - 1 {
            assert!(matches!(descent.try_at(&part, &orders, 1 << 20, past, &mut 0), Outcome::TimedOut));
        }
        assert_eq!(descent.share(), BOUND_SHARE + 2, "one more node for each PATIENCE misses");
        descent.since_fit = 1_000 * PATIENCE;
        assert_eq!(descent.share(), MAX_BOUND_SHARE);
        assert!(matches!(descent.try_at(&part, &orders, part.load() - 1, later, &mut 0), Outcome::Infeasible));
        assert_eq!(descent.share(), MAX_BOUND_SHARE, "a proof is no fit");
        assert!(matches!(descent.try_at(&part, &orders, u64::MAX / 2, later, &mut 0), Outcome::Fits(_)));
        assert_eq!(descent.share(), BOUND_SHARE, "a fit gives the descent its half back");
    }

    #[test]
    fn each_new_capacity_gets_the_fixed_orders_first() {
        let part = square();
        let orders = orders(&part);
        let mut descent = Descent::new();
        let past = Instant::now();
        for k in 1..=orders.len() {
            descent.try_at(&part, &orders, 1 << 20, past, &mut 0);
            assert_eq!((descent.fixed, descent.turn, descent.misses), (k, 0, 0), "fixed orders, not misses");
        }
        descent.try_at(&part, &orders, 1 << 20, past, &mut 0);
        assert_eq!((descent.fixed, descent.turn, descent.misses), (orders.len(), 1, 1), "then a jittered try");
        assert_eq!(descent.tries.iter().sum::<u32>(), 1);
        descent.try_at(&part, &orders, (1 << 20) + 1024, past, &mut 0);
        assert_eq!((descent.fixed, descent.turn), (1, 1), "a new capacity starts the fixed orders anew");
        descent.try_at(&part, &orders, (1 << 20) + 1024, past, &mut 0);
        assert_eq!((descent.fixed, descent.turn, descent.misses), (2, 1, 1));
    }

    #[test]
    fn luby_sequence_starts_as_published() {
        let first: Vec<u64> = (1..=15).map(luby).collect();
        assert_eq!(first, [1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8]);
    }
}
