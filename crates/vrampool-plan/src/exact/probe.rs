//! MiniMalloc's round robin at one capacity: its three orders (WAT, TAW, TWA) and other orders take turns,
//! each search stopped at a node limit that doubles after every round. A search with one order can stall for
//! long in a bad early choice that another order avoids; the round robin pays at most a constant factor over
//! the best order for the instance, without knowing which that is. Each search is complete, so one that ends
//! without a plan proves that none fits.
//!
//! Each round then runs every order once more with its ranks jittered anew (`jitter.rs`, seeded by the round):
//! where all the fixed orders stall in the same early choices, a few neighbouring ranks swapped lead another
//! way, and a new draw each round keeps the tries from repeating (randomised restarts). On squares cut into
//! rectangles (`packed_instance`, 90 of them at 1 MiB, 5 s each) the jittered turns raised the decided from
//! 53 to 59; on MiniMalloc's A-F, which fixed orders decide, A, B and D take about twice as long to decide
//! and E a third as long (BENCHMARKS.md).
//!
//! The shares are not equal: the turns whose last search placed the most buffers at once get several times
//! the round's limit in the next (`deepest_boost.rs`). A search that stalls at the top of its tree gives way to
//! the one that got furthest, and every turn still runs each round with a limit that doubles, so the round
//! robin stays complete and keeps its bound over the best order.

use std::time::Instant;

use super::component::Component;
use super::deepest_boost::{deepest_boost, DEEPEST_BOOST};
use super::jitter::{jitter, SWAPS};
use super::search::{fits_reaching, Outcome, Ranking};
use crate::order::Order;
use crate::trace::{Stage, Stages};

/// The orders of every round, in turn: MiniMalloc's three with their ranks kept for the whole search; TWA and
/// TAW ranked anew at each decomposition, as MiniMalloc's own search does; then larger area first, and
/// earlier start first. Each stalls on instances that another solves at once, which is the point of taking
/// turns: the fixed and the re-ranked TWA differ on MiniMalloc's challenging set, and earliest start first
/// decides at once many squares cut into rectangles (`packed_instance`) on which the others stall.
const ORDERS: [(Order, bool); 7] = [
    (Order::Wat, false),
    (Order::Taw, false),
    (Order::Twa, false),
    (Order::Twa, true),
    (Order::Taw, true),
    (Order::Area, false),
    (Order::Time, false),
];

/// MiniMalloc's three fixed orders lead `ORDERS`.
pub(crate) const MINIMALLOC_ORDERS: usize = 3;

/// The rankings of a part under `ORDERS`.
pub(crate) fn orders(part: &Component) -> Vec<Ranking> {
    ORDERS
        .iter()
        .map(|&(order, rerank)| if rerank { Ranking::reranked(part, order) } else { Ranking::fixed(part, order) })
        .collect()
}

/// The round robin's state at one capacity.
pub(crate) struct Prober {
    pub capacity: u64,
    limit: u64,
    /// The next search's place in the round: the fixed orders, then their jittered copies.
    turn: usize,
    /// Rounds done.
    pub rounds: u64,
    /// The most buffers each turn's last search placed at once (empty until the first turn).
    deepest: Vec<usize>,
    /// Turns in a round: the fixed orders, and their jittered copies where `Stage::Jitter` runs.
    copies: usize,
    boost: u64,
}

impl Prober {
    /// The first round's node limit is twice the part's buffers, as MiniMalloc's.
    pub fn new(part: &Component, capacity: u64, stages: Stages) -> Prober {
        let copies = if stages.has(Stage::Jitter) { 2 } else { 1 };
        let boost = if stages.has(Stage::DeepestBoost) { DEEPEST_BOOST } else { 1 };
        Prober { capacity, limit: 2 * part.len().max(1) as u64, turn: 0, rounds: 0, deepest: Vec::new(), copies, boost }
    }

    /// One search, under the next order in turn: a fixed one, or a jittered copy of one.
    pub fn step(&mut self, part: &Component, orders: &[Ranking], deadline: Instant, nodes: &mut u64) -> Outcome {
        let n = orders.len();
        self.deepest.resize(self.copies * n, 0);
        let boost = deepest_boost(&self.deepest, self.turn, self.boost);
        let limit = nodes.saturating_add(self.limit.saturating_mul(boost));
        let (outcome, deepest) = match orders.get(self.turn) {
            Some(ranking) => fits_reaching(part, ranking, self.capacity, deadline, nodes, limit),
            None => {
                let base = &orders[self.turn - n];
                let seed = self.rounds * n as u64 + (self.turn - n) as u64;
                let jittered = Ranking { rank: jitter(&base.rank, seed, SWAPS), rerank: base.rerank };
                fits_reaching(part, &jittered, self.capacity, deadline, nodes, limit)
            }
        };
        self.deepest[self.turn] = deepest;
        self.turn += 1;
        if self.turn == self.copies * n {
            self.turn = 0;
            self.rounds += 1;
            self.limit = self.limit.saturating_mul(2);
        }
        outcome
    }

    /// Searches until a verdict or `deadline`.
    pub fn run(&mut self, part: &Component, orders: &[Ranking], deadline: Instant, nodes: &mut u64) -> Outcome {
        loop {
            match self.step(part, orders, deadline, nodes) {
                Outcome::TimedOut if Instant::now() < deadline => {}
                outcome => return outcome,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::exact::search::fits;
    use crate::instance::Instance;
    use crate::Buffer;

    /// The least capacity at which `ranking`'s search, run to the end, finds a plan.
    fn least_fit(part: &Component, ranking: &Ranking) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        (part.load()..)
            .find(|&capacity| match fits(part, ranking, capacity, deadline, &mut 0, u64::MAX) {
                Outcome::Fits(_) => true,
                Outcome::Infeasible => false,
                Outcome::TimedOut => panic!("no verdict in a minute"),
            })
            .expect("some capacity fits")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Each search is complete whatever its order: with the ranks kept or ranked anew at each
        /// decomposition, every order finds the same optimum. (A rule that pruned the least plan's branch
        /// under one order would show as a larger optimum there.)
        #[test]
        fn every_order_finds_the_same_optimum(
            rows in prop::collection::vec((0u64..16, 1u64..7, 1u64..=32), 1..=11)
        ) {
            let buffers: Vec<Buffer> = rows
                .into_iter()
                .enumerate()
                .map(|(id, (lower, length, size))| Buffer::new(id as u64, lower, lower + length, size))
                .collect();
            let inst = Instance::new(&buffers, 1).unwrap();
            let part = Component::new(&inst, &(0..inst.len() as u32).collect::<Vec<_>>());
            let optima: Vec<u64> = orders(&part).iter().map(|r| least_fit(&part, r)).collect();
            prop_assert!(optima.windows(2).all(|w| w[0] == w[1]), "{optima:?}");
        }
    }

    /// Nodes the fixed orders' round robin (without the jittered turns) takes to a verdict, if it gets one
    /// within `budget` nodes.
    fn fixed_orders_alone(part: &Component, orders: &[Ranking], capacity: u64, budget: u64) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut nodes, mut limit) = (0, 2 * part.len() as u64);
        while nodes < budget {
            for ranking in orders {
                let until = (nodes + limit).min(budget);
                if !matches!(fits(part, ranking, capacity, deadline, &mut nodes, until), Outcome::TimedOut) {
                    return Some(nodes);
                }
            }
            limit *= 2;
        }
        None
    }

    #[test]
    fn the_jittered_turns_decide_a_square_on_which_the_fixed_orders_stall() {
        // 80 rectangles cut from a square of 64 by 64 units of 16 bytes: it fits at its side, 1,024 bytes.
        let buffers = crate::packed_instance(80, 64, 16, 0, 26);
        let inst = Instance::new(&buffers, 1).unwrap();
        let part = Component::new(&inst, &(0..inst.len() as u32).collect::<Vec<_>>());
        let orders = orders(&part);
        let budget = 20_000;
        let mut prober = Prober::new(&part, 1_024, Stages::ALL);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut nodes = 0;
        let plan = loop {
            assert!(nodes < budget, "no plan in {nodes} nodes");
            if let Outcome::Fits(plan) = prober.step(&part, &orders, deadline, &mut nodes) {
                break plan;
            }
        };
        let mut offsets = vec![0; inst.len()];
        crate::exact::component::write_part(&mut offsets, &part.members, plan.into_iter());
        assert!(crate::validate(&buffers, &offsets, 1).unwrap() <= 1_024);
        assert_eq!(fixed_orders_alone(&part, &orders, 1_024, budget), None, "the fixed orders decide it too");
    }

    #[test]
    fn the_turns_that_placed_the_most_buffers_get_more_nodes_next_round() {
        // A square with one rectangle in ten left out that no turn decides within its first two rounds.
        let buffers = crate::packed_instance(240, 1024, 1024, 10, 100);
        let inst = Instance::new(&buffers, 1).unwrap();
        let part = Component::new(&inst, &(0..inst.len() as u32).collect::<Vec<_>>());
        let orders = orders(&part);
        let turns = 2 * orders.len();
        let mut prober = Prober::new(&part, 1 << 20, Stages::ALL);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut nodes = 0;
        let limit = 2 * part.len() as u64;
        let mut boosted = 0;
        for step in 0..2 * turns {
            let deepest = prober.deepest.clone();
            let before = nodes;
            assert!(matches!(prober.step(&part, &orders, deadline, &mut nodes), Outcome::TimedOut));
            let (turn, round) = (step % turns, step / turns);
            let boost = deepest_boost(&deepest, turn, DEEPEST_BOOST);
            boosted += usize::from(boost > 1);
            assert_eq!(nodes - before, (limit << round) * boost, "step {step}, deepest before it {deepest:?}");
        }
        assert!((1..turns).contains(&boosted), "{boosted} of the second round's {turns} turns boosted");
    }
}
