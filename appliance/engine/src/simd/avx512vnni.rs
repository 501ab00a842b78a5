//! AVX-512 VNNI + VBMI NVFP4 kernel: int8 dot products on activations
//! quantized per 16-column block (`kernels::Q8`), as llama.cpp does for its
//! 4-bit types. Twin: the generic f32 path on the dequantized activations
//! (`kernels::round_q8`); integer sums are exact, so only the order of the
//! float steps differs.
//!
//! `vpermb` (6 index bits, table repeated 4 times) turns each low nibble,
//! and after a 16-bit shift each high nibble, into `2 * E2M1 + 12`
//! (0..=24, unsigned as `vpdpbusd` wants); the offset correction `corr =
//! -12 * sum(q)` over the columns a dword lane sums, the accumulator's start
//! value, removes the `+12`. The kernel itself is a GEMM tile
//! (`simd::vnni_tile`, and `simd::avx2_q8` on AVX2, each with its own
//! chunk layout); this module holds what they share: the activations' form
//! ([`Q8In`]), the table, the SIMD block quantizer and the scalar tail of a
//! partial chunk.

use crate::weights::e4m3_to_f32;
use core::arch::x86_64::*;

/// `2 * E2M1(code) + 12` for the low 4 bits of the index, repeated 4 times.
pub(super) const E2M1_U8: [u8; 64] = {
    const HALF: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = HALF[i % 16];
        i += 1;
    }
    t
};

/// The offset added to every doubled E2M1 weight (see the module docs).
pub(crate) const OFFSET: i32 = 12;

/// Quantized activations of `N` tokens, each token's rows `cols` (q),
/// `cols / 8` (corr, scale) long.
#[derive(Clone, Copy)]
pub(crate) struct Q8In<'a> {
    /// int8 activations, laid out per chunk as the kernel wants them.
    pub q: &'a [i8],
    /// `-OFFSET * sum(q)` per group of columns (the kernel's: 16 for
    /// `simd::vnni_tile`, 8 for `simd::avx2_q8`).
    pub corr: &'a [i32],
    /// Half the block's activation scale, per group of columns.
    pub scale: &'a [f32],
}

/// Quantizes one 16-column block to int8 exactly as `kernels::q8_block`
/// does (the same f32 operations lane by lane: `amax / 127`, `x * (127 /
/// amax)`, plus or minus 0.5, clamp to 127, truncate). Writes `qb` as [even
/// columns | odd columns] and returns the scale and the sums of the first
/// and last 8 values, or `None` if the block holds a NaN or an infinity
/// (the scalar path then decides, as Rust's `f32::max` and `as i8` do).
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn q8_block16(blk: &[f32; 16], qb: &mut [i8; 16]) -> Option<(f32, [i32; 2])> {
    // SAFETY: 16 floats in `blk`, 16 bytes in `qb`.
    unsafe {
        let v = _mm512_loadu_ps(blk.as_ptr());
        let a = _mm512_abs_ps(v);
        if _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, _mm512_set1_ps(f32::INFINITY)) != 0 {
            return None;
        }
        let amax = _mm512_reduce_max_ps(a);
        let (scale, inv) = if amax > 0.0 { (amax / 127.0, 127.0 / amax) } else { (0.0, 0.0) };
        let y = _mm512_mul_ps(v, _mm512_set1_ps(inv));
        let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(y, _mm512_setzero_ps());
        let half = _mm512_mask_blend_ps(up, _mm512_set1_ps(-0.5), _mm512_set1_ps(0.5));
        let r = _mm512_add_ps(y, half);
        let r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0)), _mm512_set1_ps(127.0));
        let qi = _mm512_cvttps_epi32(r);
        let sums =
            [_mm512_mask_reduce_add_epi32(0x00FF, qi), _mm512_mask_reduce_add_epi32(0xFF00, qi)];
        let even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        let bytes = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(qi), even_odd);
        _mm_storeu_si128(qb.as_mut_ptr() as *mut __m128i, bytes);
        Some((scale, sums))
    }
}

/// Adds the 16-column blocks from column `from` (the end of the last full
/// chunk) to `cols`, whose activations are in natural order with one scale
/// per `group` columns.
#[allow(clippy::too_many_arguments)]
pub(super) fn tail(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    from: usize,
    x: Q8In<'_>,
    group: usize,
    n: usize,
    out: &mut [f32; crate::kernels::TILE],
) {
    for c in (from..cols).step_by(16) {
        let s = e4m3_to_f32(scales[c / 16]) * gs;
        for (t, o) in out.iter_mut().enumerate().take(n) {
            let sum: i32 = (c..c + 16)
                .map(|j| {
                    let code = (packed[j / 2] >> (4 * (j % 2))) & 0xF;
                    (i32::from(E2M1_U8[code as usize]) - OFFSET) * i32::from(x.q[t * cols + j])
                })
                .sum();
            *o += s * x.scale[(t * cols + c) / group] * sum as f32;
        }
    }
}
