//! AVX2 + FMA + F16C dense row kernels and the gated delta rule's token
//! step (the fallback below AVX-512). Twins: `kernels::generic`; same
//! contracts as `simd::avx512`. NVFP4 rows on AVX2 take int8 activations:
//! `simd::avx2_q8`.

use core::arch::x86_64::*;

use super::types::{DeltaToken, Dense, TILE};
use super::x86::{hsum256, prefetch_ahead};

/// Loads 8 dense elements at element offset `i` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(dtype: Dense, data: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees 8 readable elements at element `i`.
    unsafe {
        match dtype {
            Dense::Bf16 => {
                let h = _mm_loadu_si128(data.add(2 * i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            Dense::F16 => _mm256_cvtph_ps(_mm_loadu_si128(data.add(2 * i) as *const __m128i)),
            Dense::F32 => _mm256_loadu_ps(data.add(4 * i) as *const f32),
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
    dtype: Dense,
    row: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; TILE],
) {
    let full = cols / 8 * 8;
    let es = dtype.bytes();
    // SAFETY: element offsets stay below `full <= cols`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut i = 0;
        while i < full {
            if (es * i) % 64 == 0 {
                prefetch_ahead(row.as_ptr().wrapping_add(es * i));
            }
            let w = load8(dtype, row.as_ptr(), i);
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(t * cols + i)), *a);
            }
            i += 8;
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = hsum256(a);
        }
    }
    if full < cols {
        let mut w = [0.0f32; 8];
        for (j, v) in w.iter_mut().enumerate().take(cols - full) {
            *v = dtype.get(row, full + j);
        }
        for (t, o) in out.iter_mut().enumerate().take(N) {
            let xr = &x[t * cols + full..t * cols + cols];
            *o += w.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>();
        }
    }
}

/// `kernels::generic::delta_step` for `dv % 8 == 0`, the 8-lane form of
/// `simd::avx512::delta_step`: column blocks of `C` vectors (`C * 8` lanes
/// of `dv`), the block's state read once for `u` and once for the update
/// and `o` (a 128-row block of 32 lanes is 16 KiB: it stays in L1 between
/// the two passes).
///
/// # Safety
/// AVX2 and FMA must be available; `dv % (8 * C) == 0`, `s.len() == k.len() * dv`,
/// `q.len() == k.len()`, `v` and `o` hold `dv` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn delta_step<const C: usize>(s: &mut [f32], t: &DeltaToken<'_>, o: &mut [f32]) {
    let (k, q, v) = (t.k, t.q, t.v);
    let (dk, dv) = (k.len(), v.len());
    // SAFETY: block b covers lanes [b*8C, (b+1)*8C) < dv of every row i < dk,
    // inside `s` (dk*dv), `v` and `o` (dv) by the preconditions.
    unsafe {
        let (gv, bv) = (_mm256_set1_ps(t.g), _mm256_set1_ps(t.beta));
        let sp = s.as_mut_ptr();
        for b in (0..dv).step_by(8 * C) {
            let mut u = [_mm256_setzero_ps(); C];
            for (i, &kv) in k.iter().enumerate() {
                let ki = _mm256_set1_ps(kv);
                for (c, a) in u.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(sp.add(i * dv + b + 8 * c)), ki, *a);
                }
            }
            let mut d = [_mm256_setzero_ps(); C];
            for (c, dc) in d.iter_mut().enumerate() {
                let vv = _mm256_loadu_ps(v.as_ptr().add(b + 8 * c));
                *dc = _mm256_mul_ps(bv, _mm256_fnmadd_ps(gv, u[c], vv));
            }
            let mut acc = [_mm256_setzero_ps(); C];
            for i in 0..dk {
                let (ki, qi) = (_mm256_set1_ps(k[i]), _mm256_set1_ps(q[i]));
                for c in 0..C {
                    let p = sp.add(i * dv + b + 8 * c);
                    let sv = _mm256_fmadd_ps(ki, d[c], _mm256_mul_ps(gv, _mm256_loadu_ps(p)));
                    _mm256_storeu_ps(p, sv);
                    acc[c] = _mm256_fmadd_ps(qi, sv, acc[c]);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(b + 8 * c), *a);
            }
        }
    }
}
