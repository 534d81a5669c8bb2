//! Size arithmetic shared by the strategies: rounding and the slab size classes.

/// The smallest unit the pool hands out, as PyTorch's caching allocator does.
pub const MIN_BLOCK: u64 = 512;
pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
/// The largest request the pool takes: 128 TiB. The live-block table keeps a block's size in 48
/// bits, and every strategy's block for a request up to this (a buddy rounds it up to a power of
/// two, a segment to its growth unit) stays below 2^48.
pub const MAX_REQUEST: u64 = 1 << 47;

/// Rounds `size` up to a multiple of `unit` (a power of two); None on overflow.
pub fn round_up(size: u64, unit: u64) -> Option<u64> {
    debug_assert!(unit.is_power_of_two());
    size.checked_add(unit - 1).map(|s| s & !(unit - 1))
}

/// Size classes for the slab: 512 B steps up to 4 KiB, then four classes per power of two
/// (as jemalloc does), so no class wastes more than 20% of a request above 4 KiB.
pub fn size_class_of(size: u64) -> u64 {
    if size <= 4 * KIB {
        return round_up(size.max(1), MIN_BLOCK).unwrap_or(MIN_BLOCK);
    }
    let pow = 63 - (size - 1).leading_zeros(); // 2^pow < size <= 2^(pow+1)
    let step = 1u64 << (pow - 2);
    round_up(size, step).unwrap_or(u64::MAX)
}

/// Index of a size class among all classes up to `size_class_of(size)`; dense, starting at 0.
pub fn size_class_index(class: u64) -> usize {
    if class <= 4 * KIB {
        return (class / MIN_BLOCK - 1) as usize;
    }
    let pow = 63 - (class - 1).leading_zeros();
    let step = 1u64 << (pow - 2);
    let within = ((class - (1u64 << pow)) / step - 1) as usize; // 0..4
    8 + (pow as usize - 12) * 4 + within
}

/// The index of the size class `size` is, if it is one: `size_class_index(size)` when
/// `size_class_of(size) == size`. Design: one computation instead of the class and then its index,
/// as the general path asks it of every request (fewer live registers there, too).
pub fn exact_class_index(size: u64) -> Option<usize> {
    if size <= 4 * KIB {
        return (size != 0 && size % MIN_BLOCK == 0).then(|| (size / MIN_BLOCK - 1) as usize);
    }
    let pow = 63 - (size - 1).leading_zeros();
    let shift = pow - 2;
    (size & ((1u64 << shift) - 1) == 0).then(|| 8 + (pow as usize - 12) * 4 + ((size - (1u64 << pow)) >> shift) as usize - 1)
}

/// How many classes are at most `max` bytes: the classes of indices `0..classes_up_to(max)`.
pub fn classes_up_to(max: u64) -> usize {
    let top = size_class_of(max);
    size_class_index(top) + usize::from(top == max)
}

/// The size of the class with dense index `index` (the inverse of `size_class_index`).
pub fn class_size(index: usize) -> u64 {
    if index < 8 {
        return (index as u64 + 1) * MIN_BLOCK;
    }
    let pow = 12 + (index - 8) / 4;
    let within = (index - 8) % 4;
    (1u64 << pow) + (within as u64 + 1) * (1u64 << (pow - 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotone_dense_and_tight() {
        let mut last_class = 0;
        let mut last_index = None;
        let mut size = 1;
        while size <= 4 * MIB {
            let class = size_class_of(size);
            assert!(class >= size && class % MIN_BLOCK == 0, "size {size} class {class}");
            assert!(class >= last_class);
            if size > 4 * KIB {
                assert!((class - size) as f64 / size as f64 <= 0.25, "size {size} class {class}");
            }
            let index = size_class_index(class);
            assert_eq!(class_size(index), class);
            if class != last_class {
                assert_eq!(Some(index), last_index.map(|i: usize| i + 1).or(Some(0)), "class {class}");
                last_index = Some(index);
            }
            last_class = class;
            size += if size < 64 * KIB { 1 } else { 97 };
        }
    }

    #[test]
    fn exact_class_index_is_the_index_of_sizes_that_are_classes_and_none_else() {
        let expected = |size: u64| (size_class_of(size) == size).then(|| size_class_index(size));
        let mut sizes: Vec<u64> = (0..=256 * KIB).collect();
        for pow in 12..64 {
            for k in 0..=8u64 {
                let around = (1u64 << pow).saturating_add((1u64 << pow) / 8 * k);
                sizes.extend([around - 1, around, around.saturating_add(1)]);
            }
        }
        // Past 2^63 + 2^61, `size_class_of` saturates at u64::MAX, which is no class.
        sizes.retain(|&size| size <= (1 << 63) + (1 << 61));
        assert_eq!(exact_class_index(u64::MAX), None);
        for size in sizes {
            assert_eq!(exact_class_index(size), expected(size), "size {size}");
        }
        assert_eq!(exact_class_index(4 * MIB), Some(size_class_index(4 * MIB)));
        assert_eq!(exact_class_index(4 * MIB + MIB / 2), None, "the classes above 4 MiB are 1 MiB apart");
    }

    #[test]
    fn classes_up_to_counts_the_classes_at_most_that_size() {
        for max in [512, 513, 4 * KIB, 100 * KIB, 112 * KIB, MIB, 1 << 30] {
            let counted = (0..).take_while(|&i| class_size(i) <= max).count();
            assert_eq!(classes_up_to(max), counted, "{max}");
        }
    }

    #[test]
    fn round_up_handles_overflow() {
        assert_eq!(round_up(1, 512), Some(512));
        assert_eq!(round_up(512, 512), Some(512));
        assert_eq!(round_up(u64::MAX, 512), None);
    }
}
