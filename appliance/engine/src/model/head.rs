//! Exact rescoring of a quantized output head's best candidates.
//!
//! A decode step reads the whole head, so a pack may store it in NVFP4
//! (0.5625 bytes a weight). NVFP4 alone changes the greedy token at a few
//! percent of positions; the head is then only a screen: for each row of
//! logits the [`RESCORE_ROWS`] highest candidates are scored again with exact
//! weights (a tied model's BF16 embedding, or an untied pack's
//! `lm_head_exact` copy) and their logits replaced. The tokens sampling can
//! pick (greedy, top-k 20, the bulk of top-p) then carry exact logits, while a
//! step reads the quantized head plus [`RESCORE_ROWS`] rows of the exact one.
//! Logits outside the candidates stay the screen's.

use alloc::vec;
use alloc::vec::Vec;

use crate::kernels::dot;
use crate::ops::{any_above, SCAN};
use crate::weights::Linear;

/// Candidates per row that are rescored with the exact head.
pub const RESCORE_ROWS: usize = 64;

/// Replaces, in each `vocab`-long row of `logits`, the logits of its
/// [`RESCORE_ROWS`] highest entries by `exact`'s row dotted with the matching
/// row of `hidden` (`[n, hidden]`).
pub(crate) fn rescore(exact: &Linear<'_>, hidden: &[f32], logits: &mut [f32]) {
    let (vocab, h) = (exact.rows(), exact.cols());
    debug_assert_eq!(hidden.len() / h * vocab, logits.len());
    let (mut ids, mut row) = (Vec::with_capacity(2 * RESCORE_ROWS), vec![0.0f32; h]);
    for (x, z) in hidden.chunks_exact(h).zip(logits.chunks_exact_mut(vocab)) {
        top_k(z, RESCORE_ROWS, &mut ids);
        for &i in &ids {
            exact.decode_row(i as usize, &mut row);
            z[i as usize] = dot(&row, x);
        }
    }
}

/// The indices of the `k` largest values of `z` (all of them when `z` is
/// shorter; NaNs never chosen over numbers), in no particular order.
pub(crate) fn top_k(z: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    if k == 0 {
        return;
    }
    // Candidates above `floor` collect in `out`; when it holds 2k, the k best
    // are kept and `floor` rises to the least of them. O(len) on average.
    let mut floor = f32::NEG_INFINITY;
    for (c, chunk) in z.chunks(SCAN).enumerate() {
        // Once `floor` has risen, `out` holds at least k and only values
        // above `floor` enter: a run with none (most of a 248K vocabulary)
        // is passed over.
        if floor > f32::NEG_INFINITY && !any_above(chunk, floor) {
            continue;
        }
        for (j, &v) in chunk.iter().enumerate() {
            if v > floor || (out.len() < k && !v.is_nan()) {
                out.push((c * SCAN + j) as u32);
                if out.len() == 2 * k {
                    floor = keep_best(z, k, out);
                }
            }
        }
    }
    if out.len() > k {
        keep_best(z, k, out);
    }
}

/// Keeps the `k` indices of `ids` with the largest values and returns the
/// least value kept.
fn keep_best(z: &[f32], k: usize, ids: &mut Vec<u32>) -> f32 {
    let by_value_desc = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]);
    ids.select_nth_unstable_by(k - 1, by_value_desc);
    ids.truncate(k);
    ids.iter().map(|&i| z[i as usize]).fold(f32::INFINITY, f32::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn top_k_finds_the_largest_in_any_order_of_input() {
        // A pseudo-random permutation of 0..1000 as values.
        let z: Vec<f32> = (0..1000u32).map(|i| ((i * 7919) % 1000) as f32).collect();
        let mut ids = Vec::new();
        top_k(&z, 10, &mut ids);
        let mut got: Vec<f32> = ids.iter().map(|&i| z[i as usize]).collect();
        got.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(got, (990..1000).rev().map(|v| v as f32).collect::<Vec<_>>());
        // Ascending input (every value a new best) and descending input.
        let asc: Vec<f32> = (0..500).map(|i| i as f32).collect();
        top_k(&asc, 3, &mut ids);
        assert_eq!(sorted(ids.clone()), vec![497, 498, 499]);
        let desc: Vec<f32> = asc.iter().rev().copied().collect();
        top_k(&desc, 3, &mut ids);
        assert_eq!(sorted(ids.clone()), vec![0, 1, 2]);
    }

    #[test]
    fn top_k_of_a_vocabulary_sized_row_matches_a_full_sort() {
        // Pseudo-random values with NaNs and infinities, a rising trend so
        // that late runs still hold new bests, and ties.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let z: Vec<f32> = (0..248_320u32)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match s % 1000 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if i > 200_000 => f32::INFINITY,
                    _ => ((s >> 40) % 4096) as f32 + i as f32 / 64.0,
                }
            })
            .collect();
        for k in [1, 64, 300] {
            let mut ids = Vec::new();
            top_k(&z, k, &mut ids);
            let mut got: Vec<f32> = ids.iter().map(|&i| z[i as usize]).collect();
            got.sort_by(|a, b| b.total_cmp(a));
            let mut all: Vec<f32> = z.iter().copied().filter(|v| !v.is_nan()).collect();
            all.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(got, all[..k], "k = {k}");
        }
    }

    #[test]
    fn top_k_of_a_short_row_is_every_number_and_never_a_nan() {
        let z = [1.0, f32::NAN, -3.0];
        let mut ids = Vec::new();
        top_k(&z, 64, &mut ids);
        assert_eq!(sorted(ids.clone()), vec![0, 2]);
        top_k(&z, 1, &mut ids);
        assert_eq!(ids, vec![0]);
        top_k(&z, 0, &mut ids);
        assert!(ids.is_empty());
    }
}
