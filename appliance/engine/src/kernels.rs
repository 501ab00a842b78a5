//! The kernel layer's API: the matrix products every projection goes
//! through, the DeltaNet and attention kernels, and the element-wise SiLU
//! and exp, each on an explicit kernel path ([`Path`]: the model's choice,
//! see `Model::set_kernels`). Under it, [`dispatch`] maps a path to the
//! per-ISA kernels of `simd` or their portable twins ([`generic`]).
//!
//! `matmul_with(path, pool, w, x, tokens, y)` (or [`matmuls_with`] for
//! several products in one pool run) cuts the weight rows into chunks the
//! pool's workers take from contiguous per-worker regions (`pool::Regions`,
//! idle workers steal from the others' tails); a worker streams its chunk
//! once per tile of up to [`TILE`] tokens (prefill and speculative
//! verification read each weight from memory once, the chunk staying in
//! cache across tiles).
//!
//! ```text
//! x [T, cols] --prepare (permute / quantize to int8 for SIMD)--> xp
//! worker w: for chunk c in region(w), then chunks stolen from others' tails:
//!           rows of c x tiles of <= TILE tokens -> y [T, rows]
//! ```

mod act;
pub mod attn;
mod delta;
pub(crate) mod dispatch;
pub mod generic;
mod q8act;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use crate::simd::types::{DeltaToken, KvElem, Mat, MatMut, TILE, TILE_ROWS};
pub use act::{exp_in_place, silu_in_place};
pub use delta::{delta_step_with, gemm_acc_with};
pub use q8act::round_q8;

use dispatch::Isa;
use q8act::{quantize_q8, quantize_q8_lanes, Layout, Q8};

use alloc::borrow::Cow;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use crate::pool::{Parallel, Regions, SharedMut};
use crate::simd::types::Q8In;
use crate::simd::Path;
use crate::tensor::DType;
use crate::weights::Linear;

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

/// Where and how products run: a pool's workers and a kernel path (a
/// model's, `Model::exec`).
#[derive(Clone, Copy)]
pub struct Exec<'p> {
    /// The workers rows are split across.
    pub pool: &'p dyn Parallel,
    /// The kernel path.
    pub path: Path,
}

impl core::fmt::Debug for Exec<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Exec({} workers, {})", self.pool.workers(), self.path.name())
    }
}

impl Exec<'_> {
    /// [`matmul_with`] on this pool and path.
    pub fn matmul(&self, w: &Linear<'_>, x: &[f32], tokens: usize, y: &mut [f32]) {
        let _p = crate::profile::scope(crate::profile::Part::Matmul);
        matmul_with(self.path, self.pool, w, x, tokens, y);
    }

    /// [`matmuls_with`] on this pool and path.
    pub fn matmuls(&self, tokens: usize, products: &mut [Product<'_, '_>]) {
        let _p = crate::profile::scope(crate::profile::Part::Matmul);
        matmuls_with(self.path, self.pool, tokens, products);
    }
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

/// `y[t] = W x[t]` for `tokens` rows of `x` (`[tokens, cols]` -> `[tokens,
/// rows]`) on `path`, rows split across `pool`.
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

/// Wrapping sum of `buf` with `path`'s loads and prefetch (the benchmark's
/// read-bandwidth probe).
///
/// # Panics
/// If `path` is not supported by this CPU.
pub fn read_sum(path: Path, buf: &[u64]) -> u64 {
    dispatch::read_sum(Isa::new(path), buf)
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
        match self {
            Prepared::F32(x) => Xs::F32(&x[t0 * cols..(t0 + n) * cols]),
            Prepared::Q8(q) => {
                let (g, s) = (t0 * cols / q.group..(t0 + n) * cols / q.group, q.stride);
                let (corr, scale) = (&q.corr[g.clone()], &q.scale[g]);
                Xs::Q8(Q8In { q: &q.q[t0 * s..(t0 + n) * s], stride: s, corr, scale })
            }
            #[cfg(target_arch = "x86_64")]
            Prepared::Bf16(_) => unreachable!("AMX products take every token at once"),
        }
    }
}

/// A tile of prepared activations.
#[derive(Clone, Copy)]
enum Xs<'a> {
    F32(&'a [f32]),
    Q8(Q8In<'a>),
}

/// Whether `path` rounds the activations of a `tokens`-token product with
/// `w` to bf16 ([`Path::Amx`]: NVFP4 in whole tiles, [`AMX_MIN_TOKENS`] or
/// more tokens); its
/// result then equals the generic path's on [`round_bf16`] of the
/// activations, up to the order of the sums.
pub fn bf16_activations(path: Path, w: &Linear<'_>, tokens: usize) -> bool {
    form_for(Isa::new(path), w, tokens) == Form::Bf16Pairs
}

/// `x` rounded to bf16 (nearest even), as f32: the activations of a product
/// for which [`bf16_activations`] holds.
pub fn round_bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f32::from_bits(crate::simd::types::bf16_bits(v) << 16)).collect()
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

/// Several products over the same `tokens` in one pool run on `path` (for
/// example gate and up of an MLP, or every input projection of a layer):
/// one barrier instead of one per product, and the workers balance across
/// all of them.
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
    let isa = Isa::new(path);
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
        let form = form_for(isa, p.w, tokens);
        let same = |(x, n, f, _): &(*const f32, usize, Form, Prepared<'_>)| {
            (*x, *n, *f) == (p.x.as_ptr(), p.x.len(), form)
        };
        let k = preps.iter().position(same).unwrap_or_else(|| {
            preps.push((p.x.as_ptr(), p.x.len(), form, prepare(isa, form, p.x, tokens, cols)));
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
        if isa.path() == Path::Generic && scratch.len() < j.w.cols() {
            scratch.resize(j.w.cols(), 0.0);
        }
        rows_job(isa, j, r0..j.rows.min(r0 + j.chunk_rows), tokens, scratch);
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
    isa: Isa,
    j: &Job<'_, '_, '_>,
    rows: Range<usize>,
    tokens: usize,
    scratch: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(j.xp, Prepared::Q8(_)) {
        return vnni::rows_job(isa, j, rows, tokens, scratch);
    }
    #[cfg(target_arch = "x86_64")]
    if let Prepared::Bf16(b) = j.xp {
        // SAFETY: output rows `rows` of every token are this worker's alone
        // (`Regions::take` hands each chunk to one worker), inside `y`.
        let y = unsafe { j.out.offset(rows.start).slice(0, 0).as_mut_ptr() };
        // SAFETY: as above: `y` from row `rows.start` of a `[tokens, rows]` output.
        return unsafe { dispatch::amx_rows(isa, j.w, b, rows, tokens, scratch, y) };
    }
    let cols = j.w.cols();
    let mut acc = [0.0f32; TILE];
    let tile = j.xp.tile_tokens(cols);
    let mut t0 = 0;
    while t0 < tokens {
        let n = tile.min(tokens - t0);
        let xt = j.xp.tile(t0, n, cols);
        let Xs::F32(xt) = xt else { unreachable!("int8 activations take the tile kernels") };
        for r in rows.clone() {
            dispatch::f32_row(isa, j.w, r, xt, n, &mut acc, scratch);
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
    /// int8 per block in `Layout`, quantized with the path's SIMD code or not.
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
fn form_for(isa: Isa, w: &Linear<'_>, tokens: usize) -> Form {
    if let Linear::Nvfp4 { rows, cols, .. } = *w {
        if dispatch::amx_takes(isa, rows, cols, tokens, AMX_MIN_TOKENS) {
            return Form::Bf16Pairs;
        }
    }
    form(isa.path(), w)
}

/// The form `path`'s kernel for `w` wants (see `simd::avx512`).
fn form(path: Path, w: &Linear<'_>) -> Form {
    if q8_activations(path, w) && matches!(w, Linear::Q8 { .. }) {
        return Form::Q8Lanes;
    }
    if q8_activations(path, w) {
        // Both int8 paths quantize full chunks with their SIMD quantizer.
        let layout = if path.vnni() { Layout::BlockLanes256 } else { Layout::BlockLanes128 };
        return Form::Q8(layout, true);
    }
    let avx512 = path.avx512();
    match w {
        Linear::Nvfp4 { .. } if avx512 => Form::Permuted(8),
        Linear::Dense { dtype: DType::BF16, .. } if avx512 => Form::Permuted(32),
        _ => Form::F32,
    }
}

/// `x` (`tokens` rows of `cols`) in `form`, on `isa`.
fn prepare(isa: Isa, form: Form, x: &[f32], tokens: usize, cols: usize) -> Prepared<'_> {
    let group = match form {
        Form::F32 => return Prepared::F32(Cow::Borrowed(x)),
        Form::Q8Lanes => return Prepared::Q8(quantize_q8_lanes(x, tokens, cols)),
        Form::Q8(layout, simd) => {
            let simd = simd.then_some(isa);
            return Prepared::Q8(quantize_q8(x, tokens, cols, layout, simd));
        }
        Form::Permuted(group) => group,
        #[cfg(target_arch = "x86_64")]
        Form::Bf16Pairs => return Prepared::Bf16(dispatch::amx_pack(isa, x, tokens, cols)),
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

/// Dot product of equal-length slices, with 8 partial sums (portable: the
/// same bits on every path).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    generic::dot(a, b)
}
