//! AVX2 NVFP4 GEMM tile on int8 activations (quantized per 16-column block,
//! `kernels::q8act`, in 128-column chunks): one weight row against up to 8
//! tokens, the AVX2 counterpart of `simd::vnni_tile` (prefill, batched
//! decode and verification; one token is decode). Twin: the
//! generic f32 path on the dequantized activations (`kernels::round_q8`);
//! the integer sums are exact.
//!
//! The unit is a 128-column chunk: 64 packed bytes, 8 blocks of 16 columns,
//! and every dword lane of the vectors below holds columns of one block
//! only, as in `simd::vnni_tile`, lane `L` block `b = AVX2_BLOCK_LANES[L]`
//! (`[0, 1, 4, 5 | 2, 3, 6, 7]`). Two plain 32-byte loads and two in-lane
//! `vshufps` regroup a row's bytes so that lane `L` of the first holds
//! packed bytes `8b..8b+3`, of the second `8b+4..8b+7`; `vpshufb` turns
//! each low nibble, and after a shift each high nibble, into the unsigned
//! `2 * E2M1(code) + 12` (0..=24, as `vpmaddubsw` wants its first operand).
//! Per (row, token) pair and chunk: four `vpmaddubsw` against the
//! activations' four vectors, three 16-bit adds (eight products a 16-bit
//! lane, at most 8 * 24 * 127 = 24,384: no overflow), one `vpmaddwd` by
//! ones that leaves one block per dword lane, the quantizer's `corr = -12 *
//! sum(q)` added (the offset removed exactly), then one float step per
//! block: a multiply of the two scales, a convert and an FMA. Until 02714e0
//! the chunk was 64 columns with a dword lane per half block: a float step
//! per 8 columns and two `vpmaddwd` per 128. Until d9c2c4c the lanes held
//! blocks in natural order, from loads that took the chunk's 16-byte
//! quarters as `[0 | 2]` and `[1 | 3]`: 0.88x as fast for one token on Zen 1.
//! A row's nibbles are expanded once per token tile. The f32 steps of a
//! (row, token) pair do not depend on `N` or the token's place in the tile,
//! so a token's result is bit-identical alone and batched.
//!
//! [`q8_chunk128`] is the chunk-wide activation quantizer of this layout:
//! the scalar rule of `kernels::q8act` lane by lane, bit for bit.

use core::arch::x86_64::*;

use super::types::{Q8In, AVX2_BLOCK_LANES, NVFP4_OFFSET, TILE};
use super::x86::{e2m1_offset_bytes, e4m3x8, hsum256, prefetch_ahead, tail_q8, E4m3Scale};

/// `2 * E2M1(code) + 12`, for both 128-bit lanes of `vpshufb`.
const E2M1_U8: [u8; 32] = e2m1_offset_bytes();

/// Columns per chunk.
pub(crate) const CHUNK: usize = 128;

/// Columns per activation scale and offset correction (one block).
pub(crate) const GROUP: usize = 16;

/// The 8 block scales of one chunk (8 bytes at `p`) times `gs`, lane `L` =
/// block `AVX2_BLOCK_LANES[L]`.
///
/// # Safety
/// AVX2 must be available; 8 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_scales(p: *const u8, gs: E4m3Scale) -> __m256 {
    // SAFETY: 8 bytes at `p` by the caller.
    let bytes = unsafe { _mm_loadl_epi64(p as *const __m128i) };
    // Byte pairs (blocks 0-1, 2-3, 4-5, 6-7) to blocks [0, 1, 4, 5, 2, 3, 6, 7].
    let lanes = _mm_shufflelo_epi16::<0b11_01_10_00>(bytes);
    e4m3x8(_mm256_cvtepi8_epi32(lanes), gs)
}

/// The largest magnitude of the 16 floats `a`, `b`; `None` if one is a NaN
/// or an infinity.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn block_amax(a: __m256, b: __m256) -> Option<f32> {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let inf = _mm256_set1_ps(f32::INFINITY);
    let (a, b) = (_mm256_and_ps(a, abs), _mm256_and_ps(b, abs));
    // NaN compares unordered: not less than infinity either.
    let bad =
        _mm256_or_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf), _mm256_cmp_ps::<_CMP_NLT_UQ>(b, inf));
    if _mm256_movemask_ps(bad) != 0 {
        return None;
    }
    let h = _mm256_max_ps(a, b);
    let h = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    Some(_mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h))))
}

/// Quantizes one 128-column chunk (8 blocks of 16 columns) to int8 exactly
/// as `kernels::q8act`'s scalar rule does block by block (`amax / 127`,
/// `x * (127 / amax)`, plus or minus 0.5, clamp to 127, truncate: the same
/// f32 operations lane by lane), writing `q` in this kernel's layout (four
/// 32-byte vectors; dword lane `L` of vector `v` holds four columns of
/// block `AVX2_BLOCK_LANES[L]`: the partners of the weight bytes the kernel
/// puts there), and per lane its block's `corr = -NVFP4_OFFSET * sum(q)`
/// and `scale` = half the block's scale. Returns false, writing nothing,
/// when the chunk holds a NaN or an infinity, or a block's `127 / amax` is
/// not finite (the scalar rule then decides).
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn q8_chunk128(
    x: &[f32; 128],
    q: &mut [i8; 128],
    corr: &mut [i32; 8],
    scale: &mut [f32; 8],
) -> bool {
    // SAFETY: 128 floats in `x`, 128 bytes in `q`, 8 lanes in `corr` and
    // `scale`: every load and store below stays inside them.
    unsafe {
        let v: [__m256; 16] = core::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let mut inv = [0f32; 8];
        let mut half = [0f32; 8];
        for b in 0..8 {
            let Some(m) = block_amax(v[2 * b], v[2 * b + 1]) else { return false };
            let (s, i) = if m > 0.0 { (m / 127.0, 127.0 / m) } else { (0.0, 0.0) };
            if !i.is_finite() {
                return false;
            }
            (inv[b], half[b]) = (i, 0.5 * s);
        }
        *scale = AVX2_BLOCK_LANES.map(|b| half[b]);
        let (k, zero) = (_mm256_set1_ps(127.0), _mm256_setzero_ps());
        let (pos, neg) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
        let d: [__m256i; 16] = core::array::from_fn(|i| {
            let y = _mm256_mul_ps(v[i], _mm256_set1_ps(inv[i / 2]));
            let half = _mm256_blendv_ps(neg, pos, _mm256_cmp_ps::<_CMP_GE_OQ>(y, zero));
            let r = _mm256_min_ps(k, _mm256_max_ps(_mm256_set1_ps(-127.0), _mm256_add_ps(y, half)));
            _mm256_cvttps_epi32(r)
        });
        // corr: per block the sum of its two dword vectors' 16 lanes.
        let e: [__m256i; 8] = core::array::from_fn(|b| _mm256_add_epi32(d[2 * b], d[2 * b + 1]));
        let h01 = _mm256_hadd_epi32(e[0], e[1]);
        let h23 = _mm256_hadd_epi32(e[2], e[3]);
        let h45 = _mm256_hadd_epi32(e[4], e[5]);
        let h67 = _mm256_hadd_epi32(e[6], e[7]);
        let (h03, h47) = (_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67));
        let sums = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h03, h47),
            _mm256_permute2x128_si256::<0x31>(h03, h47),
        );
        // Blocks [0, 1 | 2, 3 | 4, 5 | 6, 7] in 64-bit quarters -> lane order.
        let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(sums);
        let c = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-NVFP4_OFFSET));
        _mm256_storeu_si256(corr.as_mut_ptr() as *mut __m256i, c);
        // Bytes of 32 columns in natural order (values are within
        // -127..=127: packing saturates nothing): blocks 2i and 2i + 1 in the
        // two 128-bit lanes; then per block the dwords [even of columns 0..8 |
        // odd of 0..8 | even of 8..16 | odd of 8..16], one per vector.
        let natural = |a: &[__m256i]| {
            let w =
                _mm256_packs_epi16(_mm256_packs_epi32(a[0], a[1]), _mm256_packs_epi32(a[2], a[3]));
            _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        };
        let split = _mm256_setr_epi8(
            0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, //
            0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
        );
        let mut by_block = [0u32; 32];
        for (i, four) in d.chunks_exact(4).enumerate() {
            let n = _mm256_shuffle_epi8(natural(four), split);
            _mm256_storeu_si256(by_block.as_mut_ptr().add(8 * i) as *mut __m256i, n);
        }
        // Dword (block b, vector v) -> vector v, block b's lane.
        let mut out = [0u32; 32];
        for (b, dwords) in by_block.chunks_exact(4).enumerate() {
            for (v, &w) in dwords.iter().enumerate() {
                out[8 * v + AVX2_BLOCK_LANES[b]] = w;
            }
        }
        for (o, w) in q.chunks_exact_mut(4).zip(out) {
            o.copy_from_slice(&w.to_le_bytes().map(|b| b as i8));
        }
        true
    }
}

/// Most tokens per tile: with one row's four expanded weight vectors, the
/// `TOKENS` accumulators and one token's temporaries fill the 16 registers
/// (2 rows x 4 tokens spilled 31 vectors a chunk and ran 0.81-0.85x as fast in
/// cache).
pub(crate) const TOKENS: usize = 8;

/// Every full chunk's block scales of `rows` NVFP4 rows (`scales` = `rows *
/// cols / 16` bytes) as [`nvfp4_tile`] uses them (8 floats per row and
/// 128-column chunk, row-major), for rows that pass several token tiles:
/// decoded once instead of once per tile.
///
/// # Safety
/// AVX2 and FMA must be available; `scales.len() == rows * cols / 16`,
/// `out.len() == rows * (cols / 128) * 8`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn decode_scales(scales: &[u8], gs: f32, cols: usize, out: &mut [f32]) {
    let (chunks, srow) = (cols / CHUNK, cols / 16);
    let rows = scales.len() / srow.max(1);
    debug_assert!(scales.len() == rows * srow && out.len() == rows * chunks * 8);
    let gsv = E4m3Scale::new(gs);
    for r in 0..rows {
        for c in 0..chunks {
            // SAFETY: 8 bytes at r*srow + 8c < scales.len(); 8 floats at
            // (r*chunks + c)*8 < out.len(), by the preconditions.
            unsafe {
                let v = block_scales(scales.as_ptr().add(r * srow + 8 * c), gsv);
                _mm256_storeu_ps(out.as_mut_ptr().add((r * chunks + c) * 8), v);
            }
        }
    }
}

/// One row's chunk (64 packed bytes at `p`) as four vectors of doubled,
/// offset E2M1 bytes whose dword lane `L` holds four columns of block `b =
/// AVX2_BLOCK_LANES[L]` (vector `2h + n`: packed bytes `8b + 4h..+4`, low
/// nibbles for `n = 0`, high for `n = 1`).
///
/// # Safety
/// AVX2 must be available; 64 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn expand(p: *const u8, lut: __m256i) -> [__m256i; 4] {
    let nib = _mm256_set1_epi8(0x0F);
    // SAFETY: 64 bytes at `p` by the caller.
    let (a, b) = unsafe {
        let at = |o: usize| p.add(o) as *const __m256i;
        (_mm256_loadu_si256(at(0)), _mm256_loadu_si256(at(32)))
    };
    // Dword lanes of `a`/`b`: two per block, blocks [0, 1 | 2, 3] / [4, 5 |
    // 6, 7]; the shuffles take lanes 0, 2 (0x88) or 1, 3 (0xDD) of each
    // 128-bit half of `a`, then of `b`: blocks [0, 1, 4, 5 | 2, 3, 6, 7].
    let (a, b) = (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
    let h0 = _mm256_castps_si256(_mm256_shuffle_ps::<0x88>(a, b));
    let h1 = _mm256_castps_si256(_mm256_shuffle_ps::<0xDD>(a, b));
    let lo = |v: __m256i| _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nib));
    let hi =
        |v: __m256i| _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
    [lo(h0), hi(h0), lo(h1), hi(h1)]
}

/// One NVFP4 row (`packed` = `cols / 2` bytes, `scales` = `cols / 16`)
/// against `N` tokens of int8 activations in 128-column chunks; writes
/// `out[..N]`. `pre` is empty, or the row's scales from [`decode_scales`]
/// (the same values, not decoded again).
///
/// # Safety
/// AVX2 and FMA must be available; `N <= TOKENS`, `cols % 16 == 0`,
/// `packed.len() == cols / 2`, `scales.len() == cols / 16`; `x.stride >=
/// cols`, `x.q.len() >= (N - 1) * x.stride + cols`, `x.corr` and `x.scale`
/// at least `N * cols / 16` long;
/// `pre.len()` is 0 or `(cols / 128) * 8`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nvfp4_tile<const N: usize>(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [f32; TILE],
) {
    debug_assert!(N <= TOKENS && cols % 16 == 0);
    debug_assert!(packed.len() == cols / 2 && scales.len() == cols / 16);
    debug_assert!(x.stride >= cols && x.q.len() >= (N - 1) * x.stride + cols);
    debug_assert!(x.scale.len() >= N * cols / GROUP);
    debug_assert!(x.corr.len() >= N * cols / GROUP);
    debug_assert!(pre.is_empty() || pre.len() == (cols / CHUNK) * 8);
    let chunks = cols / CHUNK;
    // SAFETY: chunk c reads packed[64c..+64] and scales[8c..+8] (or
    // pre[8c..+8]), q[t*stride + 128c..+128] and corr/scale[t*cols/16 +
    // 8c..+8] for t < N: inside the slices by the preconditions.
    unsafe {
        let lut = _mm256_loadu_si256(E2M1_U8.as_ptr() as *const __m256i);
        let (ones, gsv) = (_mm256_set1_epi16(1), E4m3Scale::new(gs));
        let mut acc = [_mm256_setzero_ps(); N];
        for c in 0..chunks {
            let p = packed.as_ptr().add(64 * c);
            prefetch_ahead(p);
            let w = expand(p, lut);
            let ws = if pre.is_empty() {
                block_scales(scales.as_ptr().add(8 * c), gsv)
            } else {
                _mm256_loadu_ps(pre.as_ptr().add(8 * c))
            };
            for (t, acc) in acc.iter_mut().enumerate() {
                let q = x.q.as_ptr().add(t * x.stride + CHUNK * c) as *const __m256i;
                let g = t * cols / GROUP + 8 * c;
                let qv = |i: usize| _mm256_loadu_si256(q.add(i));
                let s01 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w[0], qv(0)),
                    _mm256_maddubs_epi16(w[1], qv(1)),
                );
                let s23 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w[2], qv(2)),
                    _mm256_maddubs_epi16(w[3], qv(3)),
                );
                let i = _mm256_madd_epi16(_mm256_add_epi16(s01, s23), ones);
                let corr = _mm256_loadu_si256(x.corr.as_ptr().add(g) as *const __m256i);
                let i = _mm256_add_epi32(i, corr);
                let s = _mm256_mul_ps(ws, _mm256_loadu_ps(x.scale.as_ptr().add(g)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, *acc);
            }
        }
        for (v, a) in out.iter_mut().zip(&acc) {
            *v = hsum256(*a);
        }
    }
    // Columns after the last full chunk (none in most products).
    if chunks * CHUNK < cols {
        tail_q8(packed, scales, gs, cols, chunks * CHUNK, x, GROUP, N, out);
    }
}
