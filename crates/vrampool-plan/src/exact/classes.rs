//! Best fit decreasing on sizes rounded up to classes, for a large part whose sizes are ragged.
//!
//! Where many buffers are of nearly one size (log-uniform sizes, each a power of two plus up to 16 KiB, on the
//! random instances), best fit leaves a freed slot that the next buffer of that size misses by a few bytes, and
//! two buffers of an octave below miss it too. Rounded up to classes of a few significant bits
//! (`Instance::in_classes`), such buffers are interchangeable and classes an octave apart nest two in one, and
//! best fit decreasing packs like a buddy allocator without its waste: on the random instances of 30,000-60,000
//! buffers (seeds 1-12 and 42), at 1.003-1.053 of the bound on classes of 8 bits, 1.011 as the geometric mean,
//! against 1.000-1.134 and 1.054 on the sizes as given. The plan holds the sizes as given, and settles
//! (`floors/settle.rs`) most of the rounding back.
//!
//! It is a plan to lower beside the portfolio's, not a seed: as the arena the runs must beat, it stopped the
//! lowest floor runs that the squeaky wheel and the bands take below it (on random instances of 30,000
//! buffers, seeds 2 and 7, from the bound to 1.003-1.005). It is made before the runs, which may take the
//! part's time to its end.

use std::time::Instant;

use super::placed::{arena_of, Placed};
use crate::floors::settled;
use crate::greedy::best_fit_by_size_of;
use crate::instance::Instance;

/// Significant bits of the classes tried: at most 2^-8 and 2^-10 more bytes a buffer. On the random instances
/// 8 bits packs best on most seeds, 10 on those whose sizes' jitter is below its grain, 6 on none.
const CLASS_BITS: [u32; 2] = [8, 10];

/// The lowest plan of `part` by best fit decreasing on each of the classes that merge sizes, settled, if one is
/// done before `deadline`. Best fit decreasing's spatial order alone (larger first): on the classes its
/// temporal order (longer-lived first) packs at 1.04-1.07 of the bound where the spatial one reaches
/// 1.005-1.015 (random instances of 45,000 and 60,000 buffers), and it takes as long again. Unsettled where
/// `settle` is false (the ablation's).
pub(crate) fn best_fit_in_classes(inst: &Instance, part: &[u32], deadline: Instant, settle: bool) -> Option<Placed> {
    CLASS_BITS
        .iter()
        .filter_map(|&bits| {
            if Instant::now() >= deadline {
                return None;
            }
            let offsets = best_fit_by_size_of(&inst.in_classes(bits)?, part, Some(deadline))?;
            let plan = if settle {
                settled(inst, part, &offsets)
            } else {
                part.iter().map(|&i| (i, offsets[i as usize])).collect()
            };
            let arena = arena_of(inst, &plan);
            Some((plan, arena))
        })
        .min_by_key(|p| p.1)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::exact::checked;
    use crate::greedy::best_fit_decreasing_until;
    use crate::{random_instance, validate};

    #[test]
    fn on_ragged_sizes_the_classes_pack_far_below_best_fit_on_the_sizes_as_given() {
        let buffers = random_instance(6_000, 13);
        let inst = Instance::new(&buffers, 1).unwrap();
        let part: Vec<u32> = (0..inst.len() as u32).collect();
        let (plan, arena) = best_fit_in_classes(&inst, &part, Instant::now() + Duration::from_secs(60), true).unwrap();
        assert_eq!(checked(&buffers, &plan).1, arena);
        let as_given = validate(&buffers, &best_fit_decreasing_until(&inst, None).unwrap(), 1).unwrap();
        let bound = inst.lower_bound() as f64;
        let (ours, theirs) = (arena as f64 / bound, as_given as f64 / bound);
        assert!(ours < 1.01 && theirs > 1.05, "classes {ours:.4}, as given {theirs:.4}");
        // With no time, nothing.
        assert!(best_fit_in_classes(&inst, &part, Instant::now(), true).is_none());
    }
}
