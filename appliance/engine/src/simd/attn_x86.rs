//! AVX-512 and AVX2 attention kernels. Twins: the generic kernels of
//! `kernels::generic` (same shapes, same exp algorithm as `exp::exp`).
//!
//! Up to [`GMAX`] query heads of one KV head run together: each key or value
//! row is loaded (and converted from f16) once for all of them. AVX-512
//! handles a ragged head dim with masked loads; AVX2 finishes it in scalar.

use core::arch::x86_64::*;

use super::types::KvElem;
use super::x86::{hsum256, prefetch_lines};
use crate::exp::{exp, EXP_C, EXP_HI, EXP_LN2, EXP_LO, EXP_LOG2E};

/// Query heads per kernel call (one accumulator register each).
const GMAX: usize = 4;

/// Runs `$f::<E, G>(args)` for the runtime head count `$g` in 1..=GMAX.
macro_rules! by_g {
    ($g:expr, $f:ident, $e:ty, $($a:expr),*) => {
        match $g {
            1 => $f::<$e, 1>($($a),*),
            2 => $f::<$e, 2>($($a),*),
            3 => $f::<$e, 3>($($a),*),
            _ => $f::<$e, 4>($($a),*),
        }
    };
}

/// Calls `f(g0, gn)` for the groups of at most [`GMAX`] heads of `g`.
#[inline(always)]
fn groups(g: usize, mut f: impl FnMut(usize, usize)) {
    let mut g0 = 0;
    while g0 < g {
        let gn = (g - g0).min(GMAX);
        f(g0, gn);
        g0 += gn;
    }
}

/// Defines the public scores and value-sum kernels of one ISA over its
/// per-group kernels.
macro_rules! attn_entries {
    ($scores:ident, $accumulate:ident, $s:ident, $a:ident, $isa:literal) => {
        #[doc = concat!("`kernels::attn::scores` on ", $isa, ".")]
        ///
        /// # Safety
        /// The ISA is available; the shapes were checked by the caller (`q`
        /// holds `g * hd`, `keys` `n` rows `stride` apart, `out` `g` rows of
        /// `n` that are `ostride` apart).
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $scores<E: KvElem>(
            q: &[f32],
            g: usize,
            hd: usize,
            keys: &[E],
            stride: usize,
            n: usize,
            out: &mut [f32],
            ostride: usize,
            scale: f32,
        ) {
            let (qp, op, kp) = (q.as_ptr(), out.as_mut_ptr(), keys.as_ptr());
            groups(g, |g0, gn| {
                // SAFETY: heads g0..g0+gn lie inside q and out (checked
                // shapes); the caller guarantees the ISA.
                unsafe {
                    let (qp, op) = (qp.add(g0 * hd), op.add(g0 * ostride));
                    by_g!(gn, $s, E, qp, hd, kp, stride, n, op, ostride, scale)
                }
            });
        }

        #[doc = concat!("`kernels::attn::accumulate` on ", $isa, ".")]
        ///
        /// # Safety
        /// As the scores kernel: the ISA is available, the shapes checked.
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $accumulate<E: KvElem>(
            p: &[f32],
            pstride: usize,
            g: usize,
            hd: usize,
            values: &[E],
            stride: usize,
            n: usize,
            o: &mut [f32],
        ) {
            let (pp, op, vp) = (p.as_ptr(), o.as_mut_ptr(), values.as_ptr());
            groups(g, |g0, gn| {
                // SAFETY: heads g0..g0+gn lie inside p and o (checked
                // shapes); the caller guarantees the ISA.
                unsafe {
                    let (pp, op) = (pp.add(g0 * pstride), op.add(g0 * hd));
                    by_g!(gn, $a, E, pp, pstride, hd, vp, stride, n, op)
                }
            });
        }
    };
}

attn_entries!(scores_avx512, accumulate_avx512, scores512, accumulate512, "AVX-512");
attn_entries!(scores_avx2, accumulate_avx2, scores256, accumulate256, "AVX2");

// ---- AVX-512 ----

/// Lanes `0..k` set.
#[inline]
fn mask16(k: usize) -> __mmask16 {
    ((1u32 << k) - 1) as __mmask16
}

/// 16 KV elements at `p` as f32, lanes outside `m` zero (never read).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load16<E: KvElem>(p: *const E, m: __mmask16) -> __m512 {
    // SAFETY: the caller guarantees the lanes in `m` are readable; masked-off
    // lanes are not accessed.
    unsafe {
        if E::F16 {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16))
        } else {
            _mm512_maskz_loadu_ps(m, p as *const f32)
        }
    }
}

/// Keys per pass of the score kernels: each key row is loaded once for the
/// group's heads, each query vector once for the pass's keys.
const KEYS: usize = 4;

/// The sums of the lanes of four vectors, each summed in the order of
/// `_mm512_reduce_add_ps` (256-bit halves, then 128-bit, 64-bit, 32-bit), so
/// a key's score does not depend on the keys it is reduced with.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce4(a: &[__m512; KEYS]) -> __m128 {
    // [a.q0+a.q2, a.q1+a.q3, b.q0+b.q2, b.q1+b.q3], the same for c and d.
    let ab = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(a[0], a[1]),
        _mm512_shuffle_f32x4::<0xEE>(a[0], a[1]),
    );
    let cd = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x44>(a[2], a[3]),
        _mm512_shuffle_f32x4::<0xEE>(a[2], a[3]),
    );
    // Quarter j: vector j's 128-bit sum.
    let u =
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(ab, cd), _mm512_shuffle_f32x4::<0xDD>(ab, cd));
    // Within each quarter [x0, x1, x2, x3]: (x0 + x2) + (x1 + x3) in lane 0.
    let v = _mm512_add_ps(u, _mm512_permute_ps::<0x4E>(u));
    let w = _mm512_add_ps(v, _mm512_permute_ps::<0xB1>(v));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, w))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores512<E: KvElem, const G: usize>(
    q: *const f32,
    hd: usize,
    keys: *const E,
    stride: usize,
    n: usize,
    out: *mut f32,
    ostride: usize,
    scale: f32,
) {
    // SAFETY: every access is inside the checked shapes: heads < G, columns
    // < hd (masked tail), rows < n (a pass past the last key repeats that key
    // and drops its results).
    unsafe {
        let mut s = 0;
        while s < n {
            let live = (n - s).min(KEYS);
            let kp: [*const E; KEYS] =
                core::array::from_fn(|j| keys.add((s + j.min(live - 1)) * stride));
            let mut acc = [[_mm512_setzero_ps(); KEYS]; G];
            let mut i = 0;
            while i < hd {
                let m = mask16((hd - i).min(16));
                let kv: [__m512; KEYS] = core::array::from_fn(|j| load16(kp[j].add(i), m));
                for (gi, a) in acc.iter_mut().enumerate() {
                    let qv = _mm512_maskz_loadu_ps(m, q.add(gi * hd + i));
                    for (aj, k) in a.iter_mut().zip(&kv) {
                        *aj = _mm512_fmadd_ps(*k, qv, *aj);
                    }
                }
                i += 16;
            }
            for (gi, a) in acc.iter().enumerate() {
                let r = _mm_mul_ps(reduce4(a), _mm_set1_ps(scale));
                let mut lanes = [0f32; KEYS];
                _mm_storeu_ps(lanes.as_mut_ptr(), r);
                for (j, v) in lanes.iter().enumerate().take(live) {
                    *out.add(gi * ostride + s + j) = *v;
                }
            }
            s += KEYS;
        }
    }
}

/// Vectors of 16 lanes per stripe of the value-sum kernels: a stripe of the
/// group's outputs stays in registers while every value row passes it.
const STRIPE: usize = 4;

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate512<E: KvElem, const G: usize>(
    p: *const f32,
    pstride: usize,
    hd: usize,
    values: *const E,
    stride: usize,
    n: usize,
    o: *mut f32,
) {
    // SAFETY: every access is inside the checked shapes: heads < G, columns
    // < hd (masked lanes), rows < n.
    unsafe {
        let mut c0 = 0;
        while c0 < hd {
            let m: [__mmask16; STRIPE] =
                core::array::from_fn(|v| mask16(hd.saturating_sub(c0 + 16 * v).min(16)));
            let mut acc = [[_mm512_setzero_ps(); STRIPE]; G];
            for (gi, a) in acc.iter_mut().enumerate() {
                for (v, av) in a.iter_mut().enumerate() {
                    // Lanes past `hd` are masked off (their address may lie
                    // past the buffer: formed with wrapping arithmetic).
                    let at = o.wrapping_add(gi * hd + c0 + 16 * v);
                    *av = _mm512_maskz_loadu_ps(m[v], at);
                }
            }
            for s in 0..n {
                let vp = values.add(s * stride + c0);
                let vv: [__m512; STRIPE] =
                    core::array::from_fn(|v| load16(vp.wrapping_add(16 * v), m[v]));
                for (gi, a) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*p.add(gi * pstride + s));
                    for (av, x) in a.iter_mut().zip(&vv) {
                        *av = _mm512_fmadd_ps(w, *x, *av);
                    }
                }
            }
            for (gi, a) in acc.iter().enumerate() {
                for (v, av) in a.iter().enumerate() {
                    _mm512_mask_storeu_ps(o.wrapping_add(gi * hd + c0 + 16 * v), m[v], *av);
                }
            }
            c0 += 16 * STRIPE;
        }
    }
}

/// `e^x` per f64 lane, as `exp::exp` computes it (with FMA and `vscalefpd`).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp8d(x: __m512d) -> __m512d {
    let n = _mm512_roundscale_pd::<0x08>(_mm512_mul_pd(x, _mm512_set1_pd(EXP_LOG2E)));
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(EXP_LN2), x);
    let mut p = _mm512_set1_pd(EXP_C[0]);
    for c in &EXP_C[1..] {
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(*c));
    }
    _mm512_scalef_pd(p, n)
}

/// `e^x` per lane, as `exp::exp` computes it (in f64, rounded once).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp512(x: __m512) -> __m512 {
    // Operand order keeps NaN: max/min return the second operand on NaN.
    let x = _mm512_min_ps(_mm512_set1_ps(EXP_HI), _mm512_max_ps(_mm512_set1_ps(EXP_LO), x));
    let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))));
    let (a, b) = (_mm512_cvtpd_ps(exp8d(lo)), _mm512_cvtpd_ps(exp8d(hi)));
    let v =
        _mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b));
    _mm512_castpd_ps(v)
}

/// `kernels::attn::exp_shift_sum` on AVX-512.
///
/// # Safety
/// AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn exp_shift_sum_avx512(x: &mut [f32], m: f32) -> f32 {
    let (mv, len, xp) = (_mm512_set1_ps(m), x.len(), x.as_mut_ptr());
    let mut sum = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: lanes i..min(i + 16, len) are inside `x` (masked tail).
    unsafe {
        while i < len {
            let k = mask16((len - i).min(16));
            let v = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xp.add(i)), mv));
            _mm512_mask_storeu_ps(xp.add(i), k, v);
            sum = _mm512_mask_add_ps(sum, k, sum, v);
            i += 16;
        }
    }
    _mm512_reduce_add_ps(sum)
}

// ---- AVX2 ----

/// 8 KV elements at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<E: KvElem>(p: *const E) -> __m256 {
    // SAFETY: the caller guarantees 8 readable elements at `p`.
    unsafe {
        if E::F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        } else {
            _mm256_loadu_ps(p as *const f32)
        }
    }
}

/// Key rows ahead of the one being read that the AVX2 score kernel
/// prefetches into L1 (f16 keys). A decode step reads the K rows of a piece
/// once, from DRAM; without the hint one thread scored f16 keys at 3.4-3.5
/// GB/s on a Zen 1 host, 5.9 in cache; with it 4.5-5.4
/// (`benches/attention.rs`, 8,192 keys).
const AHEAD: usize = 8;

/// Keys per pass of the AVX2 score kernel (its 16 registers hold 4 heads x 2
/// keys of sums).
const KEYS256: usize = 2;

/// The lane sums of two vectors, each in [`hsum256`]'s order, in lanes 0 and 4.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce2(a: &[__m256; KEYS256]) -> __m256 {
    // [a.lo + a.hi | b.lo + b.hi], then (x0 + x2) + (x1 + x3) within each half.
    let t = _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(a[0], a[1]),
        _mm256_permute2f128_ps::<0x31>(a[0], a[1]),
    );
    let v = _mm256_add_ps(t, _mm256_permute_ps::<0x4E>(t));
    _mm256_add_ps(v, _mm256_permute_ps::<0xB1>(v))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores256<E: KvElem, const G: usize>(
    q: *const f32,
    hd: usize,
    keys: *const E,
    stride: usize,
    n: usize,
    out: *mut f32,
    ostride: usize,
    scale: f32,
) {
    let full = hd / 8 * 8;
    // SAFETY: every access is inside the checked shapes: heads < G, columns
    // < hd (vector part below `full`, the rest scalar), rows < n (a pass past
    // the last key repeats that key and drops its results).
    unsafe {
        let mut s = 0;
        while s < n {
            let live = (n - s).min(KEYS256);
            let kp: [*const E; KEYS256] =
                core::array::from_fn(|j| keys.add((s + j.min(live - 1)) * stride));
            // f16 only: f32 rows (16 lines) ran 0.8-0.95x as fast with the hint.
            if E::F16 {
                for j in 0..KEYS256 {
                    let row = keys.wrapping_add((s + AHEAD + j) * stride) as *const u8;
                    prefetch_lines(row, hd * core::mem::size_of::<E>());
                }
            }
            let mut acc = [[_mm256_setzero_ps(); KEYS256]; G];
            for i in (0..full).step_by(8) {
                let kv: [__m256; KEYS256] = core::array::from_fn(|j| load8(kp[j].add(i)));
                for (gi, a) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(q.add(gi * hd + i));
                    for (aj, k) in a.iter_mut().zip(&kv) {
                        *aj = _mm256_fmadd_ps(*k, qv, *aj);
                    }
                }
            }
            for (gi, a) in acc.iter().enumerate() {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), reduce2(a));
                for (j, kj) in kp.iter().enumerate().take(live) {
                    let tail: f32 =
                        (full..hd).map(|i| *q.add(gi * hd + i) * (*kj.add(i)).to_f32()).sum();
                    *out.add(gi * ostride + s + j) = (lanes[4 * j] + tail) * scale;
                }
            }
            s += KEYS256;
        }
    }
}

/// Vectors of 8 lanes per stripe of the AVX2 value-sum kernel.
const STRIPE256: usize = 2;

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate256<E: KvElem, const G: usize>(
    p: *const f32,
    pstride: usize,
    hd: usize,
    values: *const E,
    stride: usize,
    n: usize,
    o: *mut f32,
) {
    let full = hd / 8 * 8;
    // SAFETY: every access is inside the checked shapes: heads < G, columns
    // < hd (vectors below `full`, the rest scalar), rows < n.
    unsafe {
        let mut c0 = 0;
        while c0 < full {
            if full - c0 >= 8 * STRIPE256 {
                stripe256::<E, G, STRIPE256>(p, pstride, hd, values.add(c0), stride, n, o.add(c0));
                c0 += 8 * STRIPE256;
            } else {
                stripe256::<E, G, 1>(p, pstride, hd, values.add(c0), stride, n, o.add(c0));
                c0 += 8;
            }
        }
        for s in 0..n {
            let vp = values.add(s * stride);
            for i in full..hd {
                let v = (*vp.add(i)).to_f32();
                for gi in 0..G {
                    *o.add(gi * hd + i) += *p.add(gi * pstride + s) * v;
                }
            }
        }
    }
}

/// One stripe of `V` vectors (`8 V` columns from `values` and `o`) of
/// [`accumulate256`]: the group's sums in registers while the rows pass.
///
/// # Safety
/// AVX2, FMA and F16C; the stripe's columns lie inside `hd` of every row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn stripe256<E: KvElem, const G: usize, const V: usize>(
    p: *const f32,
    pstride: usize,
    hd: usize,
    values: *const E,
    stride: usize,
    n: usize,
    o: *mut f32,
) {
    // SAFETY: the stripe's columns of heads < G and rows < n, by the caller.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); V]; G];
        for (gi, a) in acc.iter_mut().enumerate() {
            for (v, av) in a.iter_mut().enumerate() {
                *av = _mm256_loadu_ps(o.add(gi * hd + 8 * v));
            }
        }
        for s in 0..n {
            let vp = values.add(s * stride);
            let vv: [__m256; V] = core::array::from_fn(|v| load8(vp.add(8 * v)));
            for (gi, a) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*p.add(gi * pstride + s));
                for (av, x) in a.iter_mut().zip(&vv) {
                    *av = _mm256_fmadd_ps(w, *x, *av);
                }
            }
        }
        for (gi, a) in acc.iter().enumerate() {
            for (v, av) in a.iter().enumerate() {
                _mm256_storeu_ps(o.add(gi * hd + 8 * v), *av);
            }
        }
    }
}

/// `e^x` per f64 lane, as `exp::exp` computes it (with FMA).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp4d(x: __m256d) -> __m256d {
    let n = _mm256_round_pd::<0x08>(_mm256_mul_pd(x, _mm256_set1_pd(EXP_LOG2E)));
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(EXP_LN2), x);
    let mut p = _mm256_set1_pd(EXP_C[0]);
    for c in &EXP_C[1..] {
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(*c));
    }
    let e = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));
    let scale = _mm256_slli_epi64::<52>(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)));
    _mm256_mul_pd(p, _mm256_castsi256_pd(scale))
}

/// `e^x` per lane, as `exp::exp` computes it (in f64, rounded once).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp256(x: __m256) -> __m256 {
    // Operand order keeps NaN: max/min return the second operand on NaN.
    let x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), _mm256_max_ps(_mm256_set1_ps(EXP_LO), x));
    let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x));
    _mm256_set_m128(_mm256_cvtpd_ps(exp4d(hi)), _mm256_cvtpd_ps(exp4d(lo)))
}

/// `kernels::attn::exp_shift_sum` on AVX2.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_shift_sum_avx2(x: &mut [f32], m: f32) -> f32 {
    let (mv, full, xp) = (_mm256_set1_ps(m), x.len() / 8 * 8, x.as_mut_ptr());
    let mut sum = _mm256_setzero_ps();
    // SAFETY: i + 8 <= full <= x.len().
    unsafe {
        for i in (0..full).step_by(8) {
            let v = exp256(_mm256_sub_ps(_mm256_loadu_ps(xp.add(i)), mv));
            _mm256_storeu_ps(xp.add(i), v);
            sum = _mm256_add_ps(sum, v);
        }
    }
    let mut total = hsum256(sum);
    for v in &mut x[full..] {
        *v = exp(*v - m);
        total += *v;
    }
    total
}
