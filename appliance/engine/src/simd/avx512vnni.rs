//! AVX-512 VNNI + VBMI NVFP4 kernel: int8 dot products on activations
//! quantized per 16-column block (`kernels::Q8`), as llama.cpp does for its
//! 4-bit types. Twin: the generic f32 path on the dequantized activations
//! (`kernels::round_q8`); integer sums are exact, so only the order of the
//! float steps differs.
//!
//! One 64-byte load holds 128 columns. `vpermb` (6 index bits, table
//! repeated 4 times) turns each low nibble, and after a 16-bit shift each
//! high nibble, into `2 * E2M1 + 12` (0..=24, unsigned as `vpdpbusd`
//! wants); byte `j` of the low vector is column `2j`, of the high vector
//! column `2j + 1`. The activations come as `[even columns | odd columns]`
//! per 128-column chunk, so dword lane `L` of `vpdpbusd` sums columns
//! `8L..8L+7` (block `L / 2`), and `corr` removes the `+12` offset
//! (`-12 * sum(q)` over the lane's 8 columns, the accumulator's start value).
//! Per chunk and token: two `vpdpbusd`, a multiply of the block scales, a
//! convert and one FMA.

use core::arch::x86_64::*;
use core::mem::transmute;

use super::avx512::{e4m3x16, lone_chunk_scales, SCALE_IDX};
use crate::weights::e4m3_to_f32;

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
    /// int8 activations, permuted per 128-column chunk.
    pub q: &'a [i8],
    /// `-OFFSET * sum(q)` per 8-column group.
    pub corr: &'a [i32],
    /// Half the block's activation scale, per 8-column group.
    pub scale: &'a [f32],
}

/// One NVFP4 row (`packed` = cols/2 bytes, `scales` = cols/16) against `N`
/// tokens of quantized activations; writes `out[..N]`.
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI and VBMI must be available; `packed.len() == cols / 2`,
/// `scales.len() == cols / 16`, `cols % 16 == 0`; `x.q.len() >= N * cols`,
/// `x.corr.len()` and `x.scale.len() >= N * cols / 8`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(crate) unsafe fn nvfp4_row<const N: usize>(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    x: Q8In<'_>,
    out: &mut [f32; crate::kernels::TILE],
) {
    let chunks = cols / 128;
    // SAFETY: chunk c reads packed[64c..+64], scales[8c..+8] (16 per pair),
    // q[t*cols + 128c..+128] and corr/scale[t*cols/8 + 16c..+16], inside the
    // slices by the preconditions.
    unsafe {
        let idx: [__m512i; 2] = transmute(SCALE_IDX);
        let gsv = _mm512_set1_ps(gs);
        // Two sets of accumulators hide the FMA latency for one token; with
        // more tokens they are independent already and a second set would
        // only take registers the other tokens' accumulators need.
        let mut acc = [[_mm512_setzero_ps(); N]; 2];
        let mut c = 0;
        while c + 2 <= chunks {
            let s16 = e4m3x16(scales.as_ptr().add(8 * c), gsv);
            for (k, ix) in idx.iter().enumerate() {
                let sv = _mm512_permutexvar_ps(*ix, s16);
                chunk(packed.as_ptr().add(64 * (c + k)), sv, x, c + k, cols, &mut acc[k]);
            }
            c += 2;
        }
        if c < chunks {
            let sv = lone_chunk_scales(&scales[8 * c..8 * c + 8], gs);
            chunk(packed.as_ptr().add(64 * c), sv, x, c, cols, &mut acc[0]);
        }
        for (t, o) in out.iter_mut().enumerate().take(N) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
        }
    }
    tail(packed, scales, gs, cols, chunks * 128, x, N, out);
}

/// One 128-column chunk `c` (packed bytes at `p`, weight block scales `sv`
/// with lane `L` = block `L / 2`) against every token.
///
/// # Safety
/// As [`nvfp4_row`]; 64 bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn chunk<const N: usize>(
    p: *const u8,
    sv: __m512,
    x: Q8In<'_>,
    c: usize,
    cols: usize,
    acc: &mut [__m512; N],
) {
    // SAFETY: loads stay inside the ranges [`nvfp4_row`] guarantees.
    unsafe {
        let lut: __m512i = transmute(E2M1_U8);
        super::prefetch_ahead(p);
        let d = _mm512_loadu_si512(p as *const __m512i);
        let lo = _mm512_permutexvar_epi8(d, lut);
        let hi = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(d), lut);
        for (t, a) in acc.iter_mut().enumerate() {
            let q = x.q.as_ptr().add(t * cols + 128 * c);
            let g = t * cols / 8 + 16 * c;
            let corr = _mm512_loadu_si512(x.corr.as_ptr().add(g) as *const __m512i);
            let i = _mm512_dpbusd_epi32(corr, lo, _mm512_loadu_si512(q as *const __m512i));
            let i = _mm512_dpbusd_epi32(i, hi, _mm512_loadu_si512(q.add(64) as *const __m512i));
            let s = _mm512_mul_ps(sv, _mm512_loadu_ps(x.scale.as_ptr().add(g)));
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, *a);
        }
    }
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
/// chunk) to `cols`, whose activations are in natural order.
#[allow(clippy::too_many_arguments)]
pub(super) fn tail(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    from: usize,
    x: Q8In<'_>,
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
            *o += s * x.scale[(t * cols + c) / 8] * sum as f32;
        }
    }
}
