//! Attention kernels over the KV cache, with their generic twins and
//! per-path dispatch: scores of a group of query heads against key rows,
//! weighted sums of value rows, and the exp of a softmax.
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

use super::dispatch::{self, Isa};
use crate::simd::types::KvElem;
use crate::simd::Path;

/// Checks that `n` rows of `hd` elements, `stride` apart, fit in `len`.
fn rows_fit(len: usize, n: usize, hd: usize, stride: usize) -> bool {
    n == 0 || (stride >= hd && (n - 1) * stride + hd <= len)
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
    dispatch::scores(Isa::new(path), q, g, hd, keys, stride, n, out, ostride, scale);
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
    dispatch::accumulate(Isa::new(path), p, pstride, g, hd, values, stride, n, o);
}

/// `x = exp(x - m)` in place; returns the sum of the results. The SIMD
/// paths run `exp::exp`'s polynomial, the generic one `libm::expf` (within
/// 1 ulp of each other).
///
/// # Panics
/// If `path` is not supported by this CPU.
pub fn exp_shift_sum(path: Path, x: &mut [f32], m: f32) -> f32 {
    dispatch::exp_shift_sum(Isa::new(path), x, m)
}
