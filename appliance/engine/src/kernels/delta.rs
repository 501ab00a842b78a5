//! Gated DeltaNet kernels: one token of the delta rule on one head's state
//! ([`delta_step`], decode and short batches) and the small dense f32
//! products of the chunked prefill form ([`gemm_acc`], used by
//! `model::deltanet::chunked`). Portable twins live in [`super::generic`];
//! `tests/kernels_agree.rs` checks every path against them.

use crate::simd::Path;

/// One token's inputs to the gated delta rule on one value head.
#[derive(Clone, Copy, Debug)]
pub struct DeltaToken<'a> {
    /// Key `[dk]` (L2-normalised).
    pub k: &'a [f32],
    /// Query `[dk]` (L2-normalised, scaled by 1/sqrt(dk)).
    pub q: &'a [f32],
    /// Value `[dv]`.
    pub v: &'a [f32],
    /// Decay `exp(g)` in (0, 1].
    pub g: f32,
    /// Write strength in (0, 1).
    pub beta: f32,
}

/// One token of the gated delta rule on one head's state `s` (`[dk, dv]`,
/// see [`super::generic::delta_step`]) with the active kernel path; `u` is
/// scratch of `dv` floats, `o` receives `S^T q` of the new state.
pub fn delta_step(s: &mut [f32], t: &DeltaToken<'_>, u: &mut [f32], o: &mut [f32]) {
    delta_step_with(crate::simd::active(), s, t, u, o);
}

/// [`delta_step`] with an explicit kernel path (AVX-512 for `dv % 16 == 0`,
/// else the generic twin).
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
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    #[cfg(target_arch = "x86_64")]
    if path.avx512() && dv % 16 == 0 {
        use crate::simd::avx512::delta_step as d;
        // SAFETY: AVX-512 is supported (asserted); shapes asserted above and
        // each `C` divides dv / 16.
        unsafe {
            match dv / 16 {
                n if n % 8 == 0 => d::<8>(s, t, o),
                n if n % 4 == 0 => d::<4>(s, t, o),
                n if n % 2 == 0 => d::<2>(s, t, o),
                _ => d::<1>(s, t, o),
            }
        }
        return;
    }
    super::generic::delta_step(s, t, &mut u[..dv], o);
}

/// A row-major f32 matrix view: element `(i, j)` is `data[i * ld + j]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    /// The elements (at least `(rows - 1) * ld + cols` of them).
    pub data: &'a [f32],
    /// Row stride in elements.
    pub ld: usize,
}

/// A mutable [`Mat`].
#[derive(Debug)]
pub struct MatMut<'a> {
    /// The elements (at least `(rows - 1) * ld + cols` of them).
    pub data: &'a mut [f32],
    /// Row stride in elements.
    pub ld: usize,
}

/// `C[m, n] += A[m, k] B[k, n]` with the active kernel path.
pub fn gemm_acc(m: usize, n: usize, k: usize, a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>) {
    gemm_acc_with(crate::simd::active(), m, n, k, a, b, c);
}

/// [`gemm_acc`] with an explicit kernel path (AVX-512 tiles of 8 x 32, else
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
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    #[cfg(target_arch = "x86_64")]
    if path.avx512() {
        // SAFETY: AVX-512 is supported (asserted); every view holds its
        // shape (asserted above).
        unsafe { crate::simd::avx512::gemm_acc(m, n, k, a, b, c) };
        return;
    }
    super::generic::gemm_acc(m, n, k, a, b, c);
}
