//! AVX2 NVFP4 kernel on int8 activations (quantized per 16-column block,
//! `kernels::q8act`, in 64-column chunks), the AVX2 counterpart of
//! `simd::avx512vnni`. Twin: the generic f32 path on the dequantized
//! activations (`kernels::round_q8`); the integer sums are exact.
//!
//! One 32-byte load holds 64 columns. `vpshufb` turns each low nibble, and
//! after a shift each high nibble, into the unsigned `2 * E2M1(code) + 12`
//! (0..=24, as `vpmaddubsw` wants its first operand); byte `j` of the low
//! vector is column `2j`, of the high vector column `2j + 1`, matching the
//! activations' `[even | odd]` chunk layout. `vpmaddubsw` multiplies them
//! by the signed activations (pairs of products stay far inside i16),
//! `vpmaddwd` by ones sums the 16-bit pairs, so dword lane `L` holds
//! columns `8L..8L+7` (block `L / 2`), and adding the quantizer's `corr =
//! -12 * sum(q)` removes the offset exactly. Per chunk and token: two
//! `vpmaddubsw`, two adds, a `vpmaddwd`, a convert, a multiply of the
//! scales and one FMA.

use core::arch::x86_64::*;

use super::avx512vnni::Q8In;
use crate::kernels::TILE;

/// `2 * E2M1(code) + 12`, for both 128-bit lanes of `vpshufb`.
const E2M1_U8: [u8; 32] = [
    12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, //
    12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
];

/// Eight E4M3 bytes (as dwords) decoded and times `gs`: exactly
/// `E4M3_TABLE[b] * gs` for every byte except the NaN codes (which `pack
/// verify` rejects).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn e4m3x8(b: __m256i, gs: __m256) -> __m256 {
    let mag = _mm256_slli_epi32::<20>(_mm256_and_si256(b, _mm256_set1_epi32(0x7F)));
    let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(b, _mm256_set1_epi32(0x80)));
    let v = _mm256_castsi256_ps(_mm256_or_si256(mag, sign));
    let v = _mm256_mul_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7B80_0000)));
    _mm256_mul_ps(v, gs)
}

/// The scales of the two chunks whose 8 block scales start at `p`: each
/// block's scale times `gs` in the two dword lanes of its block.
///
/// # Safety
/// AVX2 must be available; 8 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn weight_scales2(p: *const u8, gs: __m256) -> [__m256; 2] {
    // SAFETY: 8 bytes at `p` by the caller.
    let s = e4m3x8(_mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p as *const __m128i) }), gs);
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
unsafe fn weight_scales(p: *const u8, gs: __m256) -> __m256 {
    // SAFETY: 4 bytes at `p` by the caller.
    let b = _mm_cvtsi32_si128(i32::from_le_bytes(unsafe { *(p as *const [u8; 4]) }));
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
    e4m3x8(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(b, dup)), gs)
}

/// One NVFP4 row (`packed` = cols/2 bytes, `scales` = cols/16) against `N`
/// tokens of int8 activations in 64-column chunks; writes `out[..N]`.
///
/// # Safety
/// AVX2 and FMA must be available; `packed.len() == cols / 2`,
/// `scales.len() == cols / 16`, `cols % 16 == 0`; `x.q.len() >= N * cols`,
/// `x.corr.len()` and `x.scale.len() >= N * cols / 8`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nvfp4_row<const N: usize>(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    x: Q8In<'_>,
    out: &mut [f32; TILE],
) {
    debug_assert!(packed.len() == cols / 2 && scales.len() == cols / 16 && cols % 16 == 0);
    debug_assert!(x.q.len() >= N * cols && x.scale.len() >= N * cols / 8);
    debug_assert!(x.corr.len() >= N * cols / 8);
    let chunks = cols / 64;
    // SAFETY: chunk c reads packed[32c..+32], scales[4c..+4], q[t*cols +
    // 64c..+64] and corr/scale[t*cols/8 + 8c..+8], inside the slices.
    unsafe {
        let lut = _mm256_loadu_si256(E2M1_U8.as_ptr() as *const __m256i);
        let (nib, ones, gsv) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1), _mm256_set1_ps(gs));
        let mut acc = [_mm256_setzero_ps(); N];
        let mut pair = [_mm256_setzero_ps(); 2];
        for c in 0..chunks {
            let p = packed.as_ptr().add(32 * c);
            // Block scales two chunks at a time (one decode of 8 bytes).
            let ws = if c % 2 == 0 && c + 2 <= chunks {
                super::prefetch_ahead(p);
                pair = weight_scales2(scales.as_ptr().add(4 * c), gsv);
                pair[0]
            } else if c % 2 == 1 {
                pair[1]
            } else {
                weight_scales(scales.as_ptr().add(4 * c), gsv)
            };
            let d = _mm256_loadu_si256(p as *const __m256i);
            let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(d, nib));
            let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(d), nib));
            for (t, a) in acc.iter_mut().enumerate() {
                let q = x.q.as_ptr().add(t * cols + 64 * c);
                let g = t * cols / 8 + 8 * c;
                let qe = _mm256_loadu_si256(q as *const __m256i);
                let qo = _mm256_loadu_si256(q.add(32) as *const __m256i);
                let pe = _mm256_maddubs_epi16(lo, qe);
                let po = _mm256_maddubs_epi16(hi, qo);
                let i = _mm256_madd_epi16(_mm256_add_epi16(pe, po), ones);
                let corr = _mm256_loadu_si256(x.corr.as_ptr().add(g) as *const __m256i);
                let i = _mm256_add_epi32(i, corr);
                let xs = _mm256_loadu_ps(x.scale.as_ptr().add(g));
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(ws, xs), *a);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = super::avx2::hsum(a);
        }
    }
    super::avx512vnni::tail(packed, scales, gs, cols, chunks * 64, x, N, out);
}
