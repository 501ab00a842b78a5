//! SiLU and exp over a slice with AVX2 and AVX-512, bit-identical to the
//! scalar `exp::silu` (`x / (1 + libm::expf(-x))`) and `exp::expf_floored`,
//! so the DeltaNet conv and the sampler that use them (`kernels::act`) give
//! the same result whichever path runs them.
//!
//! The SIMD versions evaluate libm's `expf` (FreeBSD's `e_expf.c`) lane by
//! lane with the same f32 operations in the same order: `k` from `x / ln 2`
//! (truncated after adding +-0.5, or +-1 between 0.5 and 1.5 ln 2, or 0),
//! the two-part reduction by `ln 2`, the rational approximation with its
//! division, then the scale by `2^k` (one exact multiply while the result
//! stays normal). IEEE f32 add, multiply and divide round the same in a
//! vector lane as in a scalar register, and nothing is fused. A group of
//! lanes holding a NaN or an input beyond +-80 (where libm takes its
//! overflow, underflow and subnormal branches) runs the scalar code instead,
//! except that the exp kernels give 0 below -80 as `expf_floored` does.

use core::arch::x86_64::*;

use crate::exp::{expf_floored, silu};

/// libm `expf`'s constants (`e_expf.c`).
mod k {
    pub const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    pub const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    pub const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
    pub const P1: f32 = f32::from_bits(0x3e2a_aa8f);
    pub const P2: f32 = f32::from_bits(0xbb35_5215);
    /// |x| above 1.5 ln 2: `k` from the product.
    pub const BIG: i32 = 0x3f85_1592;
    /// |x| above 0.5 ln 2: `k = +-1` (or the product, above [`BIG`]).
    pub const MID: i32 = 0x3eb1_7218;
    /// |x| at most 2^-14: `expf(x) = 1 + x`.
    pub const TINY: i32 = 0x3900_0000;
    /// Inputs up to this magnitude keep libm off its special branches.
    pub const SAFE: f32 = 80.0;
}

/// `expf` of 16 lanes, each `|x| <= k::SAFE` (no NaN).
#[inline]
#[target_feature(enable = "avx512f")]
fn expf16(x: __m512) -> __m512 {
    let hx = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fff_ffff));
    let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
    let half = _mm512_mask_blend_ps(neg, _mm512_set1_ps(0.5), _mm512_set1_ps(-0.5));
    let kbig =
        _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(k::INV_LN2), x), half));
    let kmid = _mm512_mask_blend_epi32(neg, _mm512_set1_epi32(1), _mm512_set1_epi32(-1));
    let big = _mm512_cmpgt_epi32_mask(hx, _mm512_set1_epi32(k::BIG));
    let mid = _mm512_cmpgt_epi32_mask(hx, _mm512_set1_epi32(k::MID));
    let ki = _mm512_maskz_mov_epi32(mid, _mm512_mask_blend_epi32(big, kmid, kbig));
    let kf = _mm512_cvtepi32_ps(ki);
    let hi = _mm512_sub_ps(x, _mm512_mul_ps(kf, _mm512_set1_ps(k::LN2_HI)));
    let lo = _mm512_mul_ps(kf, _mm512_set1_ps(k::LN2_LO));
    let xr = _mm512_sub_ps(hi, lo);
    let xx = _mm512_mul_ps(xr, xr);
    let p = _mm512_add_ps(_mm512_set1_ps(k::P1), _mm512_mul_ps(xx, _mm512_set1_ps(k::P2)));
    let c = _mm512_sub_ps(xr, _mm512_mul_ps(xx, p));
    let q = _mm512_div_ps(_mm512_mul_ps(xr, c), _mm512_sub_ps(_mm512_set1_ps(2.0), c));
    let y = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_add_ps(_mm512_sub_ps(q, lo), hi));
    let two_k = _mm512_slli_epi32::<23>(_mm512_add_epi32(ki, _mm512_set1_epi32(127)));
    let y = _mm512_mul_ps(y, _mm512_castsi512_ps(two_k));
    let tiny = _mm512_cmple_epi32_mask(hx, _mm512_set1_epi32(k::TINY));
    _mm512_mask_blend_ps(tiny, y, _mm512_add_ps(_mm512_set1_ps(1.0), x))
}

/// `kernels::act::silu_in_place` with AVX-512.
///
/// # Safety
/// AVX-512 F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu512(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` holds 16 floats.
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        let ok = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(k::SAFE));
        if ok != 0xFFFF {
            c.iter_mut().for_each(|v| *v = silu(*v));
            continue;
        }
        let e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), v));
        let r = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(c.as_mut_ptr(), r) };
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v = silu(*v));
}

/// `kernels::act::exp_in_place` with AVX-512.
///
/// # Safety
/// AVX-512 F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp512(x: &mut [f32]) {
    let (safe, low) = (_mm512_set1_ps(k::SAFE), _mm512_set1_ps(-k::SAFE));
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` holds 16 floats.
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        // Below -80 is 0; NaN or above 80 takes the scalar code.
        if _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, safe) != 0xFFFF {
            c.iter_mut().for_each(|v| *v = expf_floored(*v));
            continue;
        }
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, low);
        let e = expf16(_mm512_max_ps(v, low));
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(c.as_mut_ptr(), _mm512_maskz_mov_ps(!under, e)) };
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v = expf_floored(*v));
}

/// `expf` of 8 lanes, each `|x| <= k::SAFE` (no NaN).
#[inline]
#[target_feature(enable = "avx2")]
fn expf8(x: __m256) -> __m256 {
    let hx = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
    let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps());
    let half = _mm256_blendv_ps(_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5), neg);
    let kbig =
        _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(k::INV_LN2), x), half));
    let kmid = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(_mm256_set1_epi32(1)),
        _mm256_castsi256_ps(_mm256_set1_epi32(-1)),
        neg,
    ));
    let big = _mm256_cmpgt_epi32(hx, _mm256_set1_epi32(k::BIG));
    let mid = _mm256_cmpgt_epi32(hx, _mm256_set1_epi32(k::MID));
    let ki = _mm256_and_si256(mid, _mm256_blendv_epi8(kmid, kbig, big));
    let kf = _mm256_cvtepi32_ps(ki);
    let hi = _mm256_sub_ps(x, _mm256_mul_ps(kf, _mm256_set1_ps(k::LN2_HI)));
    let lo = _mm256_mul_ps(kf, _mm256_set1_ps(k::LN2_LO));
    let xr = _mm256_sub_ps(hi, lo);
    let xx = _mm256_mul_ps(xr, xr);
    let p = _mm256_add_ps(_mm256_set1_ps(k::P1), _mm256_mul_ps(xx, _mm256_set1_ps(k::P2)));
    let c = _mm256_sub_ps(xr, _mm256_mul_ps(xx, p));
    let q = _mm256_div_ps(_mm256_mul_ps(xr, c), _mm256_sub_ps(_mm256_set1_ps(2.0), c));
    let y = _mm256_add_ps(_mm256_set1_ps(1.0), _mm256_add_ps(_mm256_sub_ps(q, lo), hi));
    let two_k = _mm256_slli_epi32::<23>(_mm256_add_epi32(ki, _mm256_set1_epi32(127)));
    let y = _mm256_mul_ps(y, _mm256_castsi256_ps(two_k));
    let tiny = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(k::TINY + 1), hx));
    _mm256_blendv_ps(y, _mm256_add_ps(_mm256_set1_ps(1.0), x), tiny)
}

/// `kernels::act::silu_in_place` with AVX2.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn silu256(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        let a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
        let ok = _mm256_cmp_ps::<_CMP_LE_OQ>(a, _mm256_set1_ps(k::SAFE));
        if _mm256_movemask_ps(ok) != 0xFF {
            c.iter_mut().for_each(|v| *v = silu(*v));
            continue;
        }
        let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        let r = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), r) };
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v = silu(*v));
}

/// `kernels::act::exp_in_place` with AVX2.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn exp256(x: &mut [f32]) {
    let (safe, low) = (_mm256_set1_ps(k::SAFE), _mm256_set1_ps(-k::SAFE));
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(v, safe)) != 0xFF {
            c.iter_mut().for_each(|v| *v = expf_floored(*v));
            continue;
        }
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(v, low);
        let e = expf8(_mm256_max_ps(v, low));
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), _mm256_andnot_ps(under, e)) };
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v = expf_floored(*v));
}
