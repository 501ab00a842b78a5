//! AVX2 NVFP4 GEMM tile on int8 activations (quantized per 16-column block,
//! `kernels::q8act`, in 64-column chunks): `R` consecutive weight rows
//! against `N` tokens, the AVX2 counterpart of `simd::vnni_tile` (prefill,
//! batched decode and verification; `R = N = 1` is decode). Twin: the
//! generic f32 path on the dequantized activations (`kernels::round_q8`);
//! the integer sums are exact.
//!
//! One 32-byte load holds 64 columns. `vpshufb` turns each low nibble, and
//! after a shift each high nibble, into the unsigned `2 * E2M1(code) + 12`
//! (0..=24, as `vpmaddubsw` wants its first operand); byte `j` of the low
//! vector is column `2j`, of the high vector column `2j + 1`, matching the
//! activations' `[even | odd]` chunk layout. `vpmaddubsw` multiplies them
//! by the signed activations (pairs of products stay far inside i16),
//! `vpmaddwd` by ones sums the 16-bit pairs, so dword lane `L` holds
//! columns `8L..8L+7` (block `L / 2`), and adding the quantizer's `corr =
//! -12 * sum(q)` removes the offset exactly. Per chunk, row and token: two
//! `vpmaddubsw`, two adds, a `vpmaddwd`, a convert, a multiply of the
//! scales and one FMA.
//! Each row's nibbles are expanded once per token tile and each token's
//! activations are loaded once per row tile. The f32 steps of a (row,
//! token) pair do not depend on `R`, `N` or the pair's place in the tile,
//! so a token's result is bit-identical alone and batched.
//!
//! [`q8_chunk64`] is the chunk-wide activation quantizer of this layout:
//! the scalar rule of `kernels::q8act` lane by lane, bit for bit.

use core::arch::x86_64::*;

use super::types::{Q8In, NVFP4_OFFSET, TILE, TILE_ROWS};
use super::x86::{e2m1_offset_bytes, e4m3x8, hsum256, prefetch_ahead, tail_q8, E4m3Scale};

/// `2 * E2M1(code) + 12`, for both 128-bit lanes of `vpshufb`.
const E2M1_U8: [u8; 32] = e2m1_offset_bytes();

/// The scales of the two chunks whose 8 block scales start at `p`: each
/// block's scale times `gs` in the two dword lanes of its block.
///
/// # Safety
/// AVX2 must be available; 8 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_scales2(p: *const u8, gs: E4m3Scale) -> [__m256; 2] {
    // SAFETY: 8 bytes at `p` by the caller.
    let s = e4m3x8(_mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(p as *const __m128i) }), gs);
    let (a, b) =
        (_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    [_mm256_permutevar8x32_ps(s, a), _mm256_permutevar8x32_ps(s, b)]
}

/// The scales of the one chunk whose 4 block scales start at `p`.
///
/// # Safety
/// AVX2 must be available; 4 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_scales(p: *const u8, gs: E4m3Scale) -> __m256 {
    // SAFETY: 4 bytes at `p` by the caller.
    let b = _mm_cvtsi32_si128(i32::from_le_bytes(unsafe { *(p as *const [u8; 4]) }));
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
    e4m3x8(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(b, dup)), gs)
}

/// Quantizes one 64-column chunk (4 blocks of 16 columns) to int8 exactly
/// as `kernels::q8act`'s scalar rule does block by block (`amax / 127`,
/// `x * (127 / amax)`, plus or minus 0.5, clamp to 127, truncate: the same
/// f32 operations lane by lane), writing `q` in this kernel's layout
/// (`[32 even columns | 32 odd columns]`), and per 8 columns `corr =
/// -NVFP4_OFFSET * sum(q)` and `scale` = half the block's scale. Returns
/// false, writing nothing, when the chunk holds a NaN or an infinity, or a
/// block's `127 / amax` is not finite (the scalar rule then decides).
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn q8_chunk64(
    x: &[f32; 64],
    q: &mut [i8; 64],
    corr: &mut [i32; 8],
    scale: &mut [f32; 8],
) -> bool {
    // SAFETY: 64 floats in `x`, 64 bytes in `q`, 8 lanes in `corr` and
    // `scale`: every load and store below stays inside them.
    unsafe {
        let v: [__m256; 8] = core::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let inf = _mm256_set1_ps(f32::INFINITY);
        let mut amax = [0f32; 4];
        for (b, m) in amax.iter_mut().enumerate() {
            let (a0, a1) = (_mm256_and_ps(v[2 * b], abs), _mm256_and_ps(v[2 * b + 1], abs));
            // NaN compares unordered: not less than infinity either.
            let bad = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_NLT_UQ>(a0, inf),
                _mm256_cmp_ps::<_CMP_NLT_UQ>(a1, inf),
            );
            if _mm256_movemask_ps(bad) != 0 {
                return false;
            }
            let h = _mm256_max_ps(a0, a1);
            let h = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            *m = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)));
        }
        let mut inv = [0f32; 4];
        for (b, &m) in amax.iter().enumerate() {
            let (s, i) = if m > 0.0 { (m / 127.0, 127.0 / m) } else { (0.0, 0.0) };
            if !i.is_finite() {
                return false;
            }
            inv[b] = i;
            scale[2 * b] = 0.5 * s;
            scale[2 * b + 1] = 0.5 * s;
        }
        let (k, zero) = (_mm256_set1_ps(127.0), _mm256_setzero_ps());
        let (pos, neg) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
        let d: [__m256i; 8] = core::array::from_fn(|i| {
            let y = _mm256_mul_ps(v[i], _mm256_set1_ps(inv[i / 2]));
            let half = _mm256_blendv_ps(neg, pos, _mm256_cmp_ps::<_CMP_GE_OQ>(y, zero));
            let r = _mm256_min_ps(k, _mm256_max_ps(_mm256_set1_ps(-127.0), _mm256_add_ps(y, half)));
            _mm256_cvttps_epi32(r)
        });
        // corr: the sums of the 8 dword vectors (8 natural columns each).
        let h01 = _mm256_hadd_epi32(d[0], d[1]);
        let h23 = _mm256_hadd_epi32(d[2], d[3]);
        let h45 = _mm256_hadd_epi32(d[4], d[5]);
        let h67 = _mm256_hadd_epi32(d[6], d[7]);
        let (h03, h47) = (_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67));
        let sums = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h03, h47),
            _mm256_permute2x128_si256::<0x31>(h03, h47),
        );
        let c = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-NVFP4_OFFSET));
        _mm256_storeu_si256(corr.as_mut_ptr() as *mut __m256i, c);
        // Bytes in natural order (values are within -127..=127: packing
        // saturates nothing), then per 32 columns [even | odd].
        let natural = |a: [__m256i; 4]| {
            let w =
                _mm256_packs_epi16(_mm256_packs_epi32(a[0], a[1]), _mm256_packs_epi32(a[2], a[3]));
            _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        };
        let split = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, //
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
        );
        let eo = |n: __m256i| _mm256_permute4x64_epi64::<0xD8>(_mm256_shuffle_epi8(n, split));
        let lo = eo(natural([d[0], d[1], d[2], d[3]]));
        let hi = eo(natural([d[4], d[5], d[6], d[7]]));
        let p = q.as_mut_ptr() as *mut __m256i;
        _mm256_storeu_si256(p, _mm256_permute2x128_si256::<0x20>(lo, hi));
        _mm256_storeu_si256(p.add(1), _mm256_permute2x128_si256::<0x31>(lo, hi));
        true
    }
}

/// Rows per tile in the multi-row kernel (`ROWS x TOKENS` accumulators and
/// each row's two expanded weight vectors fit in the 16 registers).
pub(crate) const ROWS: usize = 2;

/// Most tokens per tile.
pub(crate) const TOKENS: usize = 4;

/// Every full chunk's block scales of `rows` NVFP4 rows (`scales` = `rows *
/// cols / 16` bytes) as [`nvfp4_tile`] uses them (8 floats per row and
/// 64-column chunk, row-major), for rows that pass several token tiles:
/// decoded once instead of once per tile.
///
/// # Safety
/// AVX2 and FMA must be available; `scales.len() == rows * cols / 16`,
/// `out.len() == rows * (cols / 64) * 8`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn decode_scales(scales: &[u8], gs: f32, cols: usize, out: &mut [f32]) {
    let (chunks, srow) = (cols / 64, cols / 16);
    let rows = scales.len() / srow.max(1);
    debug_assert!(scales.len() == rows * srow && out.len() == rows * chunks * 8);
    let gsv = E4m3Scale::new(gs);
    for r in 0..rows {
        for c in 0..chunks {
            // SAFETY: 4 bytes at r*srow + 4c < scales.len(); 8 floats at
            // (r*chunks + c)*8 < out.len(), by the preconditions.
            unsafe {
                let v = weight_scales(scales.as_ptr().add(r * srow + 4 * c), gsv);
                _mm256_storeu_ps(out.as_mut_ptr().add((r * chunks + c) * 8), v);
            }
        }
    }
}

/// `R` consecutive NVFP4 rows (`packed` = `R * cols / 2` bytes, `scales` =
/// `R * cols / 16`) against `N` tokens of int8 activations in 64-column
/// chunks; writes `out[r][..N]` for `r < R`. `pre` is empty, or these rows'
/// scales from [`decode_scales`] (the same values, not decoded again).
///
/// # Safety
/// AVX2 and FMA must be available; `R <= ROWS`, `N <= TOKENS`,
/// `cols % 16 == 0`, `packed.len() == R * cols / 2`, `scales.len() == R *
/// cols / 16`; `x.q.len() >= N * cols`, `x.corr` and `x.scale` at least
/// `N * cols / 8` long; `pre.len()` is 0 or `R * (cols / 64) * 8`.
#[target_feature(enable = "avx2,fma")]
// Token and row indices address two register arrays at once.
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn nvfp4_tile<const R: usize, const N: usize>(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [[f32; TILE]; TILE_ROWS],
) {
    debug_assert!(R <= ROWS && N <= TOKENS && cols % 16 == 0);
    debug_assert!(packed.len() == R * cols / 2 && scales.len() == R * cols / 16);
    debug_assert!(x.q.len() >= N * cols && x.scale.len() >= N * cols / 8);
    debug_assert!(x.corr.len() >= N * cols / 8);
    debug_assert!(pre.is_empty() || pre.len() == R * (cols / 64) * 8);
    let (chunks, prow, srow) = (cols / 64, cols / 2, cols / 16);
    // SAFETY: chunk c reads packed[r*prow + 32c..+32] and scales[r*srow +
    // 4c..+8 (pairs) or +4] (or pre[(r*chunks + c)*8..+8]) for r < R,
    // q[t*cols + 64c..+64] and corr/scale[t*cols/8 + 8c..+8] for t < N:
    // inside the slices by the preconditions.
    unsafe {
        let lut = _mm256_loadu_si256(E2M1_U8.as_ptr() as *const __m256i);
        let (nib, ones, gsv) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1), E4m3Scale::new(gs));
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        let mut pair = [_mm256_setzero_ps(); 2];
        for c in 0..chunks {
            let mut lo = [_mm256_setzero_si256(); R];
            let mut hi = [_mm256_setzero_si256(); R];
            let mut ws = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let p = packed.as_ptr().add(r * prow + 32 * c);
                if c % 2 == 0 {
                    prefetch_ahead(p);
                }
                let d = _mm256_loadu_si256(p as *const __m256i);
                lo[r] = _mm256_shuffle_epi8(lut, _mm256_and_si256(d, nib));
                hi[r] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(d), nib));
                let sp = scales.as_ptr().add(r * srow + 4 * c);
                // One row (decode) decodes the scales of two chunks at once
                // (the same values as `weight_scales`, fewer instructions).
                ws[r] = if !pre.is_empty() {
                    _mm256_loadu_ps(pre.as_ptr().add((r * chunks + c) * 8))
                } else if R > 1 || (c % 2 == 0 && c + 2 > chunks) {
                    weight_scales(sp, gsv)
                } else if c % 2 == 0 {
                    pair = weight_scales2(sp, gsv);
                    pair[0]
                } else {
                    pair[1]
                };
            }
            for t in 0..N {
                let q = x.q.as_ptr().add(t * cols + 64 * c);
                let g = t * cols / 8 + 8 * c;
                let xs = _mm256_loadu_ps(x.scale.as_ptr().add(g));
                let corr = _mm256_loadu_si256(x.corr.as_ptr().add(g) as *const __m256i);
                let qe = _mm256_loadu_si256(q as *const __m256i);
                let qo = _mm256_loadu_si256(q.add(32) as *const __m256i);
                for r in 0..R {
                    let pe = _mm256_maddubs_epi16(lo[r], qe);
                    let po = _mm256_maddubs_epi16(hi[r], qo);
                    let i = _mm256_madd_epi16(_mm256_add_epi16(pe, po), ones);
                    let i = _mm256_add_epi32(i, corr);
                    let s = _mm256_mul_ps(ws[r], xs);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, acc[r][t]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (v, at) in o.iter_mut().zip(a) {
                *v = hsum256(*at);
            }
        }
    }
    // Columns after the last full chunk (none in most products).
    for (r, o) in out.iter_mut().enumerate().take(if chunks * 64 < cols { R } else { 0 }) {
        let (p, s) = (&packed[r * prow..(r + 1) * prow], &scales[r * srow..(r + 1) * srow]);
        tail_q8(p, s, gs, cols, chunks * 64, x, 8, N, o);
    }
}
