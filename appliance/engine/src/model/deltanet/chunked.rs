//! The chunked (WY / UT-transform) form of the gated delta rule, for
//! prefill: `CHUNK` tokens at a time through dense products instead of one
//! rank-1 state update per token. Same result as the recurrence up to float
//! rounding (the tests below hold them together).
//!
//! Per value head, with state `S0` (`[dk, dv]`) at the start of a chunk of
//! `L` tokens, decays `g_t`, `G_t = g_0 ... g_t` and `D[t][s] = G_t / G_s`
//! (computed as products, never as a quotient or an exp):
//!
//! ```text
//! S_t = G_t S0 + sum_{s<=t} D[t][s] k_s d_s^T            (unrolled recurrence)
//! d_t = beta_t (v_t - G_t S0^T k_t - sum_{s<t} D[t][s] (k_t.k_s) d_s)
//!  => (I + A) d = beta v - (beta G k) S0,   A[t][s] = beta_t D[t][s] (k_t.k_s), s < t
//!     W_v = (I+A)^-1 beta v,  W_k = (I+A)^-1 (beta G k)     (forward substitution)
//!     d   = W_v - W_k S0
//! o_t = S_t^T q_t = (G q)_t S0 + sum_{s<=t} D[t][s] (q_t.k_s) d_s
//! S_L = G_{L-1} S0 + sum_s D[L-1][s] k_s d_s^T
//! ```
//!
//! `(I + A)^-1` comes from a forward substitution on the small `[L, L]`
//! matrix; every product is a [`gemm_acc_with`] (AVX-512 tiles or the
//! generic twin).

use alloc::vec;
use alloc::vec::Vec;

use crate::kernels::{gemm_acc_with, Mat, MatMut};
use crate::simd::Path;

/// Tokens per chunk.
pub(crate) const CHUNK: usize = 32;

/// One value head's inputs over a sequence. Token `t`'s query, key and
/// value start at `rows[t * stride + q]`, `.. + k]`, `.. + v]`; its decay
/// (`exp(g)`) and beta at `decay[t * gb_stride + gb]`, `beta[..]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadSeq<'a> {
    pub rows: &'a [f32],
    pub stride: usize,
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub decay: &'a [f32],
    pub beta: &'a [f32],
    pub gb_stride: usize,
    pub gb: usize,
    pub tokens: usize,
    pub dk: usize,
    pub dv: usize,
}

/// One chunk's buffers (allocated once per head, reused across chunks).
struct Work {
    /// Keys `[L, dk]`, then queries scaled by `G` `[L, dk]`.
    kc: Vec<f32>,
    qc: Vec<f32>,
    /// Keys transposed `[dk, L]` (scaled by `D[L-1][s]` for the state update).
    kt: Vec<f32>,
    /// `k.k` then `-A` `[L, L]`; `q.k` then the decayed causal scores `[L, L]`.
    kk: Vec<f32>,
    qk: Vec<f32>,
    /// `D` `[L, L]`, lower triangle.
    dm: Vec<f32>,
    /// `beta v` `[L, dv]` and `beta G k` `[L, dk]`.
    bv: Vec<f32>,
    bk: Vec<f32>,
    /// `(I + A)^-1` `[L, L]`.
    inv: Vec<f32>,
    /// `W_v` then `d` `[L, dv]`; `W_k` `[L, dk]`.
    wv: Vec<f32>,
    wk: Vec<f32>,
    /// Outputs `[L, dv]`.
    o: Vec<f32>,
    /// Decays and their running products `G` `[L]`.
    g: Vec<f32>,
    gc: Vec<f32>,
}

impl Work {
    fn new(dk: usize, dv: usize) -> Self {
        let c = CHUNK;
        Work {
            kc: vec![0.0; c * dk],
            qc: vec![0.0; c * dk],
            kt: vec![0.0; dk * c],
            kk: vec![0.0; c * c],
            qk: vec![0.0; c * c],
            dm: vec![0.0; c * c],
            bv: vec![0.0; c * dv],
            bk: vec![0.0; c * dk],
            inv: vec![0.0; c * c],
            wv: vec![0.0; c * dv],
            wk: vec![0.0; c * dk],
            o: vec![0.0; c * dv],
            g: vec![0.0; c],
            gc: vec![0.0; c],
        }
    }
}

/// Runs every token of `seq` through one head's state `s` (`[dk, dv]`), in
/// chunks of [`CHUNK`]; `emit(t, o)` receives token `t`'s output `S_t^T q_t`
/// (`[dv]`, in token order; it may modify the slice, which is scratch).
pub(crate) fn run_head(
    path: Path,
    seq: &HeadSeq<'_>,
    s: &mut [f32],
    mut emit: impl FnMut(usize, &mut [f32]),
) {
    assert_eq!(s.len(), seq.dk * seq.dv, "chunked delta rule: state shape");
    let mut w = Work::new(seq.dk, seq.dv);
    let mut t0 = 0;
    while t0 < seq.tokens {
        let l = (seq.tokens - t0).min(CHUNK);
        chunk(path, seq, t0, l, s, &mut w);
        for (r, o) in w.o.chunks_exact_mut(seq.dv).take(l).enumerate() {
            emit(t0 + r, o);
        }
        t0 += l;
    }
}

/// Tokens `t0..t0+l` through state `s`; outputs land in `w.o`.
fn chunk(path: Path, seq: &HeadSeq<'_>, t0: usize, l: usize, s: &mut [f32], w: &mut Work) {
    let (dk, dv) = (seq.dk, seq.dv);
    gather(seq, t0, l, w);
    decay_matrix(l, &w.g, &mut w.dm);
    for (i, row) in w.kt.chunks_exact_mut(l).take(dk).enumerate() {
        for (s, x) in row.iter_mut().enumerate() {
            *x = w.kc[s * dk + i];
        }
    }
    // k.k and q.k for every pair in the chunk.
    let kt = Mat { data: &w.kt, ld: l };
    for (x, y) in [(&w.kc, &mut w.kk), (&w.qc, &mut w.qk)] {
        y[..l * l].fill(0.0);
        gemm_acc_with(path, l, l, dk, Mat { data: x, ld: dk }, kt, MatMut { data: y, ld: l });
    }
    for r in 0..l {
        let (beta, dm) = (seq.beta[(t0 + r) * seq.gb_stride + seq.gb], &w.dm[r * l..r * l + l]);
        let (kk, qk) = (&mut w.kk[r * l..r * l + l], &mut w.qk[r * l..r * l + l]);
        for s in 0..l {
            kk[s] = if s < r { -beta * kk[s] * dm[s] } else { 0.0 };
            qk[s] = if s <= r { qk[s] * dm[s] } else { 0.0 };
        }
    }
    // W = (I + A)^-1 [beta v | beta G k]: the inverse (lower, unit
    // diagonal) by forward substitution, then two products.
    invert_unit_lower(l, &w.kk, &mut w.inv);
    let inv = Mat { data: &w.inv, ld: l };
    for (x, n, y) in [(&w.bv, dv, &mut w.wv), (&w.bk, dk, &mut w.wk)] {
        y[..l * n].fill(0.0);
        gemm_acc_with(path, l, n, l, inv, Mat { data: x, ld: n }, MatMut { data: y, ld: n });
    }
    // d = W_v - W_k S0 (W_k negated in place first).
    w.wk[..l * dk].iter_mut().for_each(|x| *x = -*x);
    let s0 = Mat { data: s, ld: dv };
    gemm_acc_with(
        path,
        l,
        dv,
        dk,
        Mat { data: &w.wk, ld: dk },
        s0,
        MatMut { data: &mut w.wv, ld: dv },
    );
    // o = (G q) S0 + P d.
    for (r, row) in w.qc.chunks_exact_mut(dk).take(l).enumerate() {
        row.iter_mut().for_each(|x| *x *= w.gc[r]);
    }
    w.o[..l * dv].fill(0.0);
    gemm_acc_with(
        path,
        l,
        dv,
        dk,
        Mat { data: &w.qc, ld: dk },
        s0,
        MatMut { data: &mut w.o, ld: dv },
    );
    let d = Mat { data: &w.wv, ld: dv };
    gemm_acc_with(path, l, dv, l, Mat { data: &w.qk, ld: l }, d, MatMut { data: &mut w.o, ld: dv });
    // S = G_{L-1} S0 + (D[L-1][s] k_s)^T d.
    let last = &w.dm[(l - 1) * l..l * l];
    for row in w.kt.chunks_exact_mut(l).take(dk) {
        row.iter_mut().zip(last).for_each(|(x, f)| *x *= f);
    }
    let g_all = w.gc[l - 1];
    s.iter_mut().for_each(|x| *x *= g_all);
    gemm_acc_with(path, dk, dv, l, Mat { data: &w.kt, ld: l }, d, MatMut { data: s, ld: dv });
}

/// Copies the chunk's keys, queries, decays and right-hand sides into `w`.
fn gather(seq: &HeadSeq<'_>, t0: usize, l: usize, w: &mut Work) {
    let (dk, dv) = (seq.dk, seq.dv);
    let mut run = 1.0f32;
    for r in 0..l {
        let (t, at) = (t0 + r, (t0 + r) * seq.gb_stride + seq.gb);
        let row = &seq.rows[t * seq.stride..];
        let (g, beta) = (seq.decay[at], seq.beta[at]);
        run = flush(run * g);
        (w.g[r], w.gc[r]) = (g, run);
        let k = &row[seq.k..seq.k + dk];
        w.kc[r * dk..(r + 1) * dk].copy_from_slice(k);
        w.qc[r * dk..(r + 1) * dk].copy_from_slice(&row[seq.q..seq.q + dk]);
        let bv = &mut w.bv[r * dv..(r + 1) * dv];
        bv.iter_mut().zip(&row[seq.v..seq.v + dv]).for_each(|(x, v)| *x = beta * v);
        let bk = &mut w.bk[r * dk..(r + 1) * dk];
        bk.iter_mut().zip(k).for_each(|(x, k)| *x = beta * run * k);
    }
}

/// `D[t][s] = g_{s+1} ... g_t` for `s <= t` (1 on the diagonal), 0 above,
/// row by row: row `t` is row `t-1` times `g_t`.
fn decay_matrix(l: usize, g: &[f32], dm: &mut [f32]) {
    dm[..l * l].fill(0.0);
    for t in 0..l {
        if t > 0 {
            let (prev, cur) = dm.split_at_mut(t * l);
            let prev = &prev[(t - 1) * l..(t - 1) * l + t];
            cur[..t].iter_mut().zip(prev).for_each(|(x, p)| *x = flush(p * g[t]));
        }
        dm[t * l + t] = 1.0;
    }
}

/// Decay products below this are taken as 0: a product of decays reaches
/// the denormal range within a chunk when decays are small (0.05^32 is
/// 2e-42), and every product with a denormal costs ~100x on x86; terms
/// scaled by less than 1e-20 change nothing in f32 next to the current
/// token's own (diagonal, factor 1) term.
const FLUSH: f32 = 1e-20;

/// `x`, or 0 below [`FLUSH`] (decay products are never negative).
#[inline]
fn flush(x: f32) -> f32 {
    if x < FLUSH {
        0.0
    } else {
        x
    }
}

/// `inv = (I - N)^-1` for a strictly lower `N` (`n`, `[l, l]`, holding
/// `-A`): row `t` is `e_t + sum_{r<t} N[t][r] inv_r` (rows of a unit lower
/// triangle; `l^3 / 6` multiply-adds, small next to the products).
fn invert_unit_lower(l: usize, n: &[f32], inv: &mut [f32]) {
    inv[..l * l].fill(0.0);
    for t in 0..l {
        let (done, rest) = inv.split_at_mut(t * l);
        let row = &mut rest[..l];
        row[t] = 1.0;
        for r in 0..t {
            let f = n[t * l + r];
            let src = &done[r * l..r * l + r + 1];
            row[..=r].iter_mut().zip(src).for_each(|(x, s)| *x += f * s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{delta_step_with, DeltaToken};

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
        fn unit(&mut self, n: usize) -> Vec<f32> {
            let v: Vec<f32> = (0..n).map(|_| self.f()).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter().map(|x| x / norm).collect()
        }
    }

    /// Random unit q/k rows (q scaled by 1/sqrt(dk) as the model does),
    /// values in [-1, 1], decays in `g_range`, betas in (0, 1); two heads
    /// interleaved in one row layout so strides and offsets matter.
    struct Case {
        rows: Vec<f32>,
        decay: Vec<f32>,
        beta: Vec<f32>,
        s0: Vec<f32>,
    }

    fn case(rng: &mut Rng, t: usize, dk: usize, dv: usize, g_range: (f32, f32)) -> Case {
        let stride = 2 * dk + 2 * dv;
        let mut rows = Vec::with_capacity(t * stride);
        for _ in 0..t {
            for _ in 0..2 {
                rows.extend(rng.unit(dk).iter().map(|x| x / (dk as f32).sqrt()));
            }
            rows.extend(rng.unit(dk));
            rows.extend((0..2 * dv - dk).map(|_| rng.f()));
        }
        let (lo, hi) = g_range;
        let decay = (0..2 * t).map(|_| lo + (hi - lo) * (0.5 + 0.5 * rng.f())).collect();
        let beta = (0..2 * t).map(|_| 0.5 + 0.49 * rng.f()).collect();
        let s0 = (0..dk * dv).map(|_| 0.5 * rng.f()).collect();
        Case { rows, decay, beta, s0 }
    }

    fn seq(c: &Case, t: usize, dk: usize, dv: usize) -> HeadSeq<'_> {
        // Head 1 of 2: query at dk, key at 2 dk, value after the first value head.
        HeadSeq {
            rows: &c.rows,
            stride: 2 * dk + 2 * dv,
            q: dk,
            k: 2 * dk,
            v: 3 * dk + dv - dk,
            decay: &c.decay,
            beta: &c.beta,
            gb_stride: 2,
            gb: 1,
            tokens: t,
            dk,
            dv,
        }
    }

    fn recurrent(path: Path, sq: &HeadSeq<'_>, s: &mut [f32]) -> Vec<f32> {
        let (dk, dv) = (sq.dk, sq.dv);
        let (mut out, mut u) = (vec![0.0; sq.tokens * dv], vec![0.0; dv]);
        for t in 0..sq.tokens {
            let row = &sq.rows[t * sq.stride..];
            let at = t * sq.gb_stride + sq.gb;
            let tok = DeltaToken {
                k: &row[sq.k..sq.k + dk],
                q: &row[sq.q..sq.q + dk],
                v: &row[sq.v..sq.v + dv],
                g: sq.decay[at],
                beta: sq.beta[at],
            };
            delta_step_with(path, s, &tok, &mut u, &mut out[t * dv..(t + 1) * dv]);
        }
        out
    }

    fn chunked(path: Path, sq: &HeadSeq<'_>, s: &mut [f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; sq.tokens * sq.dv];
        let mut next = 0;
        run_head(path, sq, s, |t, o| {
            assert_eq!(t, next, "tokens in order");
            next += 1;
            out[t * sq.dv..(t + 1) * sq.dv].copy_from_slice(o);
        });
        assert_eq!(next, sq.tokens);
        out
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 5e-6, "{what}: max |diff| {worst}");
    }

    #[test]
    fn chunked_equals_recurrent() {
        let mut rng = Rng(0xC4A11);
        let lens = [1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 200];
        let decays = [(0.9, 1.0), (0.999, 1.0), (1e-6, 0.05), (0.0, 1.0)];
        for path in Path::ALL.into_iter().filter(|p| p.supported()) {
            for &(dk, dv) in &[(32, 32), (16, 48), (128, 128)] {
                for &t in &lens {
                    for &g in &decays {
                        if dk == 128 && t > 65 && g != (0.9, 1.0) {
                            continue; // the big head once per length is enough
                        }
                        let c = case(&mut rng, t, dk, dv, g);
                        let sq = seq(&c, t, dk, dv);
                        let (mut s1, mut s2) = (c.s0.clone(), c.s0.clone());
                        let want = recurrent(Path::Generic, &sq, &mut s1);
                        let got = chunked(path, &sq, &mut s2);
                        let what = format!("{} dk {dk} dv {dv} T {t} decay {g:?}", path.name());
                        close(&got, &want, &format!("{what} outputs"));
                        close(&s2, &s1, &format!("{what} state"));
                    }
                }
            }
        }
    }

    #[test]
    fn decay_one_and_zero_are_exact_limits() {
        // g = 1 everywhere: plain delta rule; g = 0: every token starts from
        // an empty state, so o_t = beta_t (q_t.k_t) v_t.
        let mut rng = Rng(7);
        let (t, dk, dv) = (70, 16, 16);
        for g in [1.0f32, 0.0] {
            let mut c = case(&mut rng, t, dk, dv, (g, g));
            c.decay.iter_mut().for_each(|x| *x = g);
            let sq = seq(&c, t, dk, dv);
            let (mut s1, mut s2) = (c.s0.clone(), c.s0.clone());
            let want = recurrent(Path::Generic, &sq, &mut s1);
            let got = chunked(Path::Generic, &sq, &mut s2);
            close(&got, &want, &format!("decay {g} outputs"));
            close(&s2, &s1, &format!("decay {g} state"));
            if g == 0.0 {
                let row = &c.rows[(t - 1) * sq.stride..];
                let qk: f32 = (0..dk).map(|i| row[sq.q + i] * row[sq.k + i]).sum();
                let beta = c.beta[(t - 1) * 2 + 1];
                for j in 0..dv {
                    let o = beta * qk * row[sq.v + j];
                    assert!((got[(t - 1) * dv + j] - o).abs() < 1e-6, "g = 0 output {j}");
                }
            }
        }
    }
}
