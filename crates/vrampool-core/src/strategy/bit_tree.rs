//! A set of integers below a capacity with O(log64 n) insert, remove and first: buddy's free
//! lists, one per order and segment.

/// A set of integers below a capacity: a bitmap with a summary bitmap per 64 words above it, so
/// insert, remove and first are O(log64 capacity) word operations.
#[derive(Debug, Clone)]
pub(super) struct BitTree {
    /// `levels[0]` holds the members; bit j of `levels[d + 1]` is set when word j of
    /// `levels[d]` is non-zero; the last level is one word.
    levels: Vec<Vec<u64>>,
    capacity: usize,
}

impl BitTree {
    pub(super) fn new(capacity: usize) -> Self {
        let mut levels = Vec::new();
        let mut bits = capacity.max(1);
        loop {
            let words = bits.div_ceil(64);
            levels.push(vec![0; words]);
            if words == 1 {
                break;
            }
            bits = words;
        }
        Self { levels, capacity }
    }

    /// Makes room for members below `capacity`, keeping the members.
    pub(super) fn grow(&mut self, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        let mut bigger = BitTree::new(capacity.max(self.capacity * 2));
        for i in self.iter() {
            bigger.insert(i);
        }
        *self = bigger;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.levels.last().is_none_or(|top| top[0] == 0)
    }

    pub(super) fn contains(&self, i: usize) -> bool {
        self.levels[0].get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub(super) fn insert(&mut self, mut i: usize) {
        if i >= self.capacity {
            return;
        }
        for level in &mut self.levels {
            let word = &mut level[i / 64];
            let was_zero = *word == 0;
            *word |= 1 << (i % 64);
            if !was_zero {
                break;
            }
            i /= 64;
        }
    }

    /// Removes `i`; false if it was not a member.
    pub(super) fn remove(&mut self, mut i: usize) -> bool {
        if !self.contains(i) {
            return false;
        }
        for level in &mut self.levels {
            let word = &mut level[i / 64];
            *word &= !(1 << (i % 64));
            if *word != 0 {
                break;
            }
            i /= 64;
        }
        true
    }

    /// The smallest member.
    pub(super) fn first(&self) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        let mut i = 0;
        for level in self.levels.iter().rev() {
            i = i * 64 + level.get(i)?.trailing_zeros() as usize;
        }
        Some(i)
    }

    /// The members in increasing order; the first summary level skips empty leaf words.
    pub(super) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let leaves = &self.levels[0];
        let nonzero_words: Box<dyn Iterator<Item = usize> + '_> = match self.levels.get(1) {
            Some(summary) => Box::new(set_bits(summary)),
            None => Box::new(0..leaves.len()),
        };
        nonzero_words.flat_map(move |w| set_bits(&leaves[w..=w]).map(move |b| w * 64 + b))
    }
}

/// The indices of the set bits of `words`, in increasing order.
fn set_bits(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(w, &word)| {
        let mut bits = word;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(w * 64 + b)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_tree_insert_remove_first_iter_grow() {
        let mut t = BitTree::new(300_000);
        assert_eq!((t.first(), t.is_empty()), (None, true));
        for i in [299_999, 70_000, 4097, 64, 63] {
            t.insert(i);
        }
        t.insert(300_000); // beyond capacity: ignored
        assert_eq!(t.first(), Some(63));
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![63, 64, 4097, 70_000, 299_999]);
        assert!(t.remove(63) && !t.remove(63) && !t.remove(1_000_000));
        assert!(t.remove(64) && t.remove(4097));
        assert_eq!(t.first(), Some(70_000));
        t.grow(5_000_000);
        t.insert(4_999_999);
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![70_000, 299_999, 4_999_999]);
        assert!(t.remove(70_000) && t.remove(299_999) && t.remove(4_999_999));
        assert!(t.is_empty() && t.levels.iter().all(|l| l.iter().all(|&w| w == 0)));
        let mut none = BitTree::new(0);
        none.insert(0);
        assert_eq!(none.first(), None, "no room");
        none.grow(1);
        none.insert(0);
        assert_eq!(none.first(), Some(0));
    }
}
