//! The squeaky wheel for lowest floor first: run again with the buffers that ended highest placed first.
//!
//! On the random instances a run's arena is set by buffers that end above the lower bound, most of them small
//! and long-lived: lowest floor first takes a buffer when its floor, the highest top over its lifetime, is the
//! lowest left, so one that lives long comes late, over a skyline raised somewhere in its life, and the
//! holes it leaves below are never filled (every buffer that could use them has a floor at least as high).
//! Promoted (placed before the rest), such buffers go low and others take the top. Each run promotes a random
//! quarter of the buffers above the bound in the best plan so far, besides those promoted for that plan, and is
//! kept where it beats it; the wheel stops after `patience` runs in a row that do not. The coin is seeded, so
//! a part gets the same plan every time.

use std::time::Instant;

use crate::floors::lowest_floor_first_promoting;
use crate::instance::Instance;
use crate::order::Order;
use crate::rng::SplitMix64;

/// Runs in a row that do not beat the best before the wheel stops, where it starts from a floor run's plan.
pub(crate) const PATIENCE: usize = 8;
/// Each run promotes about one in this many of the buffers above the bound: a half, a quarter and an eighth
/// came out alike (seeds 1-6 of the random instance at 30k, 45k and 60k buffers: 1.0144, 1.0137 and 1.0140
/// of the bound, geometric mean), so the middle one.
const PROMOTE_ONE_IN: u64 = 4;

/// A plan of `part` better than `plan` (offsets parallel to `part`, arena `arena`), by lowest floor first with
/// `order`, and its arena, if the squeaky wheel finds one within `patience` runs in a row before `deadline`; it
/// stops early at `target`.
pub(crate) fn squeaky_wheel(
    inst: &Instance,
    part: &[u32],
    order: Order,
    (plan, arena): (Vec<u64>, u64),
    (target, patience): (u64, usize),
    deadline: Instant,
) -> Option<(Vec<u64>, u64)> {
    let top = |offsets: &[u64], p: usize| offsets[p] + inst.size[part[p] as usize];
    let mut coin = SplitMix64(0x5EED);
    let (mut best, mut promoted) = ((plan, arena), vec![false; part.len()]);
    let (mut improved, mut misses) = (false, 0);
    while misses < patience && best.1 > target && Instant::now() < deadline {
        let mut trial = promoted.clone();
        for p in (0..part.len()).filter(|&p| top(&best.0, p) > target) {
            trial[p] |= coin.below(PROMOTE_ONE_IN) == 0;
        }
        match lowest_floor_first_promoting(inst, part, order, &trial, best.1 - 1, deadline) {
            Some(offsets) => {
                let arena = (0..part.len()).map(|p| top(&offsets, p)).max().unwrap_or(0);
                (best, promoted, improved, misses) = ((offsets, arena), trial, true, 0);
            }
            None => misses += 1,
        }
    }
    improved.then_some(best)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::floors::lowest_floor_first;
    use crate::{random_instance, validate};

    #[test]
    fn the_squeaky_wheel_beats_the_run_it_starts_from_and_keeps_to_its_deadline() {
        // Found by trying seeds: the run with Taw ends above the bound, and the wheel takes it down to the bound.
        let buffers = random_instance(300, 6);
        let far = Instant::now() + Duration::from_secs(60);
        let (inst, part) = (Instance::new(&buffers, 1).unwrap(), (0..buffers.len() as u32).collect::<Vec<_>>());
        let plan = lowest_floor_first(&inst, &part, Order::Taw, u64::MAX, far).unwrap();
        let (arena, bound) = (validate(&buffers, &plan, 1).unwrap(), inst.lower_bound());
        assert!(arena > bound);
        let wheel =
            |deadline| squeaky_wheel(&inst, &part, Order::Taw, (plan.clone(), arena), (bound, PATIENCE), deadline);
        let (better, better_arena) = wheel(far).expect("a better plan");
        assert_eq!(validate(&buffers, &better, 1).unwrap(), better_arena);
        assert_eq!(better_arena, bound);
        assert_eq!(wheel(far), Some((better, better_arena)), "the same plan every time");
        assert_eq!(wheel(Instant::now()), None);
        // A plan at the target is kept as it is.
        assert_eq!(squeaky_wheel(&inst, &part, Order::Taw, (plan.clone(), arena), (arena, PATIENCE), far), None);
    }
}
