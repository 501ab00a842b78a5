//! `e^x` as every kernel path computes it: a branch-free polynomial evaluated
//! in f64 (range reduction by `ln 2`, degree-9 Taylor polynomial, error below
//! 1e-11 before the final rounding to f32), so it is correctly rounded in all
//! but about 1 in 10^5 inputs, like `libm::expf`, and vectorises; and the
//! scalar SiLU and floored `expf` that `simd::silu` matches bit for bit. A
//! leaf module: `ops` (scalar), the generic kernels and the SIMD kernels
//! (lanes) all build on it.

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

/// SiLU: `x * sigmoid(x)`, as `x / (1 + libm::expf(-x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + libm::expf(-x))
}

/// `libm::expf(x)`, or 0 for `x < -80` (where `expf` is below 2e-35): the
/// weights of a softmax, `x` being a logit minus the largest.
pub fn expf_floored(x: f32) -> f32 {
    if x < -80.0 {
        0.0
    } else {
        libm::expf(x)
    }
}
