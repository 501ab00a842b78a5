//! Small element-wise and per-row operations of the Qwen3.5 model, in f32.
//!
//! [`exp`] is a branch-free polynomial evaluated in f64 (range reduction by
//! `ln 2`, degree-9 Taylor polynomial, error below 1e-11 before the final
//! rounding to f32), so it is correctly rounded in all but about 1 in 10^5
//! inputs, like `libm::expf`, and vectorises: `simd::attn` runs the same
//! algorithm on whole slices with AVX2 and AVX-512 ([`silu_mul`],
//! [`sigmoid_in_place`], [`softmax`]). The scalar [`silu`] and [`sigmoid`]
//! keep `libm::expf`.

/// `log2(e)`.
pub(crate) const EXP_LOG2E: f64 = core::f64::consts::LOG2_E;
/// `ln 2`.
pub(crate) const EXP_LN2: f64 = core::f64::consts::LN_2;
/// Inputs are clamped to `[EXP_LO, EXP_HI]`: below, the result rounds to 0;
/// above, it overflows to infinity. NaN stays NaN.
pub(crate) const EXP_LO: f32 = -110.0;
/// See [`EXP_LO`].
pub(crate) const EXP_HI: f32 = 89.0;
/// `1/k!` for `k = 9..=0`: the Taylor polynomial of `e^r` on
/// `|r| <= ln2/2`, highest degree first.
pub(crate) const EXP_C: [f64; 10] = [
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `e^x`: 0 for `x <= -104` (and `-inf`), infinity above ~88.72, NaN for
/// NaN; otherwise correctly rounded but for rare near-ties. Branch-free.
#[inline]
pub fn exp(x: f32) -> f32 {
    // `clamp` keeps NaN.
    let x = x.clamp(EXP_LO, EXP_HI);
    let x = f64::from(x);
    // Round to nearest even by the 1.5 * 2^52 trick (|x * log2e| < 2^51).
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    let n = (x * EXP_LOG2E + MAGIC) - MAGIC;
    let r = x - n * EXP_LN2;
    let mut p = EXP_C[0];
    for c in &EXP_C[1..] {
        p = p * r + c;
    }
    // 2^n is a normal f64 for n in [-159, 129]; the f32 rounding happens once.
    let scale = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (p * scale) as f32
}

/// SiLU: `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + libm::expf(-x))
}

/// Logistic sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-x))
}

/// `g = silu(g) * u` elementwise, with the active path's vectorised exp
/// (the SwiGLU of an MLP).
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    let path = crate::simd::active();
    for (gc, uc) in g.chunks_mut(256).zip(u.chunks(256)) {
        let mut e = [0.0f32; 256];
        let e = &mut e[..gc.len()];
        e.iter_mut().zip(gc.iter()).for_each(|(e, x)| *e = -x);
        crate::simd::attn::exp_shift_sum(path, e, 0.0);
        for ((x, e), u) in gc.iter_mut().zip(e.iter()).zip(uc) {
            *x = *x / (1.0 + e) * u;
        }
    }
}

/// `x = sigmoid(x)` elementwise, with the active path's vectorised exp.
pub fn sigmoid_in_place(x: &mut [f32]) {
    let path = crate::simd::active();
    for c in x.chunks_mut(256) {
        c.iter_mut().for_each(|v| *v = -*v);
        crate::simd::attn::exp_shift_sum(path, c, 0.0);
        c.iter_mut().for_each(|v| *v = 1.0 / (1.0 + *v));
    }
}

/// Softplus as torch computes it (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::log1pf(libm::expf(x))
    }
}

/// `1 / sqrt(mean(x^2) + eps)`.
pub fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / libm::sqrtf(ss / x.len() as f32 + eps)
}

/// Qwen3.5's zero-centred RMSNorm in place: `x * rsqrt(mean(x^2)+eps) * (1 + w)`.
pub fn rms_norm_1p(x: &mut [f32], w: &[f32], eps: f32) {
    let s = inv_rms(x, eps);
    for (v, w) in x.iter_mut().zip(w) {
        *v = *v * s * (1.0 + w);
    }
}

/// [`rms_norm_1p`] applied to each `w.len()`-wide row of `x`.
pub fn rms_norm_1p_rows(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        rms_norm_1p(row, w, eps);
    }
}

/// The DeltaNet output norm in place: `w * rmsnorm(x) * silu(z)` (plain `w`).
pub fn rms_norm_gated(x: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let s = inv_rms(x, eps);
    for ((v, w), z) in x.iter_mut().zip(w).zip(z) {
        *v = w * (*v * s) * silu(*z);
    }
}

/// L2-normalises `x` in place: `x / sqrt(sum(x^2) + eps)`.
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let s = 1.0 / libm::sqrtf(ss + eps);
    for v in x {
        *v *= s;
    }
}

/// Softmax in place (numerically stable), with the active kernel path's exp.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = crate::simd::attn::exp_shift_sum(crate::simd::active(), x, max);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Rotary position embedding, rotate-half convention, on the first
/// `2 * inv_freq.len()` dims of `x` (the rest pass through).
pub fn rope(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    let p = pos as f32;
    for (i, f) in inv_freq.iter().enumerate() {
        let angle = p * f;
        let (s, c) = (libm::sinf(angle), libm::cosf(angle));
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/// RoPE inverse frequencies for `rotary_dim` dims: `1 / theta^(2i / rotary_dim)`.
pub fn rope_inv_freq(theta: f64, rotary_dim: usize) -> alloc::vec::Vec<f32> {
    (0..rotary_dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / rotary_dim as f32;
            (1.0 / libm::pow(theta, e as f64)) as f32
        })
        .collect()
}
