//! The planner's one source of chance (the squeaky wheel's coin, the generators of test instances):
//! seeded, so that the same seed gives the same plan.

/// A seeded generator: the same seed gives the same stream.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (bound > 0); the modulo bias is irrelevant here.
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
