//! The matrix products every projection goes through.
//!
//! `matmul_on(pool, w, x, tokens, y)` (or `matmuls_on` for several
//! products in one pool run) cuts the weight rows into chunks the pool's
//! workers take from contiguous per-worker regions (`pool::Regions`, idle
//! workers steal from the others' tails); a worker streams its chunk once per
//! tile of up to [`TILE`] tokens (prefill and speculative verification read
//! each weight from memory once, the chunk staying in cache across tiles).
//! The row kernels come in a portable twin ([`generic`]) and SIMD versions
//! (`simd::{avx2, avx512}`) chosen at run time ([`crate::simd::active`]) or
//! forced for tests.
//!
//! ```text
//! x [T, cols] --prepare (permute for NVFP4 SIMD)--> xp
//! worker: while chunk c = next++ : rows of c x tiles of <= 8 tokens -> y [T, rows]
//! ```

mod delta;
pub mod generic;

pub use delta::{delta_step, delta_step_with, gemm_acc, gemm_acc_with, DeltaToken, Mat, MatMut};

use alloc::borrow::Cow;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::pool::{Parallel, Regions, Serial, SharedMut};
use crate::simd::Path;
use crate::tensor::DType;
use crate::weights::Linear;

/// Most tokens per weight pass (a row kernel keeps one accumulator per token
/// in registers; 16 spilled them and measured 1.2-1.8x slower per token).
pub const TILE: usize = 8;

/// Bytes of a tile's activations that should stay in L1 while a chunk's rows
/// pass them: a tile of f32 activations over 2048 columns is 4 tokens.
const TILE_L1_BYTES: usize = 32 << 10;

/// Below this many multiply-adds a product runs on the caller alone.
const PARALLEL_MIN: usize = 1 << 15;

/// Weight bytes per work chunk: small enough that a worker delayed by the
/// OS holds up little, large enough that taking a chunk (one atomic add)
/// costs nothing; a chunk stays in L2 while every token tile passes it.
const CHUNK_BYTES: usize = 96 << 10;

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

/// One product of a batch: `y = W x` over the batch's token count.
#[derive(Debug)]
pub struct Product<'p, 'w> {
    /// The weight `[rows, cols]`.
    pub w: &'p Linear<'w>,
    /// Input `[tokens, cols]`.
    pub x: &'p [f32],
    /// Output `[tokens, rows]`.
    pub y: &'p mut [f32],
}

impl<'p, 'w> Product<'p, 'w> {
    /// `y = w x`.
    pub fn new(w: &'p Linear<'w>, x: &'p [f32], y: &'p mut [f32]) -> Self {
        Product { w, x, y }
    }
}

/// Several products over the same `tokens` in one pool run (for example
/// gate and up of an MLP, or every input projection of a layer): one
/// barrier instead of one per product, and the workers balance across all
/// of them. Active kernel path.
pub fn matmuls_on(pool: &dyn Parallel, tokens: usize, products: &mut [Product<'_, '_>]) {
    matmuls_with(crate::simd::active(), pool, tokens, products);
}

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
    matmuls_with(path, pool, tokens, &mut [Product { w, x, y }]);
}

/// Activations as a path's kernel for one weight type wants them.
enum Prepared<'x> {
    /// f32, in place or permuted for the NVFP4/bf16 kernels.
    F32(Cow<'x, [f32]>),
    /// int8 per 16-column block, for the VNNI NVFP4 kernel.
    Q8(Q8),
}

impl Prepared<'_> {
    /// Tokens per tile: at most [`TILE`], and few enough that the tile's
    /// activations (int8 or f32) fit in [`TILE_L1_BYTES`].
    fn tile_tokens(&self, cols: usize) -> usize {
        let bytes = match self {
            Prepared::F32(_) => 4,
            Prepared::Q8(_) => 1,
        };
        (TILE_L1_BYTES / (bytes * cols).max(1)).clamp(1, TILE)
    }

    /// Tokens `t0..t0 + n` of `cols` columns each.
    fn tile(&self, t0: usize, n: usize, cols: usize) -> Xs<'_> {
        let r = t0 * cols..(t0 + n) * cols;
        let g = t0 * cols / 8..(t0 + n) * cols / 8;
        match self {
            Prepared::F32(x) => Xs::F32(&x[r]),
            #[cfg(target_arch = "x86_64")]
            Prepared::Q8(q) => Xs::Q8(crate::simd::avx512vnni::Q8In {
                q: &q.q[r],
                corr: &q.corr[g.clone()],
                scale: &q.scale[g],
            }),
            #[cfg(not(target_arch = "x86_64"))]
            Prepared::Q8(_) => unreachable!("Q8 activations are prepared only on x86_64"),
        }
    }
}

/// A tile of prepared activations.
#[derive(Clone, Copy)]
enum Xs<'a> {
    F32(&'a [f32]),
    #[cfg(target_arch = "x86_64")]
    Q8(crate::simd::avx512vnni::Q8In<'a>),
}

/// Activations quantized per 16-column block: `q = round(x * 127 / amax)`,
/// permuted per full 128 columns as `[even | odd]`; per 8-column group
/// `corr = -OFFSET * sum(q)` and `scale = amax / 127 / 2`.
struct Q8 {
    q: Vec<i8>,
    corr: Vec<i32>,
    scale: Vec<f32>,
}

/// The int8 value and scale of every column of `x` (per 16-column block;
/// `x.len() % 16 == 0`): what the VNNI kernel multiplies. Rounds half away
/// from zero; a block that is all zeros or not finite gets scale 0.
fn q8_block(blk: &[f32], q: &mut [i8; 16]) -> f32 {
    let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (scale, inv) =
        if amax > 0.0 && amax.is_finite() { (amax / 127.0, 127.0 / amax) } else { (0.0, 0.0) };
    for (o, v) in q.iter_mut().zip(blk) {
        let y = v * inv;
        *o = (y + if y >= 0.0 { 0.5 } else { -0.5 }).clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// `x` as the VNNI NVFP4 kernel sees it (quantized to int8 per 16-column
/// block and back): its twin is the generic path on these values.
/// `x.len()` must be a multiple of 16 (NVFP4 column counts are).
pub fn round_q8(x: &[f32]) -> Vec<f32> {
    let mut q = [0i8; 16];
    x.chunks(16)
        .flat_map(|blk| {
            let s = q8_block(blk, &mut q);
            q.map(|v| f32::from(v) * s).into_iter().take(blk.len())
        })
        .collect()
}

/// Position of column `i` of a 128-column chunk in the `[even | odd]` layout.
fn even_odd(i: usize) -> usize {
    (i % 2) * 64 + i / 2
}

/// [`Q8`] of `x` (`[tokens, cols]`): AVX-512 for the blocks of full
/// 128-column chunks when `simd` (bit-identical to [`q8_block`]; blocks with
/// a NaN or an infinity take the scalar path), [`q8_block`] for the rest.
fn quantize_q8(x: &[f32], tokens: usize, cols: usize, simd: bool) -> Q8 {
    let mut q = vec![0i8; tokens * cols];
    let mut corr = vec![0i32; tokens * cols / 8];
    let mut scale = vec![0.0f32; tokens * cols / 8];
    let full = cols / 128 * 128;
    let mut qb = [0i8; 16];
    for t in 0..tokens {
        for b in 0..cols / 16 {
            let c0 = 16 * b;
            let g = (t * cols + c0) / 8;
            let row = &mut q[t * cols..(t + 1) * cols];
            if simd && c0 < full {
                if let Some((s, sums)) =
                    q8_block_simd(&x[t * cols + c0..t * cols + c0 + 16], &mut qb)
                {
                    scale[g..g + 2].fill(0.5 * s);
                    corr[g] = -OFFSET_Q8 * sums[0];
                    corr[g + 1] = -OFFSET_Q8 * sums[1];
                    // `qb` is [even columns | odd columns] of the block.
                    let (chunk, at) = (c0 / 128 * 128, c0 % 128);
                    row[chunk + at / 2..chunk + at / 2 + 8].copy_from_slice(&qb[..8]);
                    row[chunk + 64 + at / 2..chunk + 64 + at / 2 + 8].copy_from_slice(&qb[8..]);
                    continue;
                }
            }
            let s = q8_block(&x[t * cols + c0..t * cols + c0 + 16], &mut qb);
            scale[g..g + 2].fill(0.5 * s);
            for h in 0..2 {
                corr[g + h] =
                    -OFFSET_Q8 * qb[8 * h..8 * h + 8].iter().map(|&v| i32::from(v)).sum::<i32>();
            }
            if c0 < full {
                let (chunk, at) = (c0 / 128 * 128, c0 % 128);
                for (j, v) in qb.iter().enumerate() {
                    row[chunk + even_odd(at + j)] = *v;
                }
            } else {
                row[c0..c0 + 16].copy_from_slice(&qb);
            }
        }
    }
    Q8 { q, corr, scale }
}

/// One block through `simd::avx512vnni::q8_block16`: `(scale, [sum of the
/// first 8 q, of the last 8])` with `qb` = [even | odd columns], or `None`
/// for a block the scalar path must take.
#[cfg(target_arch = "x86_64")]
fn q8_block_simd(blk: &[f32], qb: &mut [i8; 16]) -> Option<(f32, [i32; 2])> {
    let blk: &[f32; 16] = blk.try_into().ok()?;
    // SAFETY: callers pass `simd` only when the AVX-512 features are present
    // (the VNNI path, or the test that checks them).
    unsafe { crate::simd::avx512vnni::q8_block16(blk, qb) }
}

#[cfg(not(target_arch = "x86_64"))]
fn q8_block_simd(_: &[f32], _: &mut [i8; 16]) -> Option<(f32, [i32; 2])> {
    None
}

#[cfg(target_arch = "x86_64")]
const OFFSET_Q8: i32 = crate::simd::avx512vnni::OFFSET;
#[cfg(not(target_arch = "x86_64"))]
const OFFSET_Q8: i32 = 12;

/// Whether `path` quantizes the activations of products with `w` to int8
/// (NVFP4 weights on `avx512vnni`); its result then equals the generic
/// path's on [`round_q8`] of the activations, up to the order of the sums.
pub fn q8_activations(path: Path, w: &Linear<'_>) -> bool {
    path == Path::Avx512Vnni && matches!(w, Linear::Nvfp4 { .. })
}

/// One product as the workers see it: prepared input, output, chunking.
struct Job<'p, 'w> {
    w: &'p Linear<'w>,
    xp: Prepared<'p>,
    out: SharedMut,
    rows: usize,
    chunk_rows: usize,
    /// Index of this product's first chunk in the batch.
    first: usize,
}

/// [`matmuls_on`] with an explicit kernel path.
///
/// Work is cut into chunks of about [`CHUNK_BYTES`] of weight rows; each
/// worker takes the chunks of its own contiguous region in order (one long
/// stream of rows, prefetched across chunk boundaries) and then steals from
/// the back of the others' regions ([`Regions`]), so a worker the OS delays
/// leaves its share to the others instead of holding everyone at the barrier.
/// A product too small to split runs its chunks in order on the caller.
///
/// # Panics
/// On shape mismatches, or if `path` is not supported by this CPU.
pub fn matmuls_with(
    path: Path,
    pool: &dyn Parallel,
    tokens: usize,
    products: &mut [Product<'_, '_>],
) {
    assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
    let mut jobs = Vec::with_capacity(products.len());
    let (mut chunks, mut work) = (0, 0);
    for p in products.iter_mut() {
        let (rows, cols) = (p.w.rows(), p.w.cols());
        assert_eq!(p.x.len(), tokens * cols, "matmul input shape");
        assert_eq!(p.y.len(), tokens * rows, "matmul output shape");
        if tokens == 0 || rows == 0 {
            continue;
        }
        let row_bytes = (p.w.weight_bytes() / rows).max(1);
        let chunk_rows = (CHUNK_BYTES / row_bytes).next_multiple_of(16).max(16);
        let xp = prepare(path, p.w, p.x, tokens);
        jobs.push(Job { w: p.w, xp, out: SharedMut::new(p.y), rows, chunk_rows, first: chunks });
        chunks += rows.div_ceil(chunk_rows);
        work += rows * cols * tokens;
    }
    if jobs.is_empty() {
        return;
    }
    let chunk = |c: usize, scratch: &mut Vec<f32>| {
        let j = &jobs[jobs.partition_point(|j| j.first <= c) - 1];
        let r0 = (c - j.first) * j.chunk_rows;
        if path == Path::Generic && scratch.len() < j.w.cols() {
            scratch.resize(j.w.cols(), 0.0);
        }
        rows_job(path, j, r0..j.rows.min(r0 + j.chunk_rows), tokens, scratch);
    };
    if work < PARALLEL_MIN || pool.workers() == 1 {
        let mut scratch = vec![];
        (0..chunks).for_each(|c| chunk(c, &mut scratch));
        return;
    }
    let regions = Regions::new(chunks, pool.workers());
    pool.run(&|worker, _| {
        let mut scratch = vec![];
        while let Some(c) = regions.take(worker) {
            chunk(c, &mut scratch);
        }
    });
}

/// Rows `rows` of one job against every token, tile by tile.
fn rows_job(path: Path, j: &Job<'_, '_>, rows: Range<usize>, tokens: usize, scratch: &mut [f32]) {
    let cols = j.w.cols();
    let mut acc = [0.0f32; TILE];
    let tile = j.xp.tile_tokens(cols);
    let mut t0 = 0;
    while t0 < tokens {
        let n = tile.min(tokens - t0);
        let xt = j.xp.tile(t0, n, cols);
        for r in rows.clone() {
            row(path, j.w, r, xt, n, &mut acc, scratch);
            for (t, v) in acc.iter().enumerate().take(n) {
                // SAFETY: (t0 + t) * rows + r < tokens * rows = y.len(), and
                // chunk rows are handed to one worker only (`Regions::take`).
                unsafe { j.out.slice((t0 + t) * j.rows + r, 1)[0] = *v };
            }
        }
        t0 += n;
    }
}

/// Activations as the path's kernel for `w` wants them (see `simd::avx512`).
fn prepare<'x>(path: Path, w: &Linear<'_>, x: &'x [f32], tokens: usize) -> Prepared<'x> {
    if q8_activations(path, w) {
        // `q8_activations` holds only on the VNNI path, which has AVX-512.
        return Prepared::Q8(quantize_q8(x, tokens, w.cols(), true));
    }
    let avx512 = matches!(path, Path::Avx512 | Path::Avx512Vnni);
    let group = match w {
        Linear::Nvfp4 { .. } if avx512 => 8,
        Linear::Nvfp4 { .. } if path == Path::Avx2 => 16,
        Linear::Dense { dtype: DType::BF16, .. } if avx512 => 32,
        _ => return Prepared::F32(Cow::Borrowed(x)),
    };
    let cols = w.cols();
    let mut xp = x.to_vec();
    for t in 0..tokens {
        let (src, dst) = (&x[t * cols..(t + 1) * cols], &mut xp[t * cols..(t + 1) * cols]);
        if group == 8 {
            permute_nvfp4_x8(src, dst);
        } else {
            permute_nvfp4(src, dst, group);
        }
    }
    Prepared::F32(Cow::Owned(xp))
}

/// The `avx512` NVFP4 layout, per full 128-column chunk: value `16k + L` is
/// column `8L + k` (see `simd::avx512`). A trailing partial chunk is copied
/// unchanged.
pub fn permute_nvfp4_x8(x: &[f32], out: &mut [f32]) {
    let full = x.len() / 128 * 128;
    for (src, dst) in x[..full].chunks_exact(128).zip(out[..full].chunks_exact_mut(128)) {
        for k in 0..8 {
            for l in 0..16 {
                dst[16 * k + l] = src[8 * l + k];
            }
        }
    }
    out[full..].copy_from_slice(&x[full..]);
}

/// Per full `group` of columns: even columns first, then odd ones. A
/// trailing partial group is copied unchanged.
pub fn permute_nvfp4<T: Copy>(x: &[T], out: &mut [T], group: usize) {
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

/// Expands `$f::<N>(args)` for the runtime `n` in 1..=16.
macro_rules! by_n {
    ($n:expr, $($f:ident)::+, $($a:expr),*) => {
        match $n {
            1 => $($f)::+::<1>($($a),*), 2 => $($f)::+::<2>($($a),*), 3 => $($f)::+::<3>($($a),*),
            4 => $($f)::+::<4>($($a),*), 5 => $($f)::+::<5>($($a),*), 6 => $($f)::+::<6>($($a),*),
            7 => $($f)::+::<7>($($a),*), _ => $($f)::+::<8>($($a),*),
        }
    };
}

/// One weight row against `n` tokens (`x` is `[n, cols]`, prepared).
fn row(
    path: Path,
    w: &Linear<'_>,
    r: usize,
    x: Xs<'_>,
    n: usize,
    out: &mut [f32; TILE],
    scratch: &mut [f32],
) {
    match (path, x) {
        #[cfg(target_arch = "x86_64")]
        (_, Xs::Q8(q)) => q8_row(w, r, q, n, out),
        #[cfg(target_arch = "x86_64")]
        (Path::Avx2 | Path::Avx512 | Path::Avx512Vnni, Xs::F32(x)) => {
            simd_row(path, w, r, x, n, out)
        }
        (_, Xs::F32(x)) => generic::row(w, r, x, n, out, scratch),
    }
}

#[cfg(target_arch = "x86_64")]
fn q8_row(
    w: &Linear<'_>,
    r: usize,
    x: crate::simd::avx512vnni::Q8In<'_>,
    n: usize,
    out: &mut [f32; TILE],
) {
    use crate::simd::avx512vnni as k;
    let Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } = *w else {
        unreachable!("int8 activations are prepared only for NVFP4 weights");
    };
    let p = &packed[r * cols / 2..(r + 1) * cols / 2];
    let s = &scales[r * cols / 16..(r + 1) * cols / 16];
    // SAFETY: `matmuls_with` checked the path (VNNI + VBMI) is supported;
    // slice lengths match the kernel's preconditions (cols % 16 == 0 by load,
    // the tile holds n tokens of q/corr/scale).
    unsafe { by_n!(n, k::nvfp4_row, p, s, gs, cols, x, out) }
}

#[cfg(target_arch = "x86_64")]
fn simd_row(path: Path, w: &Linear<'_>, r: usize, x: &[f32], n: usize, out: &mut [f32; TILE]) {
    use crate::simd::{avx2, avx512};
    match *w {
        Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } => {
            let p = &packed[r * cols / 2..(r + 1) * cols / 2];
            let s = &scales[r * cols / 16..(r + 1) * cols / 16];
            if path != Path::Avx2 {
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
            if dtype == DType::BF16 && path != Path::Avx2 {
                // SAFETY: path supported; `d` holds `cols` bf16 values; `prepare`
                // permuted x per 32 columns for exactly this case.
                unsafe { by_n!(n, avx512::bf16_row, d, cols, x, out) }
            } else if path != Path::Avx2 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Activations with every case the quantizer treats specially: zeros,
    /// -0.0, exact halves after scaling, tiny and huge magnitudes, denormals,
    /// and (when `bad`) NaN and infinities.
    fn activations(n: usize, seed: u32, bad: bool) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s >> 8) as f32 / (1 << 24) as f32 - 0.5;
                match (i / 16 + seed as usize) % 9 {
                    0 => 0.0,
                    1 => {
                        if i % 2 == 0 {
                            -0.0
                        } else {
                            0.0
                        }
                    }
                    2 => [127.0, 2.5, -2.5, 0.5, -126.5][i % 5],
                    3 => u * 1e-40,
                    4 => u * 3e38,
                    5 if bad => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0][i % 4],
                    6 => u * 1e-3,
                    _ => u * 8.0,
                }
            })
            .collect()
    }

    #[test]
    fn simd_quantization_is_bit_identical_to_scalar() {
        if !crate::simd::features().avx512 {
            eprintln!("no AVX-512 on this CPU: the SIMD quantizer is never used here");
            return;
        }
        for (cols, tokens) in [(128, 1), (256, 3), (144, 2), (2048, 2), (16, 1)] {
            for seed in 0..12 {
                let x = activations(cols * tokens, seed, seed % 3 == 0);
                let (a, b) =
                    (quantize_q8(&x, tokens, cols, true), quantize_q8(&x, tokens, cols, false));
                assert_eq!(a.q, b.q, "q, cols {cols} tokens {tokens} seed {seed}");
                assert_eq!(a.corr, b.corr, "corr, cols {cols} tokens {tokens} seed {seed}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.scale), bits(&b.scale), "scale, cols {cols} seed {seed}");
            }
        }
    }
}
