//! What the x86 kernels share (llama.cpp's `simd-mappings.h` in that role):
//! the E4M3 block-scale decoders, the E2M1 byte tables of the int8 kernels
//! (derived from the format crate's one table), software prefetch, the
//! horizontal sum, and the scalar tails of NVFP4 rows past their last full
//! chunk. Imports only the shared types and the formats, never a sibling ISA
//! module.

use core::arch::x86_64::*;

use kore_pack_format::fp::{e4m3_to_f32, E2M1_DOUBLED, E2M1_VALUES};

use super::types::{Q8In, NVFP4_OFFSET, TILE};

/// A global scale as the vector E4M3 decoders ([`e4m3x16`], [`e4m3x8`])
/// apply it. They place a sign-extended E4M3 byte's bits in an f32 that
/// reads 2^120 below its value; multiplying by `2^120 * gs` at once equals
/// multiplying by 2^120 (exact) and then by `gs` whenever `2^120 * gs` is
/// itself exact (a normal float), so one multiply serves and every scale
/// stays bit-identical to `e4m3_to_f32(b) * gs`; other `gs` (zero, not
/// finite) take the two multiplies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct E4m3Scale {
    /// `2^120 * gs` when `folded`, else 2^120.
    k: f32,
    /// `gs`, applied separately unless `folded`.
    gs: f32,
    /// Whether `k` already holds `gs`.
    folded: bool,
}

impl E4m3Scale {
    /// 2^120: how much too small an E4M3 byte's bits read in an f32.
    const RESCALE: f32 = f32::from_bits(0x7B80_0000);

    /// Keeps the sign (bit 31) and the exponent and mantissa (bits 20-26) of
    /// a sign-extended E4M3 byte shifted left by 20.
    const BITS: i32 = 0x87F0_0000u32 as i32;

    /// `gs` prepared for the decoders.
    pub(crate) fn new(gs: f32) -> Self {
        let k = Self::RESCALE * gs;
        let folded = k.is_normal();
        E4m3Scale { k: if folded { k } else { Self::RESCALE }, gs, folded }
    }
}

/// Reads 16 E4M3 bytes as f32 times the global scale: exactly
/// `e4m3_to_f32(b) * gs` for every byte but the NaN codes 0x7F/0xFF (which
/// `pack verify` rejects and this does not special-case).
///
/// # Safety
/// AVX-512 F/BW/VL must be available; 16 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn e4m3x16(p: *const u8, gs: E4m3Scale) -> __m512 {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    let b = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(p as *const __m128i) });
    let bits = _mm512_and_si512(_mm512_slli_epi32::<20>(b), _mm512_set1_epi32(E4m3Scale::BITS));
    let v = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(gs.k));
    if gs.folded {
        v
    } else {
        _mm512_mul_ps(v, _mm512_set1_ps(gs.gs))
    }
}

/// Eight E4M3 bytes (sign-extended to dwords) decoded and times the global
/// scale, as [`e4m3x16`] does.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn e4m3x8(b: __m256i, gs: E4m3Scale) -> __m256 {
    let bits = _mm256_and_si256(_mm256_slli_epi32::<20>(b), _mm256_set1_epi32(E4m3Scale::BITS));
    let v = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(gs.k));
    if gs.folded {
        v
    } else {
        _mm256_mul_ps(v, _mm256_set1_ps(gs.gs))
    }
}

/// `2 * E2M1(code) + NVFP4_OFFSET` (0..=24, unsigned as `vpdpbusd` and
/// `vpmaddubsw` want their first operand) for the low 4 bits of the index,
/// repeated `N / 16` times (`vpermb` reads 6 index bits, `vpshufb` 4 per
/// 128-bit lane).
pub(crate) const fn e2m1_offset_bytes<const N: usize>() -> [u8; N] {
    let mut t = [0u8; N];
    let mut i = 0;
    while i < N {
        t[i] = (E2M1_DOUBLED[i % 16] as i32 + NVFP4_OFFSET) as u8;
        i += 1;
    }
    t
}

/// The E2M1 values by code (bit 3 is the sign), the format crate's table.
pub(crate) const E2M1: [f32; 16] = E2M1_VALUES;

/// How far ahead of the weight line being read the row kernels prefetch.
/// The rows are read front to back and one after another, so the stream is
/// one long sequential read; the hardware prefetchers stop at every 4 KiB
/// boundary, the software prefetch does not (`benches/kernels.rs` measured
/// 1.3-1.5x on one thread for distances of 2-8 KiB). 3 KiB into L2 (T1)
/// rather than 4 KiB into L1 (T0): 2b decode 1.06x (median of 10 alternating
/// pairs, 0.98-1.16) on an Intel Xeon host, prefill unchanged.
pub(crate) const PREFETCH_BYTES: usize = 3072;

/// Hints the cache line `PREFETCH_BYTES` after `p` into L2. A prefetch never
/// faults, so the address may lie past the end of the weights.
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8) {
    // SAFETY: PREFETCH has no architectural effect and never faults; SSE is
    // part of x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_BYTES) as *const i8) }
}

/// [`prefetch_ahead`] for a row's block scales, 8 times shorter than its codes.
#[inline(always)]
pub(crate) fn prefetch_scales_ahead(p: *const u8) {
    // SAFETY: as in `prefetch_ahead`.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_BYTES / 8) as *const i8) }
}

/// Hints every cache line of the `bytes` at `p` into L1: a row that is read
/// soon but not in the weights' one sequential stream (the AVX2 score
/// kernel's f16 key rows, a few rows ahead). A prefetch never faults, so the
/// lines may lie past the end of the data.
#[inline(always)]
pub(crate) fn prefetch_lines(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // SAFETY: as in `prefetch_ahead`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8) }
    }
}

/// The sum of the 8 lanes of `a` (`(a0+a4)+(a2+a6)` and so on, in a fixed order).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum256(a: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Adds the 16-column NVFP4 blocks from column `from` to `cols` of one row
/// (`packed`, `scales`) against `n` tokens of f32 activations in natural
/// order (`x`: `[n, cols]`) into `out[..n]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tail_f32(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    from: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32; TILE],
) {
    for c in (from..cols).step_by(16) {
        let s = e4m3_to_f32(scales[c / 16]) * gs;
        for (t, o) in out.iter_mut().enumerate().take(n) {
            let mut sum = 0.0f32;
            for j in c..c + 16 {
                let code = (packed[j / 2] >> (4 * (j % 2))) & 0xF;
                sum += E2M1[code as usize] * x[t * cols + j];
            }
            *o += s * sum;
        }
    }
}

/// Adds the 16-column NVFP4 blocks from column `from` (the end of the last
/// full chunk) to `cols` against `n` tokens of int8 activations, which are
/// in natural order there with one scale per `group` columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tail_q8(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    from: usize,
    x: Q8In<'_>,
    group: usize,
    n: usize,
    out: &mut [f32; TILE],
) {
    for c in (from..cols).step_by(16) {
        let s = e4m3_to_f32(scales[c / 16]) * gs;
        for (t, o) in out.iter_mut().enumerate().take(n) {
            let sum: i32 = (c..c + 16)
                .map(|j| {
                    let code = (packed[j / 2] >> (4 * (j % 2))) & 0xF;
                    i32::from(E2M1_DOUBLED[code as usize]) * i32::from(x.q[t * x.stride + j])
                })
                .sum();
            *o += s * x.scale[(t * cols + c) / group] * sum as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Global scales that fold (a normal `2^120 gs`) and that do not.
    const SCALES: [f32; 10] =
        [1.0, 0.0123, 3.0e-7, 255.9, 1.0e-38, 256.0, 1.0e30, 1.0e-40, 0.0, f32::NAN];

    /// Runs `decode` over every byte in groups of `width`, for every scale,
    /// against the scalar decode times the scale, bit for bit (the 0x7F and
    /// 0xFF NaN codes, which `pack verify` rejects, are not special-cased by
    /// the vector decoders and are skipped).
    fn check(width: usize, decode: impl Fn(&[u8], E4m3Scale) -> Vec<f32>) {
        let bytes: Vec<u8> = (0..=255).collect();
        for gs in SCALES {
            for group in bytes.chunks_exact(width) {
                let got = decode(group, E4m3Scale::new(gs));
                for (&b, g) in group.iter().zip(got).filter(|(b, _)| **b & 0x7F != 0x7F) {
                    let want = e4m3_to_f32(b) * gs;
                    let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                    assert!(same, "byte {b:#04x} gs {gs:e}: {g:e} vs {want:e}");
                }
            }
        }
    }

    #[test]
    fn e4m3x16_is_bit_identical_to_the_scalar_decode_for_every_byte_and_scale() {
        if !std::is_x86_feature_detected!("avx512bw") || !std::is_x86_feature_detected!("avx512vl")
        {
            eprintln!("no AVX-512 here: nothing to compare");
            return;
        }
        check(16, |sixteen, gs| {
            let mut got = vec![0f32; 16];
            // SAFETY: AVX-512 F/BW/VL checked above; 16 bytes at the pointer,
            // 16 floats in `got`.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), e4m3x16(sixteen.as_ptr(), gs)) };
            got
        });
    }

    #[test]
    fn e4m3x8_is_bit_identical_to_the_scalar_decode_for_every_byte_and_scale() {
        if !std::is_x86_feature_detected!("avx2") || !std::is_x86_feature_detected!("fma") {
            eprintln!("no AVX2 here: nothing to compare");
            return;
        }
        check(8, |eight, gs| {
            let mut got = vec![0f32; 8];
            // SAFETY: AVX2 + FMA checked above; 8 bytes at the pointer, 8
            // floats in `got`.
            unsafe {
                let b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(eight.as_ptr() as *const __m128i));
                _mm256_storeu_ps(got.as_mut_ptr(), e4m3x8(b, gs));
            }
            got
        });
    }

    #[test]
    fn offset_bytes_are_the_doubled_values_plus_the_offset() {
        let t: [u8; 32] = e2m1_offset_bytes();
        for (i, b) in t.iter().enumerate() {
            assert_eq!(i32::from(*b) - NVFP4_OFFSET, (2.0 * E2M1_VALUES[i % 16]) as i32);
        }
    }
}
