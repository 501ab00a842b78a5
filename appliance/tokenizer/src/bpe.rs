//! The BPE merge engine: within one pre-token, repeatedly merge the adjacent pair
//! with the lowest merge rank (leftmost first on ties), as the reference does.

use alloc::collections::BinaryHeap;
use alloc::vec::Vec;
use core::cmp::Reverse;
use hashbrown::HashMap;

use crate::hash::FxBuild;

/// Pieces with at most this many bytes use the simple quadratic scan; longer ones
/// use a heap.
const SCAN_MAX: usize = 48;

/// A merge rule's rank and the token it produces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Merge {
    pub rank: u32,
    pub id: u32,
}

/// Merge rules keyed by the pair of token ids.
pub(crate) struct Merges {
    map: HashMap<u64, Merge, FxBuild>,
}

#[inline]
fn key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl Merges {
    /// An empty rule set with room for `n` rules.
    pub(crate) fn with_capacity(n: usize) -> Merges {
        Merges { map: HashMap::with_capacity_and_hasher(n, FxBuild::default()) }
    }

    /// Adds a rule; the first rule for a pair wins (later duplicates are ignored).
    pub(crate) fn insert(&mut self, left: u32, right: u32, merge: Merge) {
        self.map.entry(key(left, right)).or_insert(merge);
    }

    /// The rule for a pair, if any.
    #[inline]
    pub(crate) fn get(&self, left: u32, right: u32) -> Option<Merge> {
        self.map.get(&key(left, right)).copied()
    }

    /// Number of rules.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Merges `syms` (token ids of single bytes, in order) in place.
    pub(crate) fn apply(&self, syms: &mut Vec<u32>) {
        if syms.len() < 2 {
            return;
        }
        if syms.len() <= SCAN_MAX {
            self.apply_scan(syms);
        } else {
            self.apply_heap(syms);
        }
    }

    fn rank(&self, left: u32, right: u32) -> u32 {
        self.get(left, right).map_or(u32::MAX, |m| m.rank)
    }

    /// Quadratic scan: fine and fast for short pieces.
    fn apply_scan(&self, syms: &mut Vec<u32>) {
        let mut ranks: Vec<u32> = syms.windows(2).map(|w| self.rank(w[0], w[1])).collect();
        loop {
            let mut best = u32::MAX;
            let mut at = 0;
            for (i, &r) in ranks.iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if best == u32::MAX {
                return;
            }
            let Some(m) = self.get(syms[at], syms[at + 1]) else { return };
            syms[at] = m.id;
            syms.remove(at + 1);
            ranks.remove(at);
            if at > 0 {
                ranks[at - 1] = self.rank(syms[at - 1], syms[at]);
            }
            if at < ranks.len() {
                ranks[at] = self.rank(syms[at], syms[at + 1]);
            }
        }
    }

    /// Heap of candidate pairs ordered by (rank, position) over a linked list.
    fn apply_heap(&self, syms: &mut Vec<u32>) {
        const NONE: u32 = u32::MAX;
        let n = syms.len();
        let mut prev: Vec<u32> = (0..n as u32).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<u32> =
            (1..=n as u32).map(|i| if i as usize == n { NONE } else { i }).collect();
        let mut alive = alloc::vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some(m) = self.get(syms[i], syms[i + 1]) {
                heap.push(Reverse((m.rank, i as u32)));
            }
        }
        while let Some(Reverse((rank, pos))) = heap.pop() {
            let p = pos as usize;
            let q = next[p];
            if !alive[p] || q == NONE {
                continue;
            }
            let q = q as usize;
            let Some(m) = self.get(syms[p], syms[q]) else { continue };
            if m.rank != rank {
                continue;
            }
            syms[p] = m.id;
            alive[q] = false;
            next[p] = next[q];
            if next[q] != NONE {
                prev[next[q] as usize] = pos;
            }
            if prev[p] != NONE {
                let l = prev[p] as usize;
                if let Some(m) = self.get(syms[l], syms[p]) {
                    heap.push(Reverse((m.rank, l as u32)));
                }
            }
            if next[p] != NONE {
                if let Some(m) = self.get(syms[p], syms[next[p] as usize]) {
                    heap.push(Reverse((m.rank, pos)));
                }
            }
        }
        let mut w = 0;
        for r in 0..n {
            if alive[r] {
                syms[w] = syms[r];
                w += 1;
            }
        }
        syms.truncate(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// Tokens 0..4 are bytes a b c d; 10 = ab, 11 = abc, 12 = cd, 13 = bc, 14 = aa.
    fn rules() -> Merges {
        let mut m = Merges::with_capacity(8);
        m.insert(0, 0, Merge { rank: 0, id: 14 });
        m.insert(0, 1, Merge { rank: 1, id: 10 });
        m.insert(1, 2, Merge { rank: 2, id: 13 });
        m.insert(10, 2, Merge { rank: 3, id: 11 });
        m.insert(2, 3, Merge { rank: 4, id: 12 });
        m
    }

    #[test]
    fn merges_lowest_rank_leftmost_first() {
        let m = rules();
        let mut s = vec![0, 0, 0];
        m.apply(&mut s);
        assert_eq!(s, [14, 0]);
        let mut s = vec![0, 1, 2, 3];
        m.apply(&mut s);
        assert_eq!(s, [11, 3]);
        let mut s = vec![3, 1, 2, 3];
        m.apply(&mut s);
        assert_eq!(s, [3, 13, 3]);
    }

    #[test]
    fn heap_and_scan_agree() {
        let m = rules();
        let mut seed = 12345u64;
        for len in [2usize, 3, 7, 30, 100, 500] {
            for _ in 0..50 {
                let s: Vec<u32> = (0..len)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((seed >> 33) % 4) as u32
                    })
                    .collect();
                let mut a = s.clone();
                let mut b = s.clone();
                m.apply_scan(&mut a);
                m.apply_heap(&mut b);
                assert_eq!(a, b, "input {s:?}");
            }
        }
    }
}
