//! AVX-512 VNNI NVFP4 GEMM tile: `R` consecutive weight rows against `N`
//! tokens of int8 activations (`kernels::q8act`), the multi-token kernel of
//! prefill chunks, batched decode and speculative verification, and (with
//! `R = N = 1`) of decode itself.
//!
//! The unit is a 256-column chunk: 128 packed bytes, 16 blocks of 16
//! columns, and every dword lane of the vectors below holds columns of one
//! block only (lane `L` = block `L`). Per chunk each row's two 64-byte loads
//! are regrouped by two `vpermt2b` (lane `L` of the first takes packed
//! bytes `8L..8L+3`, of the second `8L+4..8L+7`) and expanded by four
//! `vpermb` (low nibbles, and after a 16-bit shift high nibbles) into
//! doubled, offset E2M1 bytes (`simd::x86::e2m1_offset_bytes`); its 16 block scales are
//! one `e4m3x16`. Each token's four activation vectors, offset correction
//! and scales are loaded once per chunk; then every (row, token) pair takes
//! four `vpdpbusd` into one accumulator, a multiply of the block scales, a
//! convert and one FMA: one float step per block, not one per half block
//! as with 128-column chunks (measured 1.35-1.48x more multiply-adds per
//! second at 4-8 tokens, 1.16x at one, with the chunk in L2).
//!
//! The f32 steps of one (row, token) pair do not depend on `R`, `N` or where
//! the pair sits in the tile, so a token's result is bit-identical whether
//! it runs alone or batched with others.

use core::arch::x86_64::*;
use core::mem::transmute;

use super::types::{Q8In, TILE, TILE_ROWS};
use super::x86::{
    e2m1_offset_bytes, e4m3x16, prefetch_ahead, prefetch_scales_ahead, tail_q8, E4m3Scale,
};

/// `2 * E2M1(code) + 12` for the low 4 bits of a `vpermb` index (6 bits).
const E2M1_U8: [u8; 64] = e2m1_offset_bytes();

/// Columns per chunk.
pub(crate) const CHUNK: usize = 256;

/// Rows per tile in the multi-row kernel (each row keeps four weight
/// vectors in registers).
pub(crate) const ROWS: usize = 2;

/// Most tokens per tile (`ROWS x TOKENS` accumulators, each row's four
/// weight vectors and scales, and one token's loads fit in the 32 vector
/// registers).
pub(crate) const TOKENS: usize = 8;

/// Columns per activation scale and offset correction (one block).
pub(crate) const GROUP: usize = 16;

/// `vpermt2b` indices: byte `4L + j` of vector `h` is packed byte
/// `8L + 4h + j` of a chunk's 128 (the first 64 from the first register).
const SPLIT: [[u8; 64]; 2] = {
    let mut t = [[0u8; 64]; 2];
    let mut h = 0;
    while h < 2 {
        let mut i = 0;
        while i < 64 {
            t[h][i] = (8 * (i / 4) + 4 * h + i % 4) as u8;
            i += 1;
        }
        h += 1;
    }
    t
};

/// Every full chunk's block scales of `rows` NVFP4 rows (`scales` = `rows *
/// cols / 16` bytes) times `gs`, as [`nvfp4_tile`] uses them (16 floats per
/// row and chunk, row-major), for a product whose rows pass several token
/// tiles: decoded once instead of once per tile.
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `scales.len() == rows * cols / 16`,
/// `out.len() == rows * (cols / CHUNK) * 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn decode_scales(scales: &[u8], gs: f32, cols: usize, out: &mut [f32]) {
    let (chunks, srow) = (cols / CHUNK, cols / 16);
    let rows = scales.len() / srow.max(1);
    debug_assert!(scales.len() == rows * srow && out.len() == rows * chunks * 16);
    let gsv = E4m3Scale::new(gs);
    for r in 0..rows {
        for c in 0..chunks {
            // SAFETY: 16 bytes at r*srow + 16c <= scales.len(); 16 floats at
            // (r*chunks + c)*16 < out.len(), by the preconditions.
            unsafe {
                let sv = e4m3x16(scales.as_ptr().add(r * srow + 16 * c), gsv);
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
/// and `x.scale.len() >= N * cols / GROUP`, the activations laid out per
/// chunk as `kernels::q8act`'s `Layout::BlockLanes256` says; `pre.len()` is 0 or
/// `R * (cols / CHUNK) * 16`.
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
    out: &mut [[f32; TILE]; TILE_ROWS],
) {
    debug_assert!(R <= ROWS && N <= TOKENS && cols % 16 == 0);
    debug_assert!(pre.is_empty() || pre.len() == R * (cols / CHUNK) * 16);
    debug_assert!(packed.len() == R * cols / 2 && scales.len() == R * cols / 16);
    debug_assert!(x.q.len() >= N * cols && x.corr.len() >= N * cols / GROUP);
    debug_assert!(x.scale.len() >= N * cols / GROUP && x.stride == cols);
    let (chunks, prow, srow) = (cols / CHUNK, cols / 2, cols / 16);
    // SAFETY: chunk c reads packed[r*prow + 128c..+128] and scales[r*srow +
    // 16c..+16] (or pre[(r*chunks + c)*16..+16]) for r < R, q[t*cols +
    // 256c..+256] and corr/scale[t*cols/16 + 16c..+16] for t < N: inside
    // the slices by the preconditions.
    unsafe {
        let lut: __m512i = transmute(E2M1_U8);
        let split: [__m512i; 2] = transmute(SPLIT);
        let gsv = E4m3Scale::new(gs);
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        for c in 0..chunks {
            let mut w = [[_mm512_setzero_si512(); 4]; R];
            let mut sv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let p = packed.as_ptr().add(r * prow + 128 * c);
                prefetch_ahead(p);
                prefetch_ahead(p.add(64));
                if c % 4 == 0 {
                    // The block scales' own stream, a line every 4 chunks.
                    prefetch_scales_ahead(scales.as_ptr().add(r * srow + 16 * c));
                }
                let d0 = _mm512_loadu_si512(p as *const __m512i);
                let d1 = _mm512_loadu_si512(p.add(64) as *const __m512i);
                let e = _mm512_permutex2var_epi8(d0, split[0], d1);
                let f = _mm512_permutex2var_epi8(d0, split[1], d1);
                w[r][0] = _mm512_permutexvar_epi8(e, lut);
                w[r][1] = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(e), lut);
                w[r][2] = _mm512_permutexvar_epi8(f, lut);
                w[r][3] = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(f), lut);
                sv[r] = if pre.is_empty() {
                    e4m3x16(scales.as_ptr().add(r * srow + 16 * c), gsv)
                } else {
                    _mm512_loadu_ps(pre.as_ptr().add((r * chunks + c) * 16))
                };
            }
            for t in 0..N {
                let q = x.q.as_ptr().add(t * cols + CHUNK * c) as *const __m512i;
                let g = t * cols / GROUP + 16 * c;
                let corr = _mm512_loadu_si512(x.corr.as_ptr().add(g) as *const __m512i);
                let xs = _mm512_loadu_ps(x.scale.as_ptr().add(g));
                let qs = [
                    _mm512_loadu_si512(q),
                    _mm512_loadu_si512(q.add(1)),
                    _mm512_loadu_si512(q.add(2)),
                    _mm512_loadu_si512(q.add(3)),
                ];
                for r in 0..R {
                    let i = _mm512_dpbusd_epi32(corr, w[r][0], qs[0]);
                    let i = _mm512_dpbusd_epi32(i, w[r][1], qs[1]);
                    let i = _mm512_dpbusd_epi32(i, w[r][2], qs[2]);
                    let i = _mm512_dpbusd_epi32(i, w[r][3], qs[3]);
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
    // Columns after the last full chunk (none in most products).
    for (r, o) in out.iter_mut().enumerate().take(if chunks * CHUNK < cols { R } else { 0 }) {
        let (p, s) = (&packed[r * prow..(r + 1) * prow], &scales[r * srow..(r + 1) * srow]);
        tail_q8(p, s, gs, cols, chunks * CHUNK, x, GROUP, N, o);
    }
}
