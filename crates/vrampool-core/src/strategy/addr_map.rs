//! The hash map every strategy keys by block address, with a hasher made for such keys.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hash map keyed by block address, shared by the strategies.
pub(super) type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// Design: block addresses are trusted-shape integers (512-aligned, distinct), so one folded
/// 64x64->128 multiply mixes them well enough and is several times cheaper than SipHash; it is
/// not DoS-resistant, which device addresses do not need.
#[derive(Default, Clone, Copy)]
pub(super) struct AddrHasher(u64);

const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let product = u128::from(x ^ self.0.rotate_left(32)).wrapping_mul(u128::from(MIX));
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizes::{GIB, MIB};

    #[test]
    fn addr_hasher_spreads_aligned_addresses() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<AddrHasher>::default();
        let buckets: std::collections::HashSet<u64> = (0..1024u64).map(|i| build.hash_one(GIB + i * 2 * MIB) & 1023).collect();
        assert!(buckets.len() > 500, "{}", buckets.len());
    }
}
