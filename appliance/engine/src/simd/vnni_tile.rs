//! AVX-512 VNNI NVFP4 GEMM tile: `R` consecutive weight rows against `N`
//! tokens of int8 activations (`kernels::q8act`), the multi-token kernel of
//! prefill chunks, batched decode and speculative verification, and (with
//! `N = 1`) of decode itself.
//!
//! Per 128-column chunk each row's 64 packed bytes are loaded and turned
//! into doubled, offset E2M1 bytes once (two `vpermb`, as in
//! `simd::avx512vnni`) and each token's activations, offset correction and
//! scales are loaded once; then every (row, token) pair takes two
//! `vpdpbusd`, a multiply of the block scales, a convert and one FMA. The
//! f32 steps of one (row, token) pair do not depend on `R`, `N` or where
//! the pair sits in the tile, so a token's result is bit-identical whether
//! it runs alone or batched with others.

use core::arch::x86_64::*;
use core::mem::transmute;

use super::avx512::{e4m3x16, SCALE_IDX};
use super::avx512vnni::{tail, Q8In, E2M1_U8};
use crate::kernels::TILE;

/// Rows per tile in the multi-row kernel.
pub(crate) const ROWS: usize = 4;

/// Most tokens per tile (`ROWS x TOKENS` accumulators, plus each row's two
/// weight vectors and scales, fit in the 32 vector registers).
pub(crate) const TOKENS: usize = 4;

/// The 8 E4M3 block scales of one chunk at `p`, times `gs`, each in the two
/// dword lanes of its block: exactly `e4m3_to_f32(b) * gs` (the same f32
/// steps as `simd::avx512::e4m3x16`).
///
/// # Safety
/// AVX-512 F must be available; 8 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn chunk_scales(p: *const u8, gs: __m512) -> __m512 {
    // SAFETY: 8 bytes at `p` by the caller.
    let b = unsafe { _mm_loadl_epi64(p as *const __m128i) };
    let b = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    let mag = _mm512_slli_epi32::<20>(_mm512_and_si512(b, _mm512_set1_epi32(0x7F)));
    let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(b, _mm512_set1_epi32(0x80)));
    let v = _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
    _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(f32::from_bits(0x7B80_0000))), gs)
}

/// Every full chunk's block scales of `rows` NVFP4 rows (`scales` = `rows *
/// cols / 16` bytes) as [`nvfp4_tile`] uses them (`chunk_scales`, 16 floats
/// per row and chunk, row-major), for a product whose rows pass several
/// token tiles: decoded once instead of once per tile.
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `scales.len() == rows * cols / 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn decode_scales(scales: &[u8], gs: f32, cols: usize, out: &mut [f32]) {
    let (chunks, srow) = (cols / 128, cols / 16);
    let rows = scales.len() / srow.max(1);
    debug_assert!(scales.len() == rows * srow && out.len() == rows * chunks * 16);
    let gsv = _mm512_set1_ps(gs);
    for r in 0..rows {
        for c in 0..chunks {
            // SAFETY: 8 bytes at r*srow + 8c < scales.len(); 16 floats at
            // (r*chunks + c)*16 < out.len(), by the preconditions.
            unsafe {
                let sv = chunk_scales(scales.as_ptr().add(r * srow + 8 * c), gsv);
                _mm512_storeu_ps(out.as_mut_ptr().add((r * chunks + c) * 16), sv);
            }
        }
    }
}

/// `R` consecutive NVFP4 rows (`packed` = `R * cols / 2` bytes, `scales` =
/// `R * cols / 16`) against `N` tokens of quantized activations; writes
/// `out[r][..N]` for `r < R`. `pre` is empty, or these rows' scales from
/// [`decode_scales`] (the same values, not decoded again).
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI and VBMI must be available; `R <= ROWS`,
/// `N <= TOKENS`, `cols % 16 == 0`, `packed.len() == R * cols / 2`,
/// `scales.len() == R * cols / 16`; `x.q.len() >= N * cols`, `x.corr.len()`
/// and `x.scale.len() >= N * cols / 8`, the activations permuted per
/// 128-column chunk as `kernels::q8act` lays them out for this path;
/// `pre.len()` is 0 or `R * (cols / 128) * 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
// Token and row indices address two register arrays at once.
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn nvfp4_tile<const R: usize, const N: usize>(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [[f32; TILE]; ROWS],
) {
    debug_assert!(R <= ROWS && N <= TOKENS && cols % 16 == 0);
    debug_assert!(pre.is_empty() || pre.len() == R * (cols / 128) * 16);
    debug_assert!(packed.len() == R * cols / 2 && scales.len() == R * cols / 16);
    debug_assert!(x.q.len() >= N * cols && x.corr.len() >= N * cols / 8);
    debug_assert!(x.scale.len() >= N * cols / 8);
    let (chunks, prow, srow) = (cols / 128, cols / 2, cols / 16);
    // SAFETY: chunk c reads packed[r*prow + 64c..+64] and scales[r*srow +
    // 8c..+8] (or pre[(r*chunks + c)*16..+16]) for r < R, q[t*cols +
    // 128c..+128] and corr/scale[t*cols/8 + 16c..+16] for t < N: inside the
    // slices by the preconditions.
    unsafe {
        let lut: __m512i = transmute(E2M1_U8);
        let gsv = _mm512_set1_ps(gs);
        let idx: [__m512i; 2] = transmute(SCALE_IDX);
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        let mut pair = _mm512_setzero_ps();
        for c in 0..chunks {
            let mut w = [[_mm512_setzero_si512(); 2]; R];
            let mut sv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let p = packed.as_ptr().add(r * prow + 64 * c);
                super::prefetch_ahead(p);
                let d = _mm512_loadu_si512(p as *const __m512i);
                w[r][0] = _mm512_permutexvar_epi8(d, lut);
                w[r][1] = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(d), lut);
                let sp = scales.as_ptr().add(r * srow + 8 * c);
                // One row (decode) decodes the scales of two chunks at once
                // (the same values as `chunk_scales`, fewer instructions);
                // more rows would need a register per row to keep them.
                sv[r] = if !pre.is_empty() {
                    _mm512_loadu_ps(pre.as_ptr().add((r * chunks + c) * 16))
                } else if R > 1 || (c % 2 == 0 && c + 2 > chunks) {
                    chunk_scales(sp, gsv)
                } else if c % 2 == 0 {
                    pair = e4m3x16(sp, gsv);
                    _mm512_permutexvar_ps(idx[0], pair)
                } else {
                    _mm512_permutexvar_ps(idx[1], pair)
                };
            }
            for t in 0..N {
                let q = x.q.as_ptr().add(t * cols + 128 * c);
                let g = t * cols / 8 + 16 * c;
                let corr = _mm512_loadu_si512(x.corr.as_ptr().add(g) as *const __m512i);
                let qe = _mm512_loadu_si512(q as *const __m512i);
                let qo = _mm512_loadu_si512(q.add(64) as *const __m512i);
                let xs = _mm512_loadu_ps(x.scale.as_ptr().add(g));
                for r in 0..R {
                    let i = _mm512_dpbusd_epi32(corr, w[r][0], qe);
                    let i = _mm512_dpbusd_epi32(i, w[r][1], qo);
                    let s = _mm512_mul_ps(sv[r], xs);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[r][t]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (v, at) in o.iter_mut().zip(a) {
                *v = _mm512_reduce_add_ps(*at);
            }
        }
    }
    for (r, o) in out.iter_mut().enumerate().take(R) {
        let (p, s) = (&packed[r * prow..(r + 1) * prow], &scales[r * srow..(r + 1) * srow]);
        tail(p, s, gs, cols, chunks * 128, x, N, o);
    }
}
