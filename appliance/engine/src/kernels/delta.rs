//! Gated DeltaNet kernels: one token of the delta rule on one head's state
//! ([`delta_step_with`], decode and short batches) and the small dense f32
//! products of the chunked prefill form ([`gemm_acc_with`], used by
//! `model::deltanet::chunked`). Portable twins live in [`super::generic`];
//! `tests/kernels_agree.rs` checks every path against them.

use super::dispatch::{self, Isa};
use crate::simd::types::{DeltaToken, Mat, MatMut};
use crate::simd::Path;

/// One token of the gated delta rule on one head's state `s` (`[dk, dv]`,
/// see [`super::generic::delta_step`]) on `path` (AVX-512 for `dv % 16 ==
/// 0`, AVX2 for `dv % 8 == 0`, else the generic twin); `u` is scratch of
/// `dv` floats, `o` receives `S^T q` of the new state.
///
/// # Panics
/// On shape mismatches, or if `path` is not supported by this CPU.
pub fn delta_step_with(
    path: Path,
    s: &mut [f32],
    t: &DeltaToken<'_>,
    u: &mut [f32],
    o: &mut [f32],
) {
    let (dk, dv) = (t.k.len(), t.v.len());
    assert!(
        s.len() == dk * dv && t.q.len() == dk && u.len() >= dv && o.len() == dv,
        "delta_step shapes"
    );
    dispatch::delta_step(Isa::new(path), s, t, u, o);
}

/// `C[m, n] += A[m, k] B[k, n]` on `path` (AVX-512 tiles of 8 x 32, else
/// the generic twin).
///
/// # Panics
/// If a view is too short for its shape, or `path` is not supported by this CPU.
pub fn gemm_acc_with(
    path: Path,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: MatMut<'_>,
) {
    let isa = Isa::new(path);
    if m == 0 || n == 0 {
        return;
    }
    let fits = |len: usize, rows: usize, cols: usize, ld: usize| {
        rows == 0 || (cols <= ld && (rows - 1) * ld + cols <= len)
    };
    assert!(
        fits(a.data.len(), m, k, a.ld) && fits(b.data.len(), k, n, b.ld),
        "gemm_acc input shapes"
    );
    assert!(fits(c.data.len(), m, n, c.ld), "gemm_acc output shape");
    dispatch::gemm_acc(isa, m, n, k, a, b, c);
}
