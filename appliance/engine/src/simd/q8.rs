//! Row kernels for q8 weights (`Linear::Q8`: int8
//! with one F16 scale per 32 columns, the `q8` output head) on f32
//! activations, for AVX2 and AVX-512. Twin: `kernels::generic` (which scales
//! each weight before the dot product; these scale each block's partial sum).
//!
//! Per 32-column block: the int8 weights are widened to f32 once, each
//! token's partial dot product over the block is formed with FMAs, then one
//! FMA adds it times the block scale to the token's accumulator.

use core::arch::x86_64::*;

use super::types::{Q8_GROUP, TILE};
use super::x86::{hsum256, prefetch_ahead};

/// Block `b`'s F16 scale broadcast to 8 lanes.
///
/// # Safety
/// F16C and AVX2 must be available; `scales` holds at least `2b + 2` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale8(scales: &[u8], b: usize) -> __m256 {
    debug_assert!(scales.len() >= 2 * b + 2);
    let bits = i32::from(u16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]));
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// One Q8 row (`data` = `cols` bytes, `scales` = `cols / 32` F16) against
/// `N` tokens of `x` (`[N, cols]`, natural order); writes `out[..N]`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `data.len() == cols`,
/// `scales.len() == 2 * cols / 32`, `cols % 32 == 0`, `x.len() >= N * cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn row_avx2<const N: usize>(
    data: &[u8],
    scales: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; TILE],
) {
    debug_assert!(data.len() == cols && cols % Q8_GROUP == 0 && x.len() >= N * cols);
    // SAFETY: block b reads data[32b..32b+32] and x[t*cols + 32b..+32], in
    // bounds by the preconditions.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..cols / Q8_GROUP {
            let p = data.as_ptr().add(Q8_GROUP * b);
            if b % 2 == 0 {
                prefetch_ahead(p);
            }
            let w: [__m256; 4] = core::array::from_fn(|k| {
                let v = _mm_loadl_epi64(p.add(8 * k) as *const __m128i);
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
            });
            let s = scale8(scales, b);
            for (t, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add(t * cols + Q8_GROUP * b);
                let mut d = _mm256_mul_ps(w[0], _mm256_loadu_ps(xp));
                d = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xp.add(8)), d);
                d = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xp.add(16)), d);
                d = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xp.add(24)), d);
                *a = _mm256_fmadd_ps(d, s, *a);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum256(a);
        }
    }
}

/// [`row_avx2`] with 16-lane vectors.
///
/// # Safety
/// AVX-512 F (and F16C) must be available; the rest as [`row_avx2`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn row_avx512<const N: usize>(
    data: &[u8],
    scales: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; TILE],
) {
    debug_assert!(data.len() == cols && cols % Q8_GROUP == 0 && x.len() >= N * cols);
    // SAFETY: as in `row_avx2`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..cols / Q8_GROUP {
            let p = data.as_ptr().add(Q8_GROUP * b);
            if b % 2 == 0 {
                prefetch_ahead(p);
            }
            let w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)));
            let w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(16) as *const __m128i
            )));
            let s = _mm512_broadcastss_ps(_mm256_castps256_ps128(scale8(scales, b)));
            for (t, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add(t * cols + Q8_GROUP * b);
                let d = _mm512_mul_ps(w0, _mm512_loadu_ps(xp));
                let d = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), d);
                *a = _mm512_fmadd_ps(d, s, *a);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }
}
