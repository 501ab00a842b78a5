//! Scans of a vocabulary-sized row of logits: the greedy pick
//! ([`crate::sampling::argmax`]), the head's rescoring candidates and the
//! sampler's top-k ([`top_k`]). Each keeps a running best and tests runs of
//! [`SCAN`] values at once ([`any_above`]): past the first few thousand
//! logits almost every run lies below it and is passed over in one step.

use alloc::vec::Vec;

/// Values a scan tests at once before looking at them one by one.
pub(crate) const SCAN: usize = 64;

/// Whether any value of `run` is above `floor` (NaNs are not): one
/// branch-free compare per value, which the compiler vectorizes.
pub(crate) fn any_above(run: &[f32], floor: f32) -> bool {
    run.iter().fold(false, |any, &v| any | (v > floor))
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

/// `(index, value)` of every value of `z` at or above `floor`, in index
/// order (NaNs never).
pub(crate) fn at_least(z: &[f32], floor: f32, out: &mut Vec<(u32, f32)>) {
    out.clear();
    for (c, run) in z.chunks(SCAN).enumerate() {
        if !run.iter().fold(false, |any, &v| any | (v >= floor)) {
            continue;
        }
        for (j, &v) in run.iter().enumerate() {
            if v >= floor {
                out.push(((c * SCAN + j) as u32, v));
            }
        }
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
