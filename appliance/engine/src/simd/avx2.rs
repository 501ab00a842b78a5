//! AVX2 + FMA + F16C dense row kernels (the fallback below AVX-512). Twins:
//! `kernels::generic`; same contracts as `simd::avx512`. NVFP4 rows on AVX2
//! take int8 activations: `simd::avx2_q8`.

use core::arch::x86_64::*;

/// E2M1 code -> value (bit 3 = sign), the format crate's table.
pub(crate) use kore_pack_format::fp::E2M1_VALUES as E2M1_LUT;

/// The sum of the 8 lanes of `a`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(a: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Loads 8 dense elements at element offset `i` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(dtype: u8, data: *const u8, i: usize) -> __m256 {
    use super::avx512::{DT_BF16, DT_F16};
    // SAFETY: the caller guarantees 8 readable elements at element `i`.
    unsafe {
        match dtype {
            DT_BF16 => {
                let h = _mm_loadu_si128(data.add(2 * i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            DT_F16 => _mm256_cvtph_ps(_mm_loadu_si128(data.add(2 * i) as *const __m128i)),
            _ => _mm256_loadu_ps(data.add(4 * i) as *const f32),
        }
    }
}

/// One dense row against `N` tokens of `x` (`[N, cols]`).
///
/// # Safety
/// AVX2, FMA, F16C must be available; `row` holds `cols` elements of `dtype`;
/// `x.len() >= N * cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dense_row<const N: usize>(
    dtype: u8,
    row: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; crate::kernels::TILE],
) {
    let full = cols / 8 * 8;
    // SAFETY: element offsets stay below `full <= cols`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut i = 0;
        while i < full {
            let es = if dtype == super::avx512::DT_F32 { 4 } else { 2 };
            if (es * i) % 64 == 0 {
                super::prefetch_ahead(row.as_ptr().wrapping_add(es * i));
            }
            let w = load8(dtype, row.as_ptr(), i);
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(t * cols + i)), *a);
            }
            i += 8;
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum(a);
        }
    }
    if full < cols {
        let dt = match dtype {
            super::avx512::DT_BF16 => crate::tensor::DType::BF16,
            super::avx512::DT_F16 => crate::tensor::DType::F16,
            _ => crate::tensor::DType::F32,
        };
        let es = if dtype == super::avx512::DT_F32 { 4 } else { 2 };
        let mut w = [0.0f32; 8];
        crate::weights::decode_dense(dt, &row[full * es..cols * es], &mut w[..cols - full]);
        for (t, o) in out.iter_mut().enumerate().take(N) {
            let xr = &x[t * cols + full..t * cols + cols];
            *o += w.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>();
        }
    }
}
