//! The matrix products every projection goes through.
//!
//! `matmul_on(pool, w, x, tokens, y)` (or `matmuls_on` for several
//! products in one pool run) cuts the weight rows into chunks the pool's
//! workers take from contiguous per-worker regions (`pool::Regions`, idle
//! workers steal from the others' tails); a worker streams its chunk once per
//! tile of up to [`TILE`] tokens (prefill and speculative verification read
//! each weight from memory once, the chunk staying in cache across tiles).
//! The row kernels come in a portable twin ([`generic`]) and SIMD versions
//! (`simd::{avx2, avx512, avx512vnni}`, with int8 row x token tiles on the
//! VNNI path) chosen at run time ([`crate::simd::active`]) or forced by the
//! engine's caller ([`crate::EngineOptions`]).
//!
//! ```text
//! x [T, cols] --prepare (permute / quantize to int8 for SIMD)--> xp
//! worker w: for chunk c in region(w), then chunks stolen from others' tails:
//!           rows of c x tiles of <= TILE tokens -> y [T, rows]
//! ```

mod delta;
pub mod generic;
mod q8act;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use delta::{delta_step, delta_step_with, gemm_acc, gemm_acc_with, DeltaToken, Mat, MatMut};
pub use q8act::round_q8;

use q8act::{quantize_q8, quantize_q8_lanes, Layout, Q8};

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

/// Most weight rows per tile of the int8 GEMM kernels (`kernels::vnni`):
/// the row dimension of their output block.
pub const TILE_ROWS: usize = 4;

/// Bytes of a tile's activations that should stay in L1 while a chunk's rows
/// pass them: a tile of f32 activations over 2048 columns is 4 tokens.
const TILE_L1_BYTES: usize = 32 << 10;

/// The same budget for int8 tiles (`kernels::vnni`), whose kernels take a
/// token's activations one chunk at a time while its rows' weights stay in
/// registers: L2 serves them as well, and the 9b shape's 12,288-column down
/// projection then runs 8-token tiles instead of 2 (prefill 1.04x).
const TILE_L2_BYTES: usize = 96 << 10;

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
    let _p = crate::profile::scope(crate::profile::Part::Matmul);
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
    let _p = crate::profile::scope(crate::profile::Part::Matmul);
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
    /// int8 per 16-column block, for the VNNI and AVX2 NVFP4 kernels.
    Q8(Q8),
    /// bf16 pairs as AMX B tiles (`simd::amx::pack`), for NVFP4 products over
    /// several tokens on [`Path::Amx`].
    #[cfg(target_arch = "x86_64")]
    Bf16(Vec<u32>),
}

impl Prepared<'_> {
    /// Tokens per tile: at most [`TILE`], and few enough that the tile's
    /// activations fit in [`TILE_L1_BYTES`] (f32) or [`TILE_L2_BYTES`] (int8).
    fn tile_tokens(&self, cols: usize) -> usize {
        let tile_bytes = match self {
            Prepared::F32(_) => TILE_L1_BYTES / 4,
            Prepared::Q8(_) => TILE_L2_BYTES,
            #[cfg(target_arch = "x86_64")]
            Prepared::Bf16(_) => unreachable!("AMX products take every token at once"),
        };
        (tile_bytes / cols.max(1)).clamp(1, TILE)
    }

    /// Tokens `t0..t0 + n` of `cols` columns each.
    fn tile(&self, t0: usize, n: usize, cols: usize) -> Xs<'_> {
        let r = t0 * cols..(t0 + n) * cols;
        match self {
            Prepared::F32(x) => Xs::F32(&x[r]),
            #[cfg(target_arch = "x86_64")]
            Prepared::Q8(q) => {
                let g = t0 * cols / q.group..(t0 + n) * cols / q.group;
                Xs::Q8(crate::simd::avx512vnni::Q8In {
                    q: &q.q[r],
                    corr: &q.corr[g.clone()],
                    scale: &q.scale[g],
                })
            }
            #[cfg(target_arch = "x86_64")]
            Prepared::Bf16(_) => unreachable!("AMX products take every token at once"),
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

/// Whether `path` rounds the activations of a `tokens`-token product with
/// `w` to bf16 ([`Path::Amx`]: NVFP4 in whole tiles, [`AMX_MIN_TOKENS`] or
/// more tokens); its
/// result then equals the generic path's on [`round_bf16`] of the
/// activations, up to the order of the sums.
pub fn bf16_activations(path: Path, w: &Linear<'_>, tokens: usize) -> bool {
    form_for(path, w, tokens) == Form::Bf16Pairs
}

/// `x` rounded to bf16 (nearest even), as f32: the activations of a product
/// for which [`bf16_activations`] holds.
pub fn round_bf16(x: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    return x.iter().map(|&v| crate::simd::amx::round_bf16(v)).collect();
    #[cfg(not(target_arch = "x86_64"))]
    x.to_vec()
}

/// Whether `path` quantizes the activations of products with `w` to int8
/// (NVFP4 weights on `avx512vnni` and `avx2`, q8 weights on `avx512vnni`);
/// its result then equals the generic path's on [`round_q8`] of the
/// activations, up to the order of the sums.
pub fn q8_activations(path: Path, w: &Linear<'_>) -> bool {
    match w {
        Linear::Nvfp4 { .. } => path.vnni() || path == Path::Avx2,
        Linear::Q8 { .. } => path.vnni(),
        Linear::Dense { .. } => false,
    }
}

/// One product as the workers see it: prepared input, output, chunking.
struct Job<'j, 'p, 'w> {
    w: &'p Linear<'w>,
    /// Shared by the batch's products with the same activations and [`Form`].
    xp: &'j Prepared<'p>,
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
    // Each distinct (activations, form) is prepared once: the products of a
    // layer's projections or of an MLP's gate and up share their input.
    let mut preps: Vec<(*const f32, usize, Form, Prepared<'_>)> = Vec::new();
    let mut prep_of = Vec::with_capacity(products.len());
    for p in products.iter() {
        let (rows, cols) = (p.w.rows(), p.w.cols());
        assert_eq!(p.x.len(), tokens * cols, "matmul input shape");
        assert_eq!(p.y.len(), tokens * rows, "matmul output shape");
        if tokens == 0 || rows == 0 {
            prep_of.push(None);
            continue;
        }
        let form = form_for(path, p.w, tokens);
        let same = |(x, n, f, _): &(*const f32, usize, Form, Prepared<'_>)| {
            (*x, *n, *f) == (p.x.as_ptr(), p.x.len(), form)
        };
        let k = preps.iter().position(same).unwrap_or_else(|| {
            preps.push((p.x.as_ptr(), p.x.len(), form, prepare(form, p.x, tokens, cols)));
            preps.len() - 1
        });
        prep_of.push(Some(k));
    }
    let mut jobs = Vec::with_capacity(products.len());
    let (mut chunks, mut work) = (0, 0);
    for (p, k) in products.iter_mut().zip(prep_of) {
        let Some(k) = k else { continue };
        let (rows, cols) = (p.w.rows(), p.w.cols());
        let row_bytes = (p.w.weight_bytes() / rows).max(1);
        let chunk_rows = (CHUNK_BYTES / row_bytes).next_multiple_of(16).max(16);
        let xp = &preps[k].3;
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
/// `scratch` is the worker's: the generic path's row buffer, or the VNNI
/// tiles' decoded scales (reused from chunk to chunk).
fn rows_job(
    path: Path,
    j: &Job<'_, '_, '_>,
    rows: Range<usize>,
    tokens: usize,
    scratch: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(j.xp, Prepared::Q8(_)) {
        return vnni::rows_job(path, j, rows, tokens, scratch);
    }
    #[cfg(target_arch = "x86_64")]
    if let Prepared::Bf16(b) = j.xp {
        return amx_rows(j, b, rows, tokens, scratch);
    }
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

/// What a product's kernel reads in place of its f32 activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// The activations as they are.
    F32,
    /// Permuted per chunk for the `avx512` NVFP4 (8) or bf16 (32) kernels.
    Permuted(usize),
    /// int8 per 4-column lane, for q8 weights on `avx512vnni`.
    Q8Lanes,
    /// int8 per block in `Layout`, quantized with the AVX-512 code or not.
    Q8(Layout, bool),
    /// bf16 pairs as AMX B tiles.
    Bf16Pairs,
}

/// Fewest tokens for which [`Path::Amx`] takes an NVFP4 product on AMX
/// tiles: below it decoding the weights to bf16 costs more than the VNNI
/// kernel's whole product (kernel bench, one thread, 1024x2048 in cache:
/// AMX 0.7x VNNI at 16 tokens, 1.4x at 32, 3.2x at 256).
pub const AMX_MIN_TOKENS: usize = 32;

/// [`form`], except that [`Path::Amx`] takes NVFP4 products of at least
/// [`AMX_MIN_TOKENS`] tokens in whole tiles on bf16 activations.
fn form_for(path: Path, w: &Linear<'_>, tokens: usize) -> Form {
    #[cfg(target_arch = "x86_64")]
    if let Linear::Nvfp4 { rows, cols, .. } = *w {
        if path == Path::Amx && tokens >= AMX_MIN_TOKENS && crate::simd::amx::fits(rows, cols) {
            return Form::Bf16Pairs;
        }
    }
    form(path, w)
}

/// Rows `rows` (whole 16-row strips) of an NVFP4 job against its `tokens`
/// bf16 tokens `b` on AMX tiles: the rows decoded to bf16 once into
/// `scratch`, then every token.
#[cfg(target_arch = "x86_64")]
fn amx_rows(
    j: &Job<'_, '_, '_>,
    b: &[u32],
    rows: Range<usize>,
    tokens: usize,
    scratch: &mut Vec<f32>,
) {
    use crate::simd::amx;
    let Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } = *j.w else {
        unreachable!("bf16 pairs are prepared for NVFP4 weights only");
    };
    let n = rows.len();
    debug_assert!(rows.start % amx::ROWS == 0 && amx::fits(n, cols));
    if scratch.len() < n * cols / 2 {
        scratch.resize(n * cols / 2, 0.0);
    }
    // SAFETY: the first n * cols / 2 floats of `scratch` are n * cols u16
    // (u16 needs less alignment than f32), used only as this view below.
    let a =
        unsafe { core::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u16>(), n * cols) };
    let p = &packed[rows.start * cols / 2..rows.end * cols / 2];
    let s = &scales[rows.start * cols / 16..rows.end * cols / 16];
    // SAFETY: `Path::Amx` is supported (checked by `matmuls_with`), which
    // implies AVX-512 BW and the granted tile state; `p`, `s` and `a` hold
    // `n` rows (a multiple of 16) of `cols` (a multiple of 32) columns, and `b`
    // was packed for `tokens` tokens of `cols` columns.
    unsafe {
        amx::decode(p, s, n, cols, a);
        // y[t * rows + rows.start + r] for t < tokens, r < n: inside y, and
        // these rows are this worker's alone.
        let y = j.out.offset(rows.start).slice(0, 0).as_mut_ptr();
        amx::gemm(a, b, n, cols, tokens, gs, y, j.rows);
    }
}

/// The form `path`'s kernel for `w` wants (see `simd::avx512`).
fn form(path: Path, w: &Linear<'_>) -> Form {
    if q8_activations(path, w) && matches!(w, Linear::Q8 { .. }) {
        return Form::Q8Lanes;
    }
    if q8_activations(path, w) {
        // The SIMD quantizer needs AVX-512, which the VNNI path has.
        let vnni = path.vnni();
        return Form::Q8(if vnni { Layout::BlockLanes } else { Layout::EvenOdd }, vnni);
    }
    let avx512 = path.avx512();
    match w {
        Linear::Nvfp4 { .. } if avx512 => Form::Permuted(8),
        Linear::Dense { dtype: DType::BF16, .. } if avx512 => Form::Permuted(32),
        _ => Form::F32,
    }
}

/// `x` (`tokens` rows of `cols`) in `form`.
fn prepare(form: Form, x: &[f32], tokens: usize, cols: usize) -> Prepared<'_> {
    let group = match form {
        Form::F32 => return Prepared::F32(Cow::Borrowed(x)),
        Form::Q8Lanes => return Prepared::Q8(quantize_q8_lanes(x, tokens, cols)),
        Form::Q8(layout, simd) => return Prepared::Q8(quantize_q8(x, tokens, cols, layout, simd)),
        Form::Permuted(group) => group,
        #[cfg(target_arch = "x86_64")]
        Form::Bf16Pairs => {
            // SAFETY: the form is chosen on `Path::Amx` only, which has
            // AVX-512 BW, for whole 32-column steps (`amx::fits`).
            let b = unsafe { crate::simd::amx::pack(x, tokens, cols) };
            return Prepared::Bf16(b);
        }
        #[cfg(not(target_arch = "x86_64"))]
        Form::Bf16Pairs => unreachable!("AMX exists only on x86_64"),
    };
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
        (_, Xs::Q8(_)) => unreachable!("int8 activations take the tile kernels (`vnni`)"),
        #[cfg(target_arch = "x86_64")]
        (p, Xs::F32(x)) if p == Path::Avx2 || p.avx512() => simd_row(path, w, r, x, n, out),
        (_, Xs::F32(x)) => generic::row(w, r, x, n, out, scratch),
    }
}

#[cfg(target_arch = "x86_64")]
fn simd_row(path: Path, w: &Linear<'_>, r: usize, x: &[f32], n: usize, out: &mut [f32; TILE]) {
    use crate::simd::{avx2, avx512};
    match *w {
        Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } => {
            let p = &packed[r * cols / 2..(r + 1) * cols / 2];
            let s = &scales[r * cols / 16..(r + 1) * cols / 16];
            // AVX2 NVFP4 products take int8 activations (`prepare`).
            debug_assert!(path != Path::Avx2, "AVX2 NVFP4 rows need int8 activations");
            // SAFETY: `matmul_with` checked the path is supported; slice
            // lengths match the kernel's preconditions (cols % 16 == 0 by load).
            unsafe { by_n!(n, avx512::nvfp4_row, p, s, gs, cols, x, out) }
        }
        Linear::Q8 { data, scales, cols, .. } => {
            let d = &data[r * cols..(r + 1) * cols];
            let s = &scales[r * cols / 16..(r + 1) * cols / 16]; // cols / 32 F16 scales
            if path != Path::Avx2 {
                // SAFETY: path supported (AVX-512 implies F16C here); `d` holds
                // `cols` int8, `s` cols / 32 F16 scales; x is [n, cols] unpermuted.
                unsafe { by_n!(n, crate::simd::q8::row_avx512, d, s, cols, x, out) }
            } else {
                // SAFETY: as above for AVX2 (+FMA, F16C).
                unsafe { by_n!(n, crate::simd::q8::row_avx2, d, s, cols, x, out) }
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
