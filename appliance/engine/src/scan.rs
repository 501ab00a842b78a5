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

/// Sorts `cand` (`(index, logit)`, no NaN) by logit, largest first, ties by
/// index: the order of `b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))`, which is
/// total, so any correct sort gives the same permutation. A long list in
/// index order (a whole vocabulary) takes a stable radix sort on the logit's
/// 32 order bits (three 11-bit passes; being stable keeps ties in index
/// order), others the comparison sort.
pub(crate) fn sort_by_logit(cand: &mut [(u32, f32)]) {
    if cand.len() < RADIX_MIN || !cand.windows(2).all(|w| w[0].0 < w[1].0) {
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        return;
    }
    // The logit's bits made to order as `total_cmp` does, inverted for
    // largest first, above the index.
    let key = |(i, v): (u32, f32)| {
        let b = v.to_bits();
        let ord = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
        (u64::from(!ord) << 32) | u64::from(i)
    };
    let mut keys: Vec<u64> = cand.iter().map(|&c| key(c)).collect();
    let mut spare = alloc::vec![0u64; keys.len()];
    let mut count = alloc::vec![0usize; 1 << 11];
    for pass in 0..3 {
        let digit = |k: u64| ((k >> (32 + 11 * pass)) & 0x7FF) as usize;
        count.iter_mut().for_each(|c| *c = 0);
        keys.iter().for_each(|&k| count[digit(k)] += 1);
        let mut at = 0;
        for c in count.iter_mut() {
            (*c, at) = (at, at + *c);
        }
        for &k in &keys {
            let d = digit(k);
            spare[count[d]] = k;
            count[d] += 1;
        }
        core::mem::swap(&mut keys, &mut spare);
    }
    for (c, k) in cand.iter_mut().zip(keys) {
        let ord = !((k >> 32) as u32);
        let bits = if ord >> 31 == 1 { ord & 0x7FFF_FFFF } else { !ord };
        *c = (k as u32, f32::from_bits(bits));
    }
}

/// Lists at least this long take the radix sort in [`sort_by_logit`].
const RADIX_MIN: usize = 4096;

/// Keeps the `k` indices of `ids` with the largest values and returns the
/// least value kept.
fn keep_best(z: &[f32], k: usize, ids: &mut Vec<u32>) -> f32 {
    let by_value_desc = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]);
    ids.select_nth_unstable_by(k - 1, by_value_desc);
    ids.truncate(k);
    ids.iter().map(|&i| z[i as usize]).fold(f32::INFINITY, f32::min)
}

/// A xorshift64 generator for the tests of the scans and their callers.
#[cfg(test)]
pub(crate) fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
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
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        let z: Vec<f32> = (0..248_320u32)
            .map(|i| {
                let s = next();
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
    fn sort_by_logit_is_the_comparison_sort() {
        // Heavy ties, both zeros, infinities, subnormals; long (radix) and short.
        let mut next = xorshift(0xD1B5_4A32_D192_ED03);
        for n in [100, 5000, 248_320] {
            let cand: Vec<(u32, f32)> = (0..n as u32)
                .map(|i| {
                    let r = next();
                    let v = match r % 50 {
                        0 => f32::INFINITY,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        3 => 0.0,
                        4 => f32::from_bits(1 + (r >> 40) as u32 % 100),
                        5 => -f32::from_bits(1 + (r >> 40) as u32 % 100),
                        _ => ((r >> 40) % 3000) as f32 / 64.0 - 20.0,
                    };
                    (i, v)
                })
                .collect();
            let mut want = cand.clone();
            want.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let bits =
                |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
            // In index order (the radix sort when long) and reversed (never).
            let mut got = cand.clone();
            sort_by_logit(&mut got);
            assert_eq!(bits(&got), bits(&want), "n = {n}");
            let mut got: Vec<(u32, f32)> = cand.into_iter().rev().collect();
            sort_by_logit(&mut got);
            assert_eq!(bits(&got), bits(&want), "n = {n}, reversed");
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
