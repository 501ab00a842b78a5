//! The matrix products every projection goes through.
//!
//! `matmul_on(pool, w, x, tokens, y)` splits the weight rows across the
//! pool's workers; each worker streams its rows once per tile of up to
//! [`TILE`] tokens (prefill and speculative verification read each weight
//! once per 16 tokens). The row kernels come in a portable twin
//! ([`generic`]) and SIMD versions (`simd::{avx2, avx512}`) chosen at run
//! time ([`crate::simd::active`]) or forced for tests.
//!
//! ```text
//! x [T, cols] --prepare (permute for NVFP4 SIMD)--> xp
//! worker w: rows split(rows, w, n) x tiles of 16 tokens -> y [T, rows]
//! ```

pub mod generic;

use alloc::borrow::Cow;
use alloc::vec;

use crate::pool::{split, Parallel, Serial};
use crate::simd::Path;
use crate::tensor::DType;
use crate::weights::Linear;

/// Tokens per weight pass.
pub const TILE: usize = 16;

/// Below this many multiply-adds a product runs on the caller alone.
const PARALLEL_MIN: usize = 1 << 15;

/// `y[t] = W x[t]` for `tokens` rows of `x` (`[tokens, cols]` -> `[tokens, rows]`),
/// on the calling thread with the active kernel path.
pub fn matmul(w: &Linear<'_>, x: &[f32], tokens: usize, y: &mut [f32]) {
    matmul_with(crate::simd::active(), &Serial, w, x, tokens, y);
}

/// [`matmul`] with rows split across `pool`.
pub fn matmul_on(pool: &dyn Parallel, w: &Linear<'_>, x: &[f32], tokens: usize, y: &mut [f32]) {
    matmul_with(crate::simd::active(), pool, w, x, tokens, y);
}

/// Single-vector product `y = W x` (`x` is `[cols]`, `y` is `[rows]`).
pub fn matvec(w: &Linear<'_>, x: &[f32], y: &mut [f32]) {
    matmul(w, x, 1, y);
}

/// A raw output pointer shared by workers that write disjoint elements.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: workers write disjoint row ranges of `y` (see `matmul_with`), and
// `y` outlives `pool.run`, which returns only after every worker has finished.
unsafe impl Sync for Out {}
// SAFETY: as above.
unsafe impl Send for Out {}

/// [`matmul_on`] with an explicit kernel path.
///
/// # Panics
/// On shape mismatches, or if `path` is not supported by this CPU.
pub fn matmul_with(
    path: Path,
    pool: &dyn Parallel,
    w: &Linear<'_>,
    x: &[f32],
    tokens: usize,
    y: &mut [f32],
) {
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(x.len(), tokens * cols, "matmul input shape");
    assert_eq!(y.len(), tokens * rows, "matmul output shape");
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    if tokens == 0 || rows == 0 {
        return;
    }
    let xp = prepare(path, w, x, tokens);
    let out = Out(y.as_mut_ptr());
    let job = |worker: usize, workers: usize| {
        let out = out;
        let mine = split(rows, worker, workers, 16);
        let mut scratch = if path == Path::Generic { vec![0.0f32; cols] } else { vec![] };
        let mut acc = [0.0f32; TILE];
        let mut t0 = 0;
        while t0 < tokens {
            let n = TILE.min(tokens - t0);
            let xt = &xp[t0 * cols..(t0 + n) * cols];
            for r in mine.clone() {
                row(path, w, r, xt, n, &mut acc, &mut scratch);
                for (t, v) in acc.iter().enumerate().take(n) {
                    // SAFETY: (t0 + t) * rows + r < tokens * rows = y.len(), and
                    // row r belongs to this worker only.
                    unsafe { *out.0.add((t0 + t) * rows + r) = *v };
                }
            }
            t0 += n;
        }
    };
    if rows * cols * tokens < PARALLEL_MIN || pool.workers() == 1 {
        job(0, 1);
    } else {
        pool.run(&job);
    }
}

/// Activations as the path's NVFP4 kernel wants them (see `simd::avx512`).
fn prepare<'x>(path: Path, w: &Linear<'_>, x: &'x [f32], tokens: usize) -> Cow<'x, [f32]> {
    let group = match (path, w) {
        (Path::Avx512, Linear::Nvfp4 { .. }) => 32,
        (Path::Avx2, Linear::Nvfp4 { .. }) => 16,
        _ => return Cow::Borrowed(x),
    };
    let cols = w.cols();
    let mut xp = x.to_vec();
    for t in 0..tokens {
        permute_nvfp4(&x[t * cols..(t + 1) * cols], &mut xp[t * cols..(t + 1) * cols], group);
    }
    Cow::Owned(xp)
}

/// Per full `group` of columns: even columns first, then odd ones. A
/// trailing partial group is copied unchanged.
pub fn permute_nvfp4(x: &[f32], out: &mut [f32], group: usize) {
    let full = x.len() / group * group;
    for (src, dst) in x[..full].chunks_exact(group).zip(out[..full].chunks_exact_mut(group)) {
        let half = group / 2;
        for i in 0..half {
            dst[i] = src[2 * i];
            dst[half + i] = src[2 * i + 1];
        }
    }
    out[full..].copy_from_slice(&x[full..]);
}

/// One weight row against `n` tokens (`x` is `[n, cols]`, prepared).
fn row(
    path: Path,
    w: &Linear<'_>,
    r: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32; TILE],
    scratch: &mut [f32],
) {
    match path {
        Path::Generic => generic::row(w, r, x, n, out, scratch),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx512 => simd_row(path, w, r, x, n, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => generic::row(w, r, x, n, out, scratch),
    }
}

/// Expands `$f::<N>(args)` for the runtime `n` in 1..=16.
macro_rules! by_n {
    ($n:expr, $($f:ident)::+, $($a:expr),*) => {
        match $n {
            1 => $($f)::+::<1>($($a),*), 2 => $($f)::+::<2>($($a),*), 3 => $($f)::+::<3>($($a),*),
            4 => $($f)::+::<4>($($a),*), 5 => $($f)::+::<5>($($a),*), 6 => $($f)::+::<6>($($a),*),
            7 => $($f)::+::<7>($($a),*), 8 => $($f)::+::<8>($($a),*), 9 => $($f)::+::<9>($($a),*),
            10 => $($f)::+::<10>($($a),*), 11 => $($f)::+::<11>($($a),*), 12 => $($f)::+::<12>($($a),*),
            13 => $($f)::+::<13>($($a),*), 14 => $($f)::+::<14>($($a),*), 15 => $($f)::+::<15>($($a),*),
            _ => $($f)::+::<16>($($a),*),
        }
    };
}

#[cfg(target_arch = "x86_64")]
fn simd_row(path: Path, w: &Linear<'_>, r: usize, x: &[f32], n: usize, out: &mut [f32; TILE]) {
    use crate::simd::{avx2, avx512};
    match *w {
        Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } => {
            let p = &packed[r * cols / 2..(r + 1) * cols / 2];
            let s = &scales[r * cols / 16..(r + 1) * cols / 16];
            if path == Path::Avx512 {
                // SAFETY: `matmul_with` checked the path is supported; slice
                // lengths match the kernel's preconditions (cols % 16 == 0 by load).
                unsafe { by_n!(n, avx512::nvfp4_row, p, s, gs, cols, x, out) }
            } else {
                // SAFETY: as above for AVX2.
                unsafe { by_n!(n, avx2::nvfp4_row, p, s, gs, cols, x, out) }
            }
        }
        Linear::Dense { dtype, data, cols, .. } => {
            let (code, es) = match dtype {
                DType::BF16 => (avx512::DT_BF16, 2),
                DType::F16 => (avx512::DT_F16, 2),
                DType::F32 => (avx512::DT_F32, 4),
                _ => {
                    out[..n].fill(f32::NAN);
                    return;
                }
            };
            let d = &data[r * cols * es..(r + 1) * cols * es];
            if path == Path::Avx512 {
                // SAFETY: path supported; `d` holds `cols` elements; x is [n, cols].
                unsafe { by_n!(n, avx512::dense_row, code, d, cols, x, out) }
            } else {
                // SAFETY: as above for AVX2.
                unsafe { by_n!(n, avx2::dense_row, code, d, cols, x, out) }
            }
        }
    }
}

/// Dot product of equal-length slices, with 8 partial sums.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    generic::dot(a, b)
}
