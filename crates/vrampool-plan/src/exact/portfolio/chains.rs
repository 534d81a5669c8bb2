//! Chains of buffers that replace one another: a buffer takes the place of a smaller one that ends at most
//! `HANDOVER` segments after it starts (a KV cache grown by concatenation: the larger one is made, the old one
//! copied into it and freed). Best fit by start that places the chains' members before the rest stacks the
//! caches before the short-lived buffers fragment the bytes where they grow (serving with continuous
//! batching).

use crate::instance::Instance;

/// The most segments a successor may overlap its predecessor (a copy: make, make, free, free).
const HANDOVER: u32 = 4;

/// A successor is larger than its predecessor, by at most this factor.
const SIZE_FACTOR: u64 = 2;

/// The part's chains of two buffers or more, each in order of start, a buffer in one chain only. In order of
/// start, a buffer follows the first-ending buffer of the part that has no successor yet, started before it,
/// ends at most `HANDOVER` segments after it starts, and is smaller (by at most `SIZE_FACTOR`).
pub(crate) fn chains(timeline: &Instance, part: &[u32]) -> Vec<Vec<u32>> {
    let mut by_start = part.to_vec();
    by_start.sort_unstable_by_key(|&i| (timeline.lo[i as usize], i));
    let mut ending = part.to_vec();
    ending.sort_unstable_by_key(|&i| (timeline.hi[i as usize], i));
    let grows = |from: u64, to: u64| from < to && from.saturating_mul(SIZE_FACTOR) >= to;
    // Per instance index: the chain the buffer is in, and whether it has a successor.
    let (mut chain_of, mut followed) = (vec![usize::MAX; timeline.len()], vec![false; timeline.len()]);
    let mut members: Vec<Vec<u32>> = Vec::new();
    for &j in &by_start {
        let (lo, size) = (timeline.lo[j as usize], timeline.size[j as usize]);
        let from = ending.partition_point(|&p| timeline.hi[p as usize] < lo);
        let predecessor =
            ending[from..].iter().take_while(|&&p| timeline.hi[p as usize] <= lo + HANDOVER).find(|&&p| {
                let p = p as usize;
                timeline.lo[p] < lo && !followed[p] && grows(timeline.size[p], size)
            });
        let Some(&p) = predecessor else { continue };
        followed[p as usize] = true;
        if chain_of[p as usize] == usize::MAX {
            chain_of[p as usize] = members.len();
            members.push(vec![p]);
        }
        chain_of[j as usize] = chain_of[p as usize];
        members[chain_of[p as usize]].push(j);
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Buffer;

    #[test]
    fn a_grown_cache_follows_its_predecessor_and_strangers_stay_out() {
        let buffers = [
            Buffer::new(0, 0, 10, 100),   // k
            Buffer::new(1, 1, 11, 100),   // v
            Buffer::new(2, 7, 20, 120),   // k grown: made at 7, k freed at 10
            Buffer::new(3, 8, 21, 120),   // v grown
            Buffer::new(4, 18, 30, 150),  // k grown again
            Buffer::new(5, 9, 12, 1_000), // too large to follow anyone
            Buffer::new(6, 2, 4, 100),    // ends too early for 2 and 3
            Buffer::new(7, 3, 25, 300),   // too large to follow 6
            Buffer::new(8, 30, 40, 160),  // starts as 4 ends
        ];
        let inst = Instance::new(&buffers, 1).unwrap();
        let part: Vec<u32> = (0..buffers.len() as u32).collect();
        let mut found = chains(&inst, &part);
        found.sort();
        assert_eq!(found, vec![vec![0, 2, 4, 8], vec![1, 3]]);
    }

    #[test]
    fn every_link_of_a_decoding_step_s_chains_is_a_handover_to_a_larger_buffer() {
        let buffers = crate::llm_decoding_instance(4, 30, 20, 64);
        let forwards = Instance::new(&buffers, 1).unwrap();
        for (inst, grows) in [(forwards.mirrored(), false), (forwards, true)] {
            let part: Vec<u32> = (0..inst.len() as u32).collect();
            let found = chains(&inst, &part);
            let mut seen = vec![false; inst.len()];
            for chain in &found {
                assert!(chain.len() >= 2);
                for &i in chain {
                    assert!(!std::mem::replace(&mut seen[i as usize], true), "{i} in two chains");
                }
                for link in chain.windows(2) {
                    let [p, j] = [link[0] as usize, link[1] as usize];
                    assert!(inst.lo[p] < inst.lo[j] && inst.lo[j] <= inst.hi[p] && inst.hi[p] <= inst.lo[j] + HANDOVER);
                    assert!(inst.size[p] < inst.size[j] && inst.size[j] <= SIZE_FACTOR * inst.size[p]);
                }
            }
            // Forwards the caches grow (4 layers, K and V: 8 chains of 20 or more); backwards they shrink.
            let longest = found.iter().map(Vec::len).max().unwrap_or(0);
            assert_eq!(found.iter().filter(|c| c.len() >= 20).count(), if grows { 8 } else { 0 }, "{longest}");
        }
    }
}
