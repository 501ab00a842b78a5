//! Attention kernels over the KV cache and a vectorised exp, with their
//! generic twins and runtime dispatch ([`Path`]).
//!
//! The KV cache holds f32 or f16 (as raw `u16` bits) elements ([`KvElem`]);
//! rows of `hd` elements sit `stride` elements apart (`[positions, kv_heads,
//! head_dim]`, so `stride = kv_heads * head_dim`). A group of `g` query heads
//! (grouped-query attention) is processed against each key row at once:
//!
//! ```text
//! scores:     out[gi * ostride + s] = (q[gi] . key[s]) * scale
//! accumulate: o[gi] += sum_s p[gi * pstride + s] * value[s]
//! exp_shift_sum: x = exp(x - m), returns sum(x)
//! ```
//!
//! `tests/attn_kernels.rs` checks every path against the generic twin.

use super::Path;

/// An element type of the KV cache.
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    /// Whether the bits are IEEE f16 (`u16`); otherwise the type is `f32`.
    const F16: bool;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    const F16: bool = false;
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

/// f16 stored as its bits.
impl KvElem for u16 {
    const F16: bool = true;
    #[inline]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x).to_bits()
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
}

/// Checks that `n` rows of `hd` elements, `stride` apart, fit in `len`.
fn rows_fit(len: usize, n: usize, hd: usize, stride: usize) -> bool {
    n == 0 || (stride >= hd && (n - 1) * stride + hd <= len)
}

/// Whether `path` has SIMD attention kernels on this target.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn simd(path: Path) -> bool {
    cfg!(target_arch = "x86_64") && path != Path::Generic
}

/// Scores of `g` query heads (`q`: `[g, hd]`) against `n` keys (row `s` at
/// `keys[s * stride..][..hd]`), times `scale`: `out[gi * ostride + s]`.
///
/// # Panics
/// On out-of-bounds shapes or an unsupported `path`.
#[allow(clippy::too_many_arguments)]
pub fn scores<E: KvElem>(
    path: Path,
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
    assert!(q.len() >= g * hd && rows_fit(keys.len(), n, hd, stride), "scores: input shape");
    assert!(
        g == 0 || n == 0 || (ostride >= n && (g - 1) * ostride + n <= out.len()),
        "scores: out"
    );
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    #[cfg(target_arch = "x86_64")]
    if simd(path) {
        // SAFETY: the path is supported (checked above) and the shapes were checked.
        unsafe { super::attn_x86::scores(path, q, g, hd, keys, stride, n, out, ostride, scale) };
        return;
    }
    scores_generic(q, g, hd, keys, stride, n, out, ostride, scale);
}

/// `o[gi] += sum_s p[gi * pstride + s] * value[s]` for `g` heads (`o`:
/// `[g, hd]`) over `n` value rows (row `s` at `values[s * stride..][..hd]`).
///
/// # Panics
/// On out-of-bounds shapes or an unsupported `path`.
#[allow(clippy::too_many_arguments)]
pub fn accumulate<E: KvElem>(
    path: Path,
    p: &[f32],
    pstride: usize,
    g: usize,
    hd: usize,
    values: &[E],
    stride: usize,
    n: usize,
    o: &mut [f32],
) {
    assert!(o.len() >= g * hd && rows_fit(values.len(), n, hd, stride), "accumulate: shape");
    assert!(
        g == 0 || n == 0 || (pstride >= n && (g - 1) * pstride + n <= p.len()),
        "accumulate: p"
    );
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    #[cfg(target_arch = "x86_64")]
    if simd(path) {
        // SAFETY: the path is supported (checked above) and the shapes were checked.
        unsafe { super::attn_x86::accumulate(path, p, pstride, g, hd, values, stride, n, o) };
        return;
    }
    accumulate_generic(p, pstride, g, hd, values, stride, n, o);
}

/// `x = exp(x - m)` in place; returns the sum of the results.
///
/// # Panics
/// If `path` is not supported by this CPU.
pub fn exp_shift_sum(path: Path, x: &mut [f32], m: f32) -> f32 {
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    #[cfg(target_arch = "x86_64")]
    if simd(path) {
        // SAFETY: the path is supported (checked above).
        return unsafe { super::attn_x86::exp_shift_sum(path, x, m) };
    }
    exp_shift_sum_generic(x, m)
}

/// Generic twin of [`scores`].
#[allow(clippy::too_many_arguments)]
fn scores_generic<E: KvElem>(
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

/// Dot product with 8 partial sums (as `kernels::generic::dot`).
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

/// Generic twin of [`accumulate`].
#[allow(clippy::too_many_arguments)]
fn accumulate_generic<E: KvElem>(
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

/// Generic twin of [`exp_shift_sum`], on `libm::expf` (which the SIMD
/// paths' polynomial, `exp::exp`, matches to 1 ulp: the generic path keeps
/// the engine's numerics before the polynomial existed, bit for bit).
fn exp_shift_sum_generic(x: &mut [f32], m: f32) -> f32 {
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = libm::expf(*v - m);
        sum += *v;
    }
    sum
}
