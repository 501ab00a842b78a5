//! AVX-512 VNNI GEMM tile for q8 weights (`Linear::Q8`: int8, one F16 scale per 32 columns, the `q8` output head) on
//! int8 activations quantized per 16-column block (`kernels::q8act`, in
//! natural column order). Twin: the generic f32 path on the dequantized
//! activations (`kernels::round_q8`); integer sums are exact.
//!
//! `vpdpbusd` wants one unsigned operand: the weights are flipped to
//! `w + 128` (one `vpxor` with `0x80`) and each token's `corr = -128 *
//! sum(q)` per 4-column dword lane, the accumulator's start value, removes
//! the offset exactly. One 64-byte load holds 64 columns; per (row, token):
//! one `vpdpbusd`, a multiply of the block scales, a convert and one FMA.
//! As in `simd::vnni_tile`, the f32 steps of a (row, token) pair do not
//! depend on the tile, so a token's logits are the same alone and batched.

use core::arch::x86_64::*;

use super::types::{Q8In, Q8_GROUP, Q8_OFFSET, TILE, TILE_ROWS};
use super::x86::prefetch_ahead;

/// Rows per tile in the multi-row kernel.
pub(crate) const ROWS: usize = 4;

/// Most tokens per tile.
pub(crate) const TOKENS: usize = 4;

/// The two F16 block scales of 64 columns at `p`, each in the 8 dword lanes
/// of its block.
///
/// # Safety
/// AVX-512 F and F16C must be available; 4 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn scales64(p: *const u8) -> __m512 {
    // SAFETY: 4 bytes at `p` by the caller.
    let h = _mm_cvtsi32_si128(i32::from_le_bytes(unsafe { *(p as *const [u8; 4]) }));
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)))
}

/// `R` consecutive Q8 rows (`data` = `R * cols` bytes, `scales` = `R * cols
/// / 32` F16) against `N` tokens of quantized activations; writes
/// `out[r][..N]` for `r < R`.
///
/// # Safety
/// AVX-512 F/BW/VL, VNNI and F16C must be available; `R <= ROWS`,
/// `N <= TOKENS`, `cols % 32 == 0`, `data.len() == R * cols`,
/// `scales.len() == R * cols / 16`; `x.q.len() >= N * cols`,
/// `x.corr.len()` and `x.scale.len() >= N * cols / 4`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
// Token and row indices address two register arrays at once.
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn q8_tile<const R: usize, const N: usize>(
    data: &[u8],
    scales: &[u8],
    cols: usize,
    x: Q8In<'_>,
    out: &mut [[f32; TILE]; TILE_ROWS],
) {
    debug_assert!(R <= ROWS && N <= TOKENS && cols % Q8_GROUP == 0);
    debug_assert!(data.len() == R * cols && scales.len() == R * cols / 16);
    debug_assert!(x.q.len() >= N * cols && x.corr.len() >= N * cols / 4);
    debug_assert!(x.scale.len() >= N * cols / 4 && x.stride == cols);
    let (steps, srow) = (cols / 64, cols / 16);
    // SAFETY: step c reads data[r*cols + 64c..+64] and scales[r*srow +
    // 4c..+4] for r < R, q[t*cols + 64c..+64] and corr/scale[t*cols/4 +
    // 16c..+16] for t < N: inside the slices by the preconditions.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for c in 0..steps {
            let mut w = [_mm512_setzero_si512(); R];
            let mut sw = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let p = data.as_ptr().add(r * cols + 64 * c);
                prefetch_ahead(p);
                w[r] = _mm512_xor_si512(_mm512_loadu_si512(p as *const __m512i), flip);
                sw[r] = scales64(scales.as_ptr().add(r * srow + 4 * c));
            }
            for t in 0..N {
                let g = t * cols / 4 + 16 * c;
                let corr = _mm512_loadu_si512(x.corr.as_ptr().add(g) as *const __m512i);
                let q = _mm512_loadu_si512(x.q.as_ptr().add(t * cols + 64 * c) as *const __m512i);
                let xs = _mm512_loadu_ps(x.scale.as_ptr().add(g));
                for r in 0..R {
                    let i = _mm512_dpbusd_epi32(corr, w[r], q);
                    let s = _mm512_mul_ps(sw[r], xs);
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
    if steps * 64 < cols {
        for (r, o) in out.iter_mut().enumerate().take(R) {
            tail(&data[r * cols..(r + 1) * cols], &scales[r * srow..(r + 1) * srow], cols, x, N, o);
        }
    }
}

/// Adds the last 32 columns (when `cols % 64 == 32`), lane by lane.
fn tail(data: &[u8], scales: &[u8], cols: usize, x: Q8In<'_>, n: usize, out: &mut [f32; TILE]) {
    let c0 = cols - Q8_GROUP;
    let b = c0 / Q8_GROUP;
    let sw = half::f16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]).to_f32();
    for (t, o) in out.iter_mut().enumerate().take(n) {
        for lane in (c0..cols).step_by(4) {
            let sum: i32 = (lane..lane + 4)
                .map(|j| (i32::from(data[j] as i8) + Q8_OFFSET) * i32::from(x.q[t * cols + j]))
                .sum();
            let g = (t * cols + lane) / 4;
            *o += (sum + x.corr[g]) as f32 * (sw * x.scale[g]);
        }
    }
}
