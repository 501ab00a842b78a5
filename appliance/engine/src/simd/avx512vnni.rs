//! The AVX-512 activation quantizer of the int8 NVFP4 kernels: one
//! 256-column chunk of f32 activations to int8 per 16-column block
//! (`kernels::q8act`'s scalar rule, bit for bit), in `simd::vnni_tile`'s
//! layout, with each block's scale and offset correction (`corr =
//! -NVFP4_OFFSET * sum(q)`: the int8 kernels offset their doubled E2M1
//! weights by +12 to make them unsigned, and starting each dword lane's sum
//! at `corr` removes that exactly).

use core::arch::x86_64::*;

use super::types::NVFP4_OFFSET;

/// `vpermd` indices undoing the lane order both transposes below leave:
/// lane `4q + s` holds block `4s + q`.
const TRANSPOSED: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Quantizes one 256-column chunk (16 blocks of 16 columns) to int8 exactly
/// as `kernels::q8_block` does block by block (the same f32 operations lane
/// by lane: `amax / 127`, `x * (127 / amax)`, plus or minus 0.5, clamp to
/// 127, truncate), writing `q` in `simd::vnni_tile`'s layout (vector `v`,
/// dword lane `L` = columns `16L + {0,2,4,6}`, `{1,3,5,7}`, `{8,..,14}`,
/// `{9,..,15}` for `v` = 0..3), and per block `corr = -OFFSET * sum(q)` and
/// `scale` = half the block's scale. Returns false, writing nothing, if the
/// chunk holds a NaN or an infinity (the scalar path then decides).
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q8_chunk256(
    x: &[f32; 256],
    q: &mut [i8; 256],
    corr: &mut [i32; 16],
    scale: &mut [f32; 16],
) -> bool {
    // SAFETY: 256 floats in `x`, 256 bytes in `q`, 16 lanes in `corr` and
    // `scale`: every load and store below stays inside them.
    unsafe {
        let (mut v, mut a) = ([_mm512_setzero_ps(); 16], [_mm512_setzero_ps(); 16]);
        let mut bad = 0;
        for b in 0..16 {
            v[b] = _mm512_loadu_ps(x.as_ptr().add(16 * b));
            a[b] = _mm512_abs_ps(v[b]);
            bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a[b], _mm512_set1_ps(f32::INFINITY));
        }
        if bad != 0 {
            return false;
        }
        let amax = block_max(&a);
        let some = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(amax, _mm512_setzero_ps());
        let k = _mm512_set1_ps(127.0);
        let s = _mm512_maskz_div_ps(some, amax, k);
        let inv = _mm512_maskz_div_ps(some, k, amax);
        _mm512_storeu_ps(scale.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(0.5), s));
        // Each block's 16 bytes as [cols 0,2,4,6 | 1,3,5,7 | 8,..,14 | 9,..,15]:
        // dword d of block b belongs in vector d, lane b.
        let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
        let mut bytes = [_mm_setzero_si128(); 16];
        for (b, out) in bytes.iter_mut().enumerate() {
            let y = _mm512_mul_ps(v[b], _mm512_permutexvar_ps(_mm512_set1_epi32(b as i32), inv));
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(y, _mm512_setzero_ps());
            let half = _mm512_mask_blend_ps(up, _mm512_set1_ps(-0.5), _mm512_set1_ps(0.5));
            // max/min return their second operand for a NaN (an infinite
            // `inv` times 0): it truncates to 0 as Rust's `as i8` does.
            let r = _mm512_add_ps(y, half);
            let r = _mm512_min_ps(k, _mm512_max_ps(_mm512_set1_ps(-127.0), r));
            *out = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)), order);
        }
        let mut z = [_mm512_setzero_si512(); 4];
        for (m, z) in z.iter_mut().enumerate() {
            let v = _mm512_castsi128_si512(bytes[4 * m]);
            let v = _mm512_inserti32x4::<1>(v, bytes[4 * m + 1]);
            let v = _mm512_inserti32x4::<2>(v, bytes[4 * m + 2]);
            *z = _mm512_inserti32x4::<3>(v, bytes[4 * m + 3]);
        }
        // A 4x4 dword transpose within each 128-bit lane: vector d lane
        // 4i + m = block 4m + i's dword d.
        let (t0, t1) = (_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
        let (t2, t3) = (_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
        let u = [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ];
        let idx = _mm512_loadu_si512(TRANSPOSED.as_ptr() as *const __m512i);
        let ones = _mm512_set1_epi8(1);
        let mut sum = _mm512_setzero_si512();
        for (d, u) in u.into_iter().enumerate() {
            let w = _mm512_permutexvar_epi32(idx, u);
            sum = _mm512_dpbusd_epi32(sum, ones, w);
            _mm512_storeu_si512(q.as_mut_ptr().add(64 * d) as *mut __m512i, w);
        }
        let c = _mm512_mullo_epi32(sum, _mm512_set1_epi32(-NVFP4_OFFSET));
        _mm512_storeu_si512(corr.as_mut_ptr() as *mut __m512i, c);
        true
    }
}

/// Lane `b` = the largest lane of `a[b]`: a reduction tree over the 16
/// vectors at once (max is exact in any order).
#[target_feature(enable = "avx512f")]
fn block_max(a: &[__m512; 16]) -> __m512 {
    // Quarters 0-1 of m[i] hold block 2i, quarters 2-3 block 2i + 1.
    let mut m = [_mm512_setzero_ps(); 8];
    for (i, m) in m.iter_mut().enumerate() {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        *m = _mm512_max_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y));
    }
    // Quarter q of n[j] holds block 4j + q.
    let mut n = [_mm512_setzero_ps(); 4];
    for (j, n) in n.iter_mut().enumerate() {
        let (x, y) = (m[2 * j], m[2 * j + 1]);
        *n = _mm512_max_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y));
    }
    // Quarter q of p[k]: lanes 0-1 block 8k + q, lanes 2-3 block 8k + 4 + q.
    let mut p = [_mm512_setzero_ps(); 2];
    for (k, p) in p.iter_mut().enumerate() {
        let (x, y) = (n[2 * k], n[2 * k + 1]);
        *p = _mm512_max_ps(_mm512_shuffle_ps::<0x88>(x, y), _mm512_shuffle_ps::<0xDD>(x, y));
    }
    // Lane 4q + s: block 4s + q.
    let (x, y) = (p[0], p[1]);
    let r = _mm512_max_ps(_mm512_shuffle_ps::<0x88>(x, y), _mm512_shuffle_ps::<0xDD>(x, y));
    // SAFETY: 16 i32 in TRANSPOSED.
    let idx = unsafe { _mm512_loadu_si512(TRANSPOSED.as_ptr() as *const __m512i) };
    _mm512_permutexvar_ps(idx, r)
}
