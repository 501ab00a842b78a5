//! The portable kernels: the twin every SIMD kernel is tested against, and
//! the path on CPUs without AVX2 (llama.cpp's generic `quants.c` in that
//! role). A weight row is decoded to f32 once (`Linear::decode_row`) and
//! dotted with each token's activations; the attention kernels take the
//! same shapes as their SIMD twins.

use crate::simd::types::{DeltaToken, KvElem, Mat, MatMut, TILE};
use crate::weights::Linear;

/// One weight row `r` against `n` tokens of `x` (`[n, cols]`, unpermuted):
/// `out[t] = dot(W[r], x[t])`. `scratch` holds at least `cols` floats.
pub fn row(
    w: &Linear<'_>,
    r: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32; TILE],
    scratch: &mut [f32],
) {
    let cols = w.cols();
    let buf = &mut scratch[..cols];
    w.decode_row(r, buf);
    for (t, o) in out.iter_mut().enumerate().take(n) {
        *o = dot(buf, &x[t * cols..(t + 1) * cols]);
    }
}

/// Dot product of equal-length slices, with 8 partial sums.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// Wrapping sum of `buf` (the portable read-bandwidth probe).
pub fn read_sum(buf: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut c = buf.chunks_exact(8);
    for line in &mut c {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(line[i]);
        }
    }
    let tail = c.remainder().iter().fold(0u64, |a, b| a.wrapping_add(*b));
    acc.iter().fold(tail, |a, b| a.wrapping_add(*b))
}

/// One token of the gated delta rule on one head's state `s` (`[dk, dv]`,
/// row `i` belongs to key dim `i`), decay `g` and write strength `beta`:
///
/// ```text
/// u = S^T k                    [dv]  (old state)
/// d = beta * (v - g * u)       [dv]  (= beta (v - (g S)^T k))
/// S = g * S + k d^T            [dk, dv]
/// o = S^T q                    [dv]  (new state)
/// ```
///
/// `u` is scratch of `dv` floats; `o` receives the output.
pub fn delta_step(s: &mut [f32], t: &DeltaToken<'_>, u: &mut [f32], o: &mut [f32]) {
    let (dv, g, beta) = (t.v.len(), t.g, t.beta);
    u.fill(0.0);
    for (row, &ki) in s.chunks_exact(dv).zip(t.k) {
        for (a, sv) in u.iter_mut().zip(row) {
            *a += sv * ki;
        }
    }
    for (d, vv) in u.iter_mut().zip(t.v) {
        *d = beta * (vv - g * *d);
    }
    o.fill(0.0);
    for (row, (&ki, &qi)) in s.chunks_exact_mut(dv).zip(t.k.iter().zip(t.q)) {
        for ((sv, d), ov) in row.iter_mut().zip(&*u).zip(o.iter_mut()) {
            *sv = g * *sv + ki * d;
            *ov += qi * *sv;
        }
    }
}

/// `C[m, n] += A[m, k] B[k, n]` on row-major views (the twin of
/// `simd::avx512::gemm_acc`; sums over `k` in order).
pub fn gemm_acc(m: usize, n: usize, k: usize, a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>) {
    for i in 0..m {
        let crow = &mut c.data[i * c.ld..i * c.ld + n];
        for p in 0..k {
            let aip = a.data[i * a.ld + p];
            let brow = &b.data[p * b.ld..p * b.ld + n];
            for (cv, bv) in crow.iter_mut().zip(brow) {
                *cv += aip * bv;
            }
        }
    }
}

/// Scores of `g` query heads (`q`: `[g, hd]`) against `n` keys (row `s` at
/// `keys[s * stride..][..hd]`), times `scale`: `out[gi * ostride + s]`.
#[allow(clippy::too_many_arguments)]
pub fn scores<E: KvElem>(
    q: &[f32],
    g: usize,
    hd: usize,
    keys: &[E],
    stride: usize,
    n: usize,
    out: &mut [f32],
    ostride: usize,
    scale: f32,
) {
    for s in 0..n {
        let k = &keys[s * stride..s * stride + hd];
        for gi in 0..g {
            out[gi * ostride + s] = dot8(&q[gi * hd..(gi + 1) * hd], k) * scale;
        }
    }
}

/// Dot product with 8 partial sums (as [`dot`]).
fn dot8<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y.to_f32()).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i].to_f32();
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `o[gi] += sum_s p[gi * pstride + s] * value[s]` for `g` heads (`o`:
/// `[g, hd]`) over `n` value rows (row `s` at `values[s * stride..][..hd]`).
#[allow(clippy::too_many_arguments)]
pub fn accumulate<E: KvElem>(
    p: &[f32],
    pstride: usize,
    g: usize,
    hd: usize,
    values: &[E],
    stride: usize,
    n: usize,
    o: &mut [f32],
) {
    for s in 0..n {
        let v = &values[s * stride..s * stride + hd];
        for gi in 0..g {
            let w = p[gi * pstride + s];
            for (a, b) in o[gi * hd..(gi + 1) * hd].iter_mut().zip(v) {
                *a += w * b.to_f32();
            }
        }
    }
}

/// `x = exp(x - m)` in place on `libm::expf` (which the SIMD paths'
/// polynomial, `exp::exp`, matches to 1 ulp: the generic path keeps the
/// engine's numerics before the polynomial existed, bit for bit); returns
/// the sum of the results.
pub fn exp_shift_sum(x: &mut [f32], m: f32) -> f32 {
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = libm::expf(*v - m);
        sum += *v;
    }
    sum
}
