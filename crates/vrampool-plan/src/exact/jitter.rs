//! The jitter stage: the round robin's jittered turns (`probe.rs`), and the descent's jittered tries
//! (`descent.rs`): an order with a few neighbouring ranks swapped, drawn anew each time.

/// Random swaps of neighbouring ranks in each jittered order (the round robin's, and the descent's, see
/// `descent.rs`).
pub(crate) const SWAPS: usize = 20;

/// `rank` with `swaps` random swaps of neighbouring ranks (xorshift64 from `seed`). Ranks stay a
/// permutation, and no buffer moves further than `swaps` places.
pub(crate) fn jitter(rank: &[u32], seed: u64, swaps: usize) -> Vec<u32> {
    let n = rank.len();
    let mut by = vec![0u32; n];
    for (i, &r) in rank.iter().enumerate() {
        by[r as usize] = i as u32;
    }
    if n > 1 {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..swaps {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = (state % (n as u64 - 1)) as usize;
            by.swap(k, k + 1);
        }
    }
    let mut varied = vec![0u32; n];
    for (r, &i) in by.iter().enumerate() {
        varied[i as usize] = r as u32;
    }
    varied
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jittered_order_is_another_ranking_of_the_same_buffers() {
        let rank: Vec<u32> = (0..50).rev().collect();
        let varied = jitter(&rank, 7, SWAPS);
        assert_ne!(varied, rank);
        let mut sorted = varied.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
        assert!(rank.iter().zip(&varied).all(|(&a, &b)| a.abs_diff(b) as usize <= SWAPS));
        assert_eq!(jitter(&[0], 7, SWAPS), [0]);
    }
}
