//! The block bookkeeping every peer model shares: segments cut into address-ordered blocks that
//! split and merge, each block in one free list (a pool key: a stream, or a stream and a size
//! class), and a best-fit index over the free blocks by (pool, size, address).
//!
//! Blocks of one segment are a doubly linked list in address order; blocks of different
//! segments never merge, as no allocator modelled here merges across device allocations.

use std::collections::{BTreeSet, HashMap};

use foldhash::fast::FixedState;

use vrampool_core::error::{InvalidFreeReason, PoolError};

/// No neighbour.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Free,
    Allocated,
    /// Address space of an expandable segment with no memory behind it.
    Unmapped,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    pub addr: u64,
    pub size: u64,
    pub prev: u32,
    pub next: u32,
    pub state: State,
    /// The free list the block belongs to (or would go back to).
    pub pool: u32,
    /// A model's own per-block figure (PyTorch's garbage-collection age base).
    pub aux: u64,
}

#[derive(Default)]
pub(crate) struct BlockList {
    nodes: Vec<Node>,
    spare: Vec<u32>,
    /// Allocated blocks by address.
    live: HashMap<u64, u32, FixedState>,
    /// Free blocks as (pool, size, address, node).
    free: BTreeSet<(u32, u64, u64, u32)>,
    /// Unmapped blocks as (pool, address, node).
    unmapped: BTreeSet<(u32, u64, u32)>,
}

impl BlockList {
    pub fn node(&self, n: u32) -> &Node {
        &self.nodes[n as usize]
    }

    fn node_mut(&mut self, n: u32) -> &mut Node {
        &mut self.nodes[n as usize]
    }

    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare.pop() {
            Some(n) => {
                self.nodes[n as usize] = node;
                n
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn drop_node(&mut self, n: u32) {
        self.spare.push(n);
    }

    /// A new segment of one block in `state` (indexed if free or unmapped).
    pub fn add_segment(&mut self, pool: u32, addr: u64, size: u64, state: State) -> u32 {
        let n = self.new_node(Node { addr, size, prev: NIL, next: NIL, state, pool, aux: 0 });
        self.index(n);
        n
    }

    /// Removes a segment that is one block (free or unmapped) and returns its range.
    pub fn remove_segment(&mut self, n: u32) -> (u64, u64) {
        let node = *self.node(n);
        debug_assert!(node.prev == NIL && node.next == NIL && node.state != State::Allocated);
        self.unindex(n);
        self.drop_node(n);
        (node.addr, node.size)
    }

    fn index(&mut self, n: u32) {
        let node = *self.node(n);
        match node.state {
            State::Free => self.free.insert((node.pool, node.size, node.addr, n)),
            State::Unmapped => self.unmapped.insert((node.pool, node.addr, n)),
            State::Allocated => self.live.insert(node.addr, n).is_none(),
        };
    }

    fn unindex(&mut self, n: u32) {
        let node = *self.node(n);
        match node.state {
            State::Free => self.free.remove(&(node.pool, node.size, node.addr, n)),
            State::Unmapped => self.unmapped.remove(&(node.pool, node.addr, n)),
            State::Allocated => self.live.remove(&node.addr).is_some(),
        };
    }

    /// Moves block `n` to `state` (and its index).
    pub fn set_state(&mut self, n: u32, state: State) {
        self.unindex(n);
        self.node_mut(n).state = state;
        self.index(n);
    }

    /// Moves free block `n` to free list `pool`.
    pub fn set_pool(&mut self, n: u32, pool: u32) {
        self.unindex(n);
        self.node_mut(n).pool = pool;
        self.index(n);
    }

    pub fn set_aux(&mut self, n: u32, aux: u64) {
        self.node_mut(n).aux = aux;
    }

    /// Free blocks of `pool` of at least `size` bytes, smallest first (then lowest address).
    pub fn fitting(&self, pool: u32, size: u64) -> impl Iterator<Item = u32> + '_ {
        self.free.range((pool, size, 0, 0)..=(pool, u64::MAX, u64::MAX, u32::MAX)).map(|&(.., n)| n)
    }

    /// The best fit: the smallest free block of `pool` that holds `size` bytes, lowest address first.
    pub fn best_fit(&self, pool: u32, size: u64) -> Option<u32> {
        self.fitting(pool, size).next()
    }

    /// Free blocks of `pool`, smallest first.
    pub fn free_blocks(&self, pool: u32) -> Vec<u32> {
        self.fitting(pool, 0).collect()
    }

    /// Every free block, by pool then size.
    pub fn all_free(&self) -> Vec<u32> {
        self.free.iter().map(|&(.., n)| n).collect()
    }

    /// Unmapped blocks of `pool` in address order.
    pub fn unmapped(&self, pool: u32) -> Vec<u32> {
        self.unmapped.range((pool, 0, 0)..=(pool, u64::MAX, u32::MAX)).map(|&(.., n)| n).collect()
    }

    /// The largest free block, and all free bytes.
    pub fn free_summary(&self) -> (u64, u64) {
        self.free.iter().fold((0, 0), |(largest, total), &(_, size, ..)| (largest.max(size), total + size))
    }

    /// Hands out the first `size` bytes of free block `n`, the rest split off and left free in
    /// its pool; returns the address.
    pub fn hand_out(&mut self, n: u32, size: u64) -> u64 {
        if self.node(n).size > size {
            self.split(n, size);
        }
        self.set_state(n, State::Allocated);
        self.node(n).addr
    }

    /// 1 - largest free block / all free bytes (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        let (largest, total) = self.free_summary();
        vrampool_core::stats::fragmentation(largest, total)
    }

    /// Frees the allocated block at `addr`, merged with its free neighbours of its pool: the
    /// merged block and the freed block's size; an error if `addr` is no allocated block.
    pub fn free(&mut self, addr: u64) -> Result<(u32, u64), PoolError> {
        let n = self.live.get(&addr).copied().ok_or(PoolError::InvalidFree { ptr: addr, reason: InvalidFreeReason::NotAllocated })?;
        let size = self.node(n).size;
        self.set_state(n, State::Free);
        Ok((self.coalesce(n), size))
    }

    /// Cuts block `n` (not allocated) after `head` bytes: `n` keeps the head, a new block of the
    /// same state and pool takes the rest, which is returned. Both stay indexed.
    pub fn split(&mut self, n: u32, head: u64) -> u32 {
        let node = *self.node(n);
        debug_assert!(head > 0 && head < node.size);
        self.unindex(n);
        let tail = self.new_node(Node { addr: node.addr + head, size: node.size - head, prev: n, next: node.next, ..node });
        if node.next != NIL {
            self.node_mut(node.next).prev = tail;
        }
        let head_node = self.node_mut(n);
        head_node.size = head;
        head_node.next = tail;
        self.index(n);
        self.index(tail);
        tail
    }

    /// Merges `src` (a neighbour of `dst` in the same state) into `dst`, which survives.
    fn absorb(&mut self, dst: u32, src: u32) {
        let s = *self.node(src);
        self.unindex(dst);
        self.unindex(src);
        let d = self.node_mut(dst);
        if d.prev == src {
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.node_mut(s.prev).next = dst;
            }
        } else {
            d.next = s.next;
            if s.next != NIL {
                self.node_mut(s.next).prev = dst;
            }
        }
        self.node_mut(dst).size += s.size;
        self.index(dst);
        self.drop_node(src);
    }

    /// Merges block `n` with its neighbours that are in its state and pool; returns the block.
    pub fn coalesce(&mut self, n: u32) -> u32 {
        let node = *self.node(n);
        for neighbour in [node.prev, node.next] {
            if neighbour != NIL {
                let other = self.node(neighbour);
                if other.state == node.state && other.pool == node.pool {
                    self.absorb(n, neighbour);
                }
            }
        }
        n
    }

    /// Whether block `n` is a whole segment.
    pub fn is_whole(&self, n: u32) -> bool {
        let node = self.node(n);
        node.prev == NIL && node.next == NIL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_coalesce_restore_the_segment() {
        let mut list = BlockList::default();
        let seg = list.add_segment(0, 1 << 20, 1 << 20, State::Free);
        let tail = list.split(seg, 4096);
        let last = list.split(tail, 8192);
        assert_eq!(list.best_fit(0, 4096), Some(seg));
        assert_eq!(list.best_fit(0, 5000), Some(tail));
        list.set_state(tail, State::Allocated);
        // The allocated block keeps its neighbours apart.
        assert_eq!(list.coalesce(seg), seg);
        assert_eq!(list.node(seg).size, 4096);
        let (whole, size) = list.free((1 << 20) + 4096).unwrap();
        assert_eq!(size, 8192);
        assert!(list.free((1 << 20) + 4096).is_err(), "freed already");
        assert!(list.is_whole(whole));
        assert_eq!((list.node(whole).addr, list.node(whole).size), (1 << 20, 1 << 20));
        assert_eq!(list.all_free().len(), 1);
        assert_eq!(list.free_summary(), (1 << 20, 1 << 20));
        let _ = last;
    }

    #[test]
    fn blocks_of_other_pools_do_not_merge() {
        let mut list = BlockList::default();
        let seg = list.add_segment(0, 0, 3 * 512, State::Free);
        let mid = list.split(seg, 512);
        let end = list.split(mid, 512);
        list.set_pool(end, 1);
        assert_eq!(list.coalesce(mid), mid);
        assert_eq!(list.node(mid).size, 1024, "the first two share pool 0");
        assert_eq!(list.node(end).size, 512);
        assert_eq!(list.best_fit(1, 1), Some(end));
    }
}
