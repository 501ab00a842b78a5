//! Token selection: greedy, or temperature sampling with top-k, top-p and
//! min-p filters, driven by a small seeded RNG (SplitMix64) so runs repeat.
//!
//! Temperature alone (no filter: the OpenAI default) draws straight from the
//! vocabulary in index order, without sorting it: weights
//! `expf((logit - max) / T)` (0 below `e^-80`, `kernels::exp_in_place`,
//! the same bits on every kernel path), and the token where the running sum
//! in f64 passes `u` times the total. A filter needs the order by logit, so
//! it builds the sorted distribution ([`Sampler::distribution`]).
//!
//! Constrained decoding ([`Sampler::sample_masked`]) samples from the logits
//! with every token outside a bitmask at minus infinity: the same draws as
//! unconstrained sampling over those logits, so a seed repeats its tokens.
//! [`logprobs`] reads the model's own distribution (the log-softmax of the
//! raw logits, before temperature, filters and masks).

use alloc::vec::Vec;

use crate::scan::{any_above, at_least, sort_by_logit, top_k, SCAN};

/// How to pick the next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or less) is greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = no limit).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top one (0 = off).
    pub min_p: f32,
    /// RNG seed.
    pub seed: u64,
}

impl SamplingParams {
    /// Greedy decoding (argmax; the first index wins ties, as in torch).
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }
}

/// SplitMix64: tiny, fast, good enough for sampling, and reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Picks tokens from logits according to [`SamplingParams`].
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// The vocabulary's weights when sampling without a filter (kept to
    /// spare a large allocation a token).
    weights: Vec<f32>,
    /// The masked logits of constrained sampling (kept likewise).
    masked: Vec<f32>,
}

/// Index of the largest value; NaN never wins; the first maximum wins ties.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (c, run) in logits.chunks(SCAN).enumerate() {
        // Most runs hold nothing above the best so far: one vector pass each.
        if !any_above(run, best_v) {
            continue;
        }
        for (j, &v) in run.iter().enumerate() {
            if v > best_v {
                best = c * SCAN + j;
                best_v = v;
            }
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler with its own RNG seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Sampler { params, rng: Rng::new(params.seed), weights: Vec::new(), masked: Vec::new() }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (`[vocab]`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let p = self.params;
        let unfiltered = (p.top_k == 0 || p.top_k >= logits.len()) && p.top_p >= 1.0;
        if unfiltered && p.min_p <= 0.0 {
            if let Some(token) = self.sample_unsorted(logits) {
                return token;
            }
        }
        let dist = self.distribution(logits);
        self.draw(&dist)
    }

    /// Temperature sampling without filters, in index order (module docs);
    /// `None` when the largest logit is not finite (every logit NaN, or an
    /// infinity), which [`Sampler::distribution`] decides.
    fn sample_unsorted(&mut self, logits: &[f32]) -> Option<u32> {
        let best = argmax(logits) as usize;
        let max = logits[best];
        if !max.is_finite() {
            return None;
        }
        let t = self.params.temperature;
        let w = &mut self.weights;
        w.clear();
        w.extend(
            logits.iter().map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { (l - max) / t }),
        );
        // Bit-identical on every path: the fastest one.
        crate::kernels::exp_in_place(crate::simd::best(), w);
        let sum = |run: &[f32]| run.iter().fold(0.0f64, |a, &v| a + f64::from(v));
        let runs: Vec<f64> = w.chunks(SCAN).map(sum).collect();
        let target = self.rng.next_f64() * runs.iter().sum::<f64>();
        let mut acc = 0.0;
        for (r, &run) in runs.iter().enumerate() {
            if target >= acc + run {
                acc += run;
                continue;
            }
            for (j, &v) in w[r * SCAN..].iter().take(SCAN).enumerate() {
                acc += f64::from(v);
                if target < acc {
                    return Some((r * SCAN + j) as u32);
                }
            }
        }
        // Rounding left the target past every sum: the best token.
        Some(best as u32)
    }

    /// The distribution [`Sampler::sample`] draws from: `(token, probability)`
    /// after temperature, top-k, top-p and min-p, normalised, most likely
    /// first (without a filter `sample` draws the same probabilities in
    /// token-id order, tokens below `e^-80` of the best at 0). Greedy gives the argmax with probability 1. Empty only when
    /// every logit is NaN.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let p = self.params;
        if p.is_greedy() {
            return alloc::vec![(argmax(logits), 1.0)];
        }
        // Candidates sorted by logit, best first (NaN excluded). With top-k,
        // every one of the k best is at least the k-th largest logit: only
        // those (ties included) are gathered, by two scans, not the vocabulary.
        let mut cand: Vec<(u32, f32)> = Vec::new();
        if p.top_k > 0 && p.top_k < logits.len() {
            let mut ids = Vec::with_capacity(2 * p.top_k);
            top_k(logits, p.top_k, &mut ids);
            let floor = ids.iter().map(|&i| logits[i as usize]).fold(f32::INFINITY, f32::min);
            at_least(logits, floor, &mut cand);
        } else {
            cand.extend(
                logits.iter().enumerate().filter(|(_, v)| !v.is_nan()).map(|(i, &v)| (i as u32, v)),
            );
        }
        if cand.is_empty() {
            return Vec::new();
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit);
            cand.truncate(p.top_k);
        }
        sort_by_logit(&mut cand);
        // Softmax with temperature.
        let max = cand[0].1;
        let mut probs: Vec<f64> =
            cand.iter().map(|c| libm::exp(((c.1 - max) / p.temperature) as f64)).collect();
        normalize(&mut probs);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        probs.truncate(keep.max(1));
        normalize(&mut probs);
        cand.iter().zip(probs).map(|(c, q)| (c.0, q)).collect()
    }

    /// Draws one token from `dist` (`(token, probability)` pairs summing to
    /// 1) with one uniform number; 0 for an empty distribution.
    pub fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let Some(last) = dist.last() else { return 0 };
        let u = self.rng.next_f64();
        let mut acc = 0.0;
        for &(tok, q) in dist {
            acc += q;
            if u < acc {
                return tok;
            }
        }
        last.0
    }

    /// A uniform number in [0, 1) from the sampler's generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// Whether bit `id` of the bitmask `mask` (bit `id % 32` of word `id / 32`) is set.
#[inline]
pub fn mask_has(mask: &[u32], id: u32) -> bool {
    mask.get(id as usize / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
}

/// The best token among those set in `mask` (first on ties, NaN never); the
/// first allowed id when none has a number; 0 when none is allowed.
pub fn masked_argmax(logits: &[f32], mask: &[u32]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    let mut first = None;
    for (w, &bits) in mask.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            let id = (w * 32) as u32 + b.trailing_zeros();
            b &= b - 1;
            let Some(&v) = logits.get(id as usize) else { continue };
            first.get_or_insert(id);
            if v > best.map_or(f32::NEG_INFINITY, |x| x.1) {
                best = Some((id, v));
            }
        }
    }
    best.map(|b| b.0).or(first).unwrap_or(0)
}

impl Sampler {
    /// Picks the next token among those set in `mask` (see the module docs):
    /// greedy takes the best allowed token, sampling draws from the logits
    /// with the rest at minus infinity. Never returns a token outside the
    /// mask unless the mask is empty.
    pub fn sample_masked(&mut self, logits: &[f32], mask: &[u32]) -> u32 {
        if self.params.is_greedy() {
            return masked_argmax(logits, mask);
        }
        let mut masked = core::mem::take(&mut self.masked);
        masked.clear();
        masked.extend(logits.iter().enumerate().map(|(i, &v)| {
            if mask_has(mask, i as u32) {
                v
            } else {
                f32::NEG_INFINITY
            }
        }));
        let t = self.sample(&masked);
        self.masked = masked;
        // Rounding may leave a draw on a zero-weight token: the best allowed one then.
        if mask_has(mask, t) {
            t
        } else {
            masked_argmax(logits, mask)
        }
    }
}

/// A generated token's log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The token.
    pub token: u32,
    /// Its log-probability under the model.
    pub logprob: f32,
    /// The `n` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Most alternatives [`logprobs`] reports (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `token`'s log-probability under the log-softmax of `logits`, and the
/// `top_n` (at most [`MAX_TOP_LOGPROBS`]) most likely tokens'.
pub fn logprobs(logits: &[f32], token: u32, top_n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().filter(|v| v.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| libm::exp(f64::from(v) - f64::from(max)))
        .sum();
    let lse = f64::from(max) + libm::log(sum);
    let lp = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { (f64::from(v) - lse) as f32 };
    let mut ids = Vec::new();
    top_k(logits, top_n.min(MAX_TOP_LOGPROBS), &mut ids);
    let mut top: Vec<(u32, f32)> = ids.iter().map(|&i| (i, lp(logits[i as usize]))).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(top_n.min(MAX_TOP_LOGPROBS));
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&v| lp(v));
    TokenLogprobs { token, logprob, top }
}

fn normalize(p: &mut [f64]) {
    let s: f64 = p.iter().sum();
    if s > 0.0 {
        p.iter_mut().for_each(|q| *q /= s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, min_p, seed: 42 }
    }

    #[test]
    fn masked_sampling_only_draws_allowed_tokens_and_repeats_with_the_seed() {
        let logits = [3.0f32, 0.5, 2.9, -1.0, f32::NAN, 1.0, 0.0, 2.0];
        let mask = [0b1010_0110u32]; // tokens 1, 2, 5, 7
        assert_eq!(masked_argmax(&logits, &mask), 2);
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample_masked(&logits, &mask), 2);
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { seed, ..params(1.5, 3, 0.9, 0.0) });
            (0..200).map(|_| s.sample_masked(&logits, &mask)).collect::<Vec<_>>()
        };
        let a = draw(3);
        assert!(a.iter().all(|t| [1, 2, 5, 7].contains(t)), "{a:?}");
        assert_eq!(a, draw(3));
        assert!(a.contains(&7) && a.contains(&5), "the top 3 allowed are drawn: {a:?}");
        assert!(!a.contains(&1), "top_k 3 after masking drops the 4th allowed");
        // Only NaN allowed: the first allowed id; nothing allowed: 0.
        assert_eq!(masked_argmax(&logits, &[0b1_0000]), 4);
        assert_eq!(masked_argmax(&logits, &[0]), 0);
    }

    #[test]
    fn logprobs_are_the_log_softmax_with_sorted_alternatives() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        let lp = logprobs(&logits, 2, 3);
        assert!((lp.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        let total: f64 = (0..4).map(|t| (logprobs(&logits, t, 0).logprob as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(logprobs(&logits, 0, 50).top.len(), 4);
    }

    #[test]
    fn greedy_picks_first_max_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0]), 1);
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample(&[0.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn greedy_over_a_vocabulary_sized_row_matches_a_plain_scan() {
        // Index of the first maximum, NaN never winning, as one scan reads it.
        let plain = |z: &[f32]| {
            let mut best = 0;
            for (i, v) in z.iter().enumerate() {
                if *v > z[best] || (z[best].is_nan() && !v.is_nan()) {
                    best = i;
                }
            }
            best as u32
        };
        let mut next = crate::scan::xorshift(0x2545_F491_4F6C_DD1D);
        let mut z: Vec<f32> = (0..248_320)
            .map(|_| {
                let s = next();
                if s % 997 == 0 {
                    f32::NAN
                } else {
                    ((s >> 40) % 100_000) as f32 / 7.0
                }
            })
            .collect();
        assert_eq!(argmax(&z), plain(&z));
        // A tie between the last value of one run and a later run, then a NaN first.
        let top = 1.0e6;
        (z[SCAN * 3 - 1], z[SCAN * 900 + 5], z[0]) = (top, top, f32::NAN);
        assert_eq!(argmax(&z), (SCAN * 3 - 1) as u32);
        assert_eq!(argmax(&z), plain(&z));
        // Every value below the start (-inf) or NaN: index 0.
        assert_eq!(argmax(&[f32::NAN; 300]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 300]), 0);
    }

    #[test]
    fn top_k_candidates_match_a_full_sort_with_ties_and_nans() {
        // Few distinct values over a vocabulary-sized row: long runs of ties
        // at every top-k boundary, both zeros, NaNs and infinities.
        let mut next = crate::scan::xorshift(0x5851_F42D_4C95_7F2D);
        let z: Vec<f32> = (0..248_320)
            .map(|_| {
                let s = next();
                match s % 500 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => -0.0,
                    _ => ((s >> 40) % 2000) as f32 / 100.0 - 10.0,
                }
            })
            .collect();
        let mut sorted: Vec<(u32, f32)> = z
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, v))
            .collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for k in [1, 40, 1000] {
            let dist = Sampler::new(params(0.8, k, 1.0, 0.0)).distribution(&z);
            let got: Vec<u32> = dist.iter().map(|d| d.0).collect();
            let want: Vec<u32> = sorted[..k].iter().map(|c| c.0).collect();
            assert_eq!(got, want, "top_k {k}");
        }
    }

    #[test]
    fn top_k_one_is_greedy_and_filters_bound_choices() {
        let logits = [0.1, 2.0, 1.9, -5.0, 1.8];
        let mut s = Sampler::new(params(1.0, 1, 1.0, 0.0));
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), 1);
        }
        let mut s = Sampler::new(params(1.0, 3, 1.0, 0.0));
        for _ in 0..200 {
            assert!([1, 2, 4].contains(&s.sample(&logits)));
        }
        // top_p small keeps only the best token.
        let mut s = Sampler::new(params(1.0, 0, 0.01, 0.0));
        assert!((0..50).all(|_| s.sample(&logits) == 1));
        // min_p 0.5 drops tokens far below the best.
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.5));
        assert!((0..200).all(|_| s.sample(&logits) != 3 && s.sample(&logits) != 0));
    }

    #[test]
    fn unfiltered_sampling_is_the_index_order_inverse_cdf() {
        // A vocabulary-sized row; each seed's token must be where the running
        // sum of expf((l - max) / T), in index order, passes u times the total.
        let mut next = crate::scan::xorshift(0x9E37_79B9_7F4A_7C15);
        let z: Vec<f32> = (0..248_320).map(|_| ((next() >> 40) % 4000) as f32 / 400.0).collect();
        let t = 0.7f32;
        let max = z.iter().copied().fold(f32::MIN, f32::max);
        let w: Vec<f64> = z.iter().map(|&l| f64::from(libm::expf((l - max) / t))).collect();
        let total: f64 = w.iter().sum();
        for seed in 0..40 {
            let u = Rng::new(seed).next_f64() * total;
            let (mut acc, mut want) = (0.0, 0);
            for (i, q) in w.iter().enumerate() {
                acc += q;
                if u < acc {
                    want = i as u32;
                    break;
                }
            }
            let got = Sampler::new(SamplingParams { seed, ..params(t, 0, 1.0, 0.0) }).sample(&z);
            assert_eq!(got, want, "seed {seed}");
        }
    }

    #[test]
    fn unfiltered_sampling_follows_temperature_and_skips_nan_and_the_far_tail() {
        // T = 0.5: weights e^0, e^(2 ln 3) = 9, e^(2 ln 2) = 4 of 14; the rest
        // NaN, -inf, or more than 80 T below the best (never drawn).
        let logits = [0.0, 3f32.ln(), 2f32.ln(), f32::NAN, f32::NEG_INFINITY, 3f32.ln() - 40.1];
        let mut s = Sampler::new(params(0.5, 0, 1.0, 0.0));
        let mut counts = [0u32; 6];
        for _ in 0..14_000 {
            counts[s.sample(&logits) as usize] += 1;
        }
        assert_eq!(counts[3..], [0, 0, 0], "{counts:?}");
        for (c, want) in counts.iter().zip([1000, 9000, 4000]) {
            assert!(c.abs_diff(want) < 300, "{counts:?}");
        }
        // Every logit NaN: token 0, as the filtered path gives.
        assert_eq!(Sampler::new(params(0.5, 0, 1.0, 0.0)).sample(&[f32::NAN; 3]), 0);
    }

    #[test]
    fn sampling_follows_the_distribution_and_repeats_with_the_seed() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0));
        let ones = (0..4000).filter(|_| s.sample(&logits) == 1).count();
        assert!((2800..3200).contains(&ones), "{ones}");
        let a: Vec<u32> = {
            let mut s = Sampler::new(params(0.8, 0, 1.0, 0.0));
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params(0.8, 0, 1.0, 0.0));
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
    }
}
