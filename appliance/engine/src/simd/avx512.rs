//! AVX-512 (F/BW/VL) row kernels. Twins: `kernels::generic`.
//!
//! Each computes one weight row against `N` tokens (`N <= 16`), reading the
//! row once: the decoded weights stay in registers while every token's
//! activations stream past. NVFP4 is decoded in float: `vpermps` maps 16
//! codes to E2M1 values through a register table (bit 3 = sign), so the
//! activations keep full f32 precision.
//!
//! NVFP4 activations come pre-permuted per 32 columns as
//! `[x0 x2 .. x30 | x1 x3 .. x31]` (see `permute_nvfp4`): the low nibbles of
//! 16 packed bytes are the even columns, the high nibbles the odd ones. Lanes
//! 0-7 of both halves belong to the first 16-column block, 8-15 to the second.

use core::arch::x86_64::*;

use super::avx2::E2M1_LUT;
use crate::weights::e4m3_to_f32;

/// Reads 16 E4M3 bytes as f32 times `gs` (exact E4M3 decode: the bits are
/// moved into an f32 exponent/mantissa and rescaled by 2^120; the 0x7F/0xFF
/// NaN codes are not special-cased).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn e4m3x16(p: *const u8, gs: __m512) -> __m512 {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    unsafe {
        let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        let mag = _mm512_slli_epi32::<20>(_mm512_and_si512(b, _mm512_set1_epi32(0x7F)));
        let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(b, _mm512_set1_epi32(0x80)));
        let v = _mm512_castsi512_ps(_mm512_or_si512(mag, sign));
        _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(f32::from_bits(0x7B80_0000))), gs)
    }
}

/// Block scales of up to 64 blocks (`sc.len()`) as f32 times `gs` into `out`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn scales_to_f32(sc: &[u8], gs: f32, out: &mut [f32; 64]) {
    let n = sc.len();
    let mut i = 0;
    // SAFETY: loads/stores stay inside `sc` (i + 16 <= n) and `out` (n <= 64).
    unsafe {
        let g = _mm512_set1_ps(gs);
        while i + 16 <= n {
            _mm512_storeu_ps(out.as_mut_ptr().add(i), e4m3x16(sc.as_ptr().add(i), g));
            i += 16;
        }
    }
    for j in i..n {
        out[j] = e4m3_to_f32(sc[j]) * gs;
    }
}

/// One NVFP4 row (`packed` = cols/2 bytes, `scales` = cols/16) against `N`
/// tokens of permuted activations `x` (`[N, cols]`); sums into `out[..N]`.
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `x.len() >= N * cols`,
/// `packed.len() == cols / 2`, `scales.len() == cols / 16`, `cols % 16 == 0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn nvfp4_row<const N: usize>(
    packed: &[u8],
    scales: &[u8],
    gs: f32,
    cols: usize,
    x: &[f32],
    out: &mut [f32; 16],
) {
    let groups = cols / 32;
    let mut sbuf = [0.0f32; 64];
    // SAFETY: every pointer offset below is inside the slices by the
    // preconditions (group gi reads packed[16gi..16gi+16], x[t*cols+32gi..+32]).
    unsafe {
        let lut = _mm512_loadu_ps(E2M1_LUT.as_ptr());
        let mut acc = [_mm512_setzero_ps(); N];
        let mut g = 0;
        while g < groups {
            let gend = groups.min(g + 32);
            scales_to_f32(&scales[2 * g..2 * gend], gs, &mut sbuf);
            for gi in g..gend {
                let wb = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                    packed.as_ptr().add(gi * 16) as *const __m128i
                ));
                let wl = _mm512_permutexvar_ps(wb, lut);
                let wh = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(wb), lut);
                let k = 2 * (gi - g);
                let sv = _mm512_mask_blend_ps(
                    0xFF00,
                    _mm512_set1_ps(sbuf[k]),
                    _mm512_set1_ps(sbuf[k + 1]),
                );
                if N == 1 {
                    let xp = x.as_ptr().add(gi * 32);
                    let t = _mm512_mul_ps(wl, _mm512_loadu_ps(xp));
                    let t = _mm512_fmadd_ps(wh, _mm512_loadu_ps(xp.add(16)), t);
                    acc[0] = _mm512_fmadd_ps(t, sv, acc[0]);
                } else {
                    let (wl, wh) = (_mm512_mul_ps(wl, sv), _mm512_mul_ps(wh, sv));
                    for (t, a) in acc.iter_mut().enumerate() {
                        let xp = x.as_ptr().add(t * cols + gi * 32);
                        *a = _mm512_fmadd_ps(wl, _mm512_loadu_ps(xp), *a);
                        *a = _mm512_fmadd_ps(wh, _mm512_loadu_ps(xp.add(16)), *a);
                    }
                }
            }
            g = gend;
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }
    if cols % 32 != 0 {
        // The last 16-column block is not permuted.
        super::avx2::nvfp4_tail_block(packed, scales, gs, cols, x, N, out);
    }
}

/// Loads 16 dense elements at element offset `i` of `data` as f32
/// (`n` valid, the rest zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn load16(dtype: u8, data: *const u8, i: usize, n: usize) -> __m512 {
    let m16 = if n >= 16 { 0xFFFF } else { (1u32 << n) as u16 - 1 };
    // SAFETY: the caller guarantees `n` readable elements at element `i`.
    unsafe {
        match dtype {
            DT_BF16 => {
                let h = _mm256_maskz_loadu_epi16(m16, data.add(2 * i) as *const i16);
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
            DT_F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m16, data.add(2 * i) as *const i16)),
            _ => _mm512_maskz_loadu_ps(m16, data.add(4 * i) as *const f32),
        }
    }
}

/// Dense dtype codes for the dense kernels.
pub(crate) const DT_F32: u8 = 0;
/// BF16.
pub(crate) const DT_BF16: u8 = 1;
/// F16.
pub(crate) const DT_F16: u8 = 2;

/// One dense row (`row` = cols elements of `dtype`) against `N` tokens of
/// `x` (`[N, cols]`); sums into `out[..N]`.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available; `row` holds `cols` elements;
/// `x.len() >= N * cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn dense_row<const N: usize>(
    dtype: u8,
    row: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; 16],
) {
    // SAFETY: element offsets stay below `cols` (masked tail), see preconditions.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        let mut acc2 = _mm512_setzero_ps();
        let mut i = 0;
        if N == 1 {
            // Two chains to hide FMA latency.
            while i + 32 <= cols {
                let w0 = load16(dtype, row.as_ptr(), i, 16);
                let w1 = load16(dtype, row.as_ptr(), i + 16, 16);
                acc[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x.as_ptr().add(i)), acc[0]);
                acc2 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x.as_ptr().add(i + 16)), acc2);
                i += 32;
            }
        }
        while i < cols {
            let n = (cols - i).min(16);
            let m = if n >= 16 { 0xFFFF } else { (1u32 << n) as u16 - 1 };
            let w = load16(dtype, row.as_ptr(), i, n);
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(t * cols + i));
                *a = _mm512_fmadd_ps(w, xv, *a);
            }
            i += 16;
        }
        if N == 1 {
            acc[0] = _mm512_add_ps(acc[0], acc2);
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(a);
        }
    }
}

/// Sums 64-byte lines of `buf` (the read-bandwidth probe); returns a checksum.
///
/// # Safety
/// AVX-512 F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn read_sum(buf: &[u64]) -> u64 {
    let lines = buf.len() / 8;
    // SAFETY: line l reads buf[8l..8l+8], inside `buf`.
    unsafe {
        let mut a = [_mm512_setzero_si512(); 4];
        let p = buf.as_ptr() as *const __m512i;
        let mut l = 0;
        while l + 4 <= lines {
            for (j, acc) in a.iter_mut().enumerate() {
                *acc = _mm512_add_epi64(*acc, _mm512_loadu_si512(p.add(l + j)));
            }
            l += 4;
        }
        while l < lines {
            a[0] = _mm512_add_epi64(a[0], _mm512_loadu_si512(p.add(l)));
            l += 1;
        }
        let s = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
        let tail: u64 = buf[lines * 8..].iter().fold(0, |x, y| x.wrapping_add(*y));
        (_mm512_reduce_add_epi64(s) as u64).wrapping_add(tail)
    }
}

/// [`crate::kernels::generic::delta_step`] for `dv % 16 == 0`: column blocks
/// of `C` vectors (`C * 16` lanes of `dv`), the state read once for `u` and
/// once for the update and `o`.
///
/// # Safety
/// AVX-512 F must be available; `dv % (16 * C) == 0`, `s.len() == k.len() * dv`,
/// `q.len() == k.len()`, `v`, `u`, `o` hold `dv` floats.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn delta_step<const C: usize>(
    s: &mut [f32],
    k: &[f32],
    q: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    o: &mut [f32],
) {
    let (dk, dv) = (k.len(), v.len());
    // SAFETY: block b covers lanes [b*16C, (b+1)*16C) < dv of every row i < dk,
    // inside `s` (dk*dv), `v` and `o` (dv) by the preconditions.
    unsafe {
        let (gv, bv) = (_mm512_set1_ps(g), _mm512_set1_ps(beta));
        let sp = s.as_mut_ptr();
        for b in (0..dv).step_by(16 * C) {
            let mut u = [_mm512_setzero_ps(); C];
            for i in 0..dk {
                let ki = _mm512_set1_ps(k[i]);
                for (c, a) in u.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(sp.add(i * dv + b + 16 * c)), ki, *a);
                }
            }
            let mut d = [_mm512_setzero_ps(); C];
            for (c, dc) in d.iter_mut().enumerate() {
                let vv = _mm512_loadu_ps(v.as_ptr().add(b + 16 * c));
                *dc = _mm512_mul_ps(bv, _mm512_fnmadd_ps(gv, u[c], vv));
            }
            let mut acc = [_mm512_setzero_ps(); C];
            for i in 0..dk {
                let (ki, qi) = (_mm512_set1_ps(k[i]), _mm512_set1_ps(q[i]));
                for c in 0..C {
                    let p = sp.add(i * dv + b + 16 * c);
                    let sv = _mm512_fmadd_ps(ki, d[c], _mm512_mul_ps(gv, _mm512_loadu_ps(p)));
                    _mm512_storeu_ps(p, sv);
                    acc[c] = _mm512_fmadd_ps(qi, sv, acc[c]);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(b + 16 * c), *a);
            }
        }
    }
}
