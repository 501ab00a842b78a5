//! AVX-512 (F/BW/VL) row kernels. Twins: `kernels::generic`.
//!
//! Each computes one weight row against `N` tokens (`N <= kernels::TILE`), reading the
//! row once: the decoded weights stay in registers while every token's
//! activations stream past. NVFP4 is decoded in float: `vpermps` maps 16
//! codes to E2M1 values through a register table (bit 3 = sign), so the
//! activations keep full f32 precision.
//!
//! NVFP4 activations come pre-permuted per full 128 columns (see
//! `kernels::permute_nvfp4_x8`): 64 packed bytes are 16 dwords of 8 nibbles,
//! dword `L` holding columns `8L..8L+7`; value `16k + L` of the permuted
//! activations is column `8L + k`, the partner of nibble `k` of dword `L`.
//! Every lane `L` stays in 16-column block `L / 2`, so a chunk's block scales
//! are applied once, with one FMA.

use core::arch::x86_64::*;

use kore_pack_format::fp::e4m3_to_f32;

use super::types::{DeltaToken, Dense, Mat, MatMut, TILE};
use super::x86::{e4m3x16, prefetch_ahead, tail_f32, E4m3Scale, E2M1};

/// Per 128-column chunk `k` of a pair: lane `L` takes scale `8k + L / 2`
/// of the pair's 16 (lane `L` of every nibble vector is inside block `L / 2`).
const SCALE_IDX: [[i32; 16]; 2] = {
    let mut t = [[0i32; 16]; 2];
    let mut k = 0;
    while k < 2 {
        let mut l = 0;
        while l < 16 {
            t[k][l] = (8 * k + l / 2) as i32;
            l += 1;
        }
        k += 1;
    }
    t
};

/// The scale vector of a 128-column chunk without a partner for
/// [`e4m3x16`]: lane `L` takes block scale `L / 2` of the chunk's 8, times `gs`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lone_chunk_scales(scales: &[u8], gs: f32) -> __m512 {
    let s = |j: usize| e4m3_to_f32(scales[j]) * gs;
    #[rustfmt::skip]
    let sv = _mm512_set_ps(
        s(7), s(7), s(6), s(6), s(5), s(5), s(4), s(4),
        s(3), s(3), s(2), s(2), s(1), s(1), s(0), s(0),
    );
    sv
}

/// One NVFP4 row (`packed` = cols/2 bytes, `scales` = cols/16) against `N`
/// tokens of permuted activations `x` (`[N, cols]`); writes `out[..N]`.
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
    out: &mut [f32; TILE],
) {
    let chunks = cols / 128;
    // SAFETY: chunk c reads packed[64c..64c+64], scales[8c..8c+8] (16 per
    // pair of chunks) and x[t*cols + 128c..+128], inside the slices by the
    // preconditions.
    unsafe {
        let idx: [__m512i; 2] = core::mem::transmute(SCALE_IDX);
        let gsv = E4m3Scale::new(gs);
        // Two sets of accumulators (even and odd chunks) hide the FMA latency
        // for one token; every tile size uses them, so a token's sum is the
        // same whether it is alone or in a tile (batched decode, sessions).
        let mut acc = [[_mm512_setzero_ps(); N]; 2];
        let mut c = 0;
        while c + 2 <= chunks {
            let s16 = e4m3x16(scales.as_ptr().add(8 * c), gsv);
            for (k, ix) in idx.iter().enumerate() {
                let sv = _mm512_permutexvar_ps(*ix, s16);
                nvfp4_chunk(
                    packed.as_ptr().add(64 * (c + k)),
                    sv,
                    x.as_ptr().add(128 * (c + k)),
                    cols,
                    &mut acc[k],
                );
            }
            c += 2;
        }
        if c < chunks {
            let sv = lone_chunk_scales(&scales[8 * c..8 * c + 8], gs);
            nvfp4_chunk(
                packed.as_ptr().add(64 * c),
                sv,
                x.as_ptr().add(128 * c),
                cols,
                &mut acc[0],
            );
        }
        for (t, o) in out.iter_mut().enumerate().take(N) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
        }
    }
    tail_f32(packed, scales, gs, cols, cols / 128 * 128, x, N, out);
}

/// One 128-column chunk: 64 packed bytes at `p` (16 dwords of 8 nibbles),
/// scales `sv` (lane `L` = block `L / 2`), token `t`'s permuted activations
/// at `x + t * cols`. Nibble `k` of dword `L` is column `8L + k`: shifting
/// by `4k` and `vpermps` (which reads the low 4 index bits) decodes 16
/// columns at once, with no byte widening.
///
/// # Safety
/// AVX-512 F; 64 bytes at `p`, 128 values at `x + t * cols` for `t < N`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn nvfp4_chunk<const N: usize>(
    p: *const u8,
    sv: __m512,
    x: *const f32,
    cols: usize,
    acc: &mut [__m512; N],
) {
    // SAFETY: loads stay inside the ranges the caller guarantees.
    unsafe {
        let lut = _mm512_loadu_ps(E2M1.as_ptr());
        prefetch_ahead(p);
        let d = _mm512_loadu_si512(p as *const __m512i);
        let w = [
            _mm512_permutexvar_ps(d, lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(d), lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<8>(d), lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<12>(d), lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<16>(d), lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<20>(d), lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<24>(d), lut),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<28>(d), lut),
        ];
        for (t, a) in acc.iter_mut().enumerate() {
            let xp = x.add(t * cols);
            let mut s0 = _mm512_mul_ps(w[0], _mm512_loadu_ps(xp));
            let mut s1 = _mm512_mul_ps(w[1], _mm512_loadu_ps(xp.add(16)));
            for k in (2..8).step_by(2) {
                s0 = _mm512_fmadd_ps(w[k], _mm512_loadu_ps(xp.add(16 * k)), s0);
                s1 = _mm512_fmadd_ps(w[k + 1], _mm512_loadu_ps(xp.add(16 * k + 16)), s1);
            }
            *a = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), sv, *a);
        }
    }
}

/// Loads 16 dense elements at element offset `i` of `data` as f32
/// (`n` valid, the rest zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn load16(dtype: Dense, data: *const u8, i: usize, n: usize) -> __m512 {
    let m16 = if n >= 16 { 0xFFFF } else { (1u32 << n) as u16 - 1 };
    // SAFETY: the caller guarantees `n` readable elements at element `i`.
    unsafe {
        match dtype {
            Dense::Bf16 => {
                let h = _mm256_maskz_loadu_epi16(m16, data.add(2 * i) as *const i16);
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
            Dense::F16 => {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m16, data.add(2 * i) as *const i16))
            }
            Dense::F32 => _mm512_maskz_loadu_ps(m16, data.add(4 * i) as *const f32),
        }
    }
}

/// Prefetches ahead of the 32 elements of `dtype` at element `i` of `data`.
#[inline(always)]
fn prefetch_dense(dtype: Dense, data: *const u8, i: usize) {
    if dtype == Dense::F32 {
        prefetch_ahead(data.wrapping_add(4 * i));
        prefetch_ahead(data.wrapping_add(4 * i + 64));
    } else {
        prefetch_ahead(data.wrapping_add(2 * i));
    }
}

/// One dense row (`row` = cols elements of `dtype`) against `N` tokens of
/// `x` (`[N, cols]`); sums into `out[..N]`.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be available; `row` holds `cols` elements;
/// `x.len() >= N * cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn dense_row<const N: usize>(
    dtype: Dense,
    row: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; TILE],
) {
    // SAFETY: element offsets stay below `cols` (masked tail), see preconditions.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        let mut acc2 = [_mm512_setzero_ps(); N];
        let mut i = 0;
        // Two chains (even and odd 16-column blocks) hide the FMA latency; every tile
        // size uses them, so a token's sum does not depend on the tokens beside it.
        while i + 32 <= cols {
            prefetch_dense(dtype, row.as_ptr(), i);
            let w0 = load16(dtype, row.as_ptr(), i, 16);
            let w1 = load16(dtype, row.as_ptr(), i + 16, 16);
            for t in 0..N {
                let xp = x.as_ptr().add(t * cols + i);
                acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), acc[t]);
                acc2[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), acc2[t]);
            }
            i += 32;
        }
        while i < cols {
            let n = (cols - i).min(16);
            let m = if n >= 16 { 0xFFFF } else { (1u32 << n) as u16 - 1 };
            if i % 32 == 0 {
                prefetch_dense(dtype, row.as_ptr(), i);
            }
            let w = load16(dtype, row.as_ptr(), i, n);
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(t * cols + i));
                *a = _mm512_fmadd_ps(w, xv, *a);
            }
            i += 16;
        }
        for ((o, a), a2) in out.iter_mut().zip(acc).zip(acc2) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(a, a2));
        }
    }
}

/// One bf16 row (`row` = `cols` bf16 values as bytes) against `N` tokens of
/// activations permuted per full 32 columns as `[x0 x2 .. x30 | x1 x3 .. x31]`
/// (`kernels::permute_nvfp4(.., 32)`); writes `out[..N]`. A dword of two
/// bf16 values gives the even column's f32 by a shift and the odd one's by
/// a mask, so no widening shuffle is needed. The tail after the last full
/// 32 columns is in natural order.
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `row.len() >= 2 * cols`;
/// `x.len() >= N * cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn bf16_row<const N: usize>(
    row: &[u8],
    cols: usize,
    x: &[f32],
    out: &mut [f32; TILE],
) {
    let full = cols / 32 * 32;
    // SAFETY: block i reads row bytes [2i, 2i + 64) and x[t*cols + i..+32],
    // i + 32 <= full <= cols.
    unsafe {
        let hi = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        let mut acc = [[_mm512_setzero_ps(); N]; 2];
        for i in (0..full).step_by(32) {
            prefetch_ahead(row.as_ptr().wrapping_add(2 * i));
            let d = _mm512_loadu_si512(row.as_ptr().add(2 * i) as *const __m512i);
            let even = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(d));
            let odd = _mm512_castsi512_ps(_mm512_and_si512(d, hi));
            #[allow(clippy::needless_range_loop)]
            for t in 0..N {
                let xp = x.as_ptr().add(t * cols + i);
                acc[0][t] = _mm512_fmadd_ps(even, _mm512_loadu_ps(xp), acc[0][t]);
                // Two sets for every tile size: see `nvfp4_row` on accumulator sets.
                acc[1][t] = _mm512_fmadd_ps(odd, _mm512_loadu_ps(xp.add(16)), acc[1][t]);
            }
        }
        for (t, o) in out.iter_mut().enumerate().take(N) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
        }
    }
    for (t, o) in out.iter_mut().enumerate().take(N) {
        let tail = row[2 * full..2 * cols].chunks_exact(2).zip(&x[t * cols + full..(t + 1) * cols]);
        *o += tail
            .map(|(b, v)| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16) * v)
            .sum::<f32>();
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
            for j in 0..4 {
                prefetch_ahead(p.add(l + j) as *const u8);
            }
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

/// `kernels::generic::delta_step` for `dv % 16 == 0`: column blocks
/// of `C` vectors (`C * 16` lanes of `dv`), the state read once for `u` and
/// once for the update and `o`.
///
/// # Safety
/// AVX-512 F must be available; `dv % (16 * C) == 0`, `s.len() == k.len() * dv`,
/// `q.len() == k.len()`, `v` and `o` hold `dv` floats.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn delta_step<const C: usize>(s: &mut [f32], t: &DeltaToken<'_>, o: &mut [f32]) {
    let (k, q, v) = (t.k, t.q, t.v);
    let (dk, dv) = (k.len(), v.len());
    // SAFETY: block b covers lanes [b*16C, (b+1)*16C) < dv of every row i < dk,
    // inside `s` (dk*dv), `v` and `o` (dv) by the preconditions.
    unsafe {
        let (gv, bv) = (_mm512_set1_ps(t.g), _mm512_set1_ps(t.beta));
        let sp = s.as_mut_ptr();
        for b in (0..dv).step_by(16 * C) {
            let mut u = [_mm512_setzero_ps(); C];
            for (i, &kv) in k.iter().enumerate() {
                let ki = _mm512_set1_ps(kv);
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

/// `kernels::generic::gemm_acc`: `C[m, n] += A[m, k] B[k, n]` in
/// tiles of up to 8 rows x 32 columns, the tile's sums in 16 registers while
/// `k` runs (two B vectors loaded and each A element broadcast per step);
/// column tails masked.
///
/// # Safety
/// AVX-512 F must be available; each view holds its shape (`(rows - 1) * ld
/// + cols` elements, `cols <= ld`).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gemm_acc(m: usize, n: usize, k: usize, a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>) {
    let (ap, bp, cp) = (a.data.as_ptr(), b.data.as_ptr(), c.data.as_mut_ptr());
    let mask = |w: usize| if w >= 16 { 0xFFFF } else { ((1u32 << w) - 1) as u16 };
    for j in (0..n).step_by(32) {
        let w = (n - j).min(32);
        let cols = (mask(w), mask(w.saturating_sub(16)));
        for i in (0..m).step_by(8) {
            let t = Tile {
                a: ap.wrapping_add(i * a.ld),
                lda: a.ld,
                b: bp.wrapping_add(j),
                ldb: b.ld,
                c: cp.wrapping_add(i * c.ld + j),
                ldc: c.ld,
                k,
                cols,
            };
            // SAFETY: rows i..i+R of A and C and columns j..j+w of B and C
            // are inside the views (R = min(8, m - i), masks cover w).
            unsafe {
                match m - i {
                    1 => t.run::<1>(),
                    2 => t.run::<2>(),
                    3 => t.run::<3>(),
                    4 => t.run::<4>(),
                    5 => t.run::<5>(),
                    6 => t.run::<6>(),
                    7 => t.run::<7>(),
                    _ => t.run::<8>(),
                }
            }
        }
    }
}

/// One output tile of [`gemm_acc`]: `R` rows from `a`/`c`, up to 32
/// columns from `b`/`c` (lanes enabled by `cols`).
struct Tile {
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    k: usize,
    cols: (u16, u16),
}

impl Tile {
    /// # Safety
    /// AVX-512 F; `R` rows of `k` elements at `a`, `k` rows of the enabled
    /// columns at `b`, `R` rows of them at `c`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn run<const R: usize>(&self) {
        let (m0, m1) = self.cols;
        // SAFETY: masked loads and stores touch only enabled columns of rows
        // inside the ranges the caller guarantees.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for (r, ar) in acc.iter_mut().enumerate() {
                let row = self.c.add(r * self.ldc);
                ar[0] = _mm512_maskz_loadu_ps(m0, row);
                ar[1] = _mm512_maskz_loadu_ps(m1, row.add(16));
            }
            for p in 0..self.k {
                let brow = self.b.add(p * self.ldb);
                let b0 = _mm512_maskz_loadu_ps(m0, brow);
                let b1 = _mm512_maskz_loadu_ps(m1, brow.add(16));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*self.a.add(r * self.lda + p));
                    ar[0] = _mm512_fmadd_ps(x, b0, ar[0]);
                    ar[1] = _mm512_fmadd_ps(x, b1, ar[1]);
                }
            }
            for (r, ar) in acc.iter().enumerate() {
                let row = self.c.add(r * self.ldc);
                _mm512_mask_storeu_ps(row, m0, ar[0]);
                _mm512_mask_storeu_ps(row.add(16), m1, ar[1]);
            }
        }
    }
}
