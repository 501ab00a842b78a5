//! Activations quantized to int8 per 16-column block for the NVFP4 kernels
//! on int8 dot products: `q = round(x * 127 / amax)`, each full chunk of
//! columns laid out as its kernel wants it ([`Layout`]: one block per dword
//! lane, in 256-column chunks for `simd::vnni_tile` and 128-column chunks
//! for `simd::avx2_q8`), and per block the scale (halved: the kernels' E2M1
//! values are doubled) and `-OFFSET * sum(q)` (the unsigned-offset
//! correction of the VNNI and AVX2 kernels, whose E2M1 bytes are offset by
//! +12). The SIMD quantizer of a chunk is the path's (`kernels::dispatch`);
//! this module holds the rule.

use alloc::vec;
use alloc::vec::Vec;

use super::dispatch::Isa;
use crate::simd::types::{AVX2_BLOCK_LANES, NVFP4_OFFSET as OFFSET_Q8, Q8_OFFSET as OFFSET_HEAD};

/// Activations quantized per 16-column block: `q = round(x * 127 / amax)`,
/// laid out per full chunk of columns as a kernel wants them; per `group`
/// columns `corr = -OFFSET * sum(q)` and `scale` (`amax / 127 / 2` for the
/// NVFP4 kernels, `amax / 127` for [`quantize_q8_lanes`]).
pub(super) struct Q8 {
    /// Columns per `corr` / `scale` entry: 16 ([`Layout`]), or 4 for
    /// [`quantize_q8_lanes`].
    pub(super) group: usize,
    /// Bytes of `q` from one token to the next: `cols`, or more for
    /// [`Layout::BlockLanes128`] ([`Layout::stride`]).
    pub(super) stride: usize,
    pub(super) q: Vec<i8>,
    pub(super) corr: Vec<i32>,
    pub(super) scale: Vec<f32>,
}

/// How an NVFP4 kernel on int8 activations wants them laid out: per chunk
/// of columns, four vectors whose dword lane `L` holds four columns of one
/// block ([`block_lanes`]; which block, [`Layout::lane`]); `corr` and
/// `scale` per lane, in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// `simd::vnni_tile`: 256-column chunks, 64-byte vectors.
    BlockLanes256,
    /// `simd::avx2_q8`: 128-column chunks, 32-byte vectors, block `b` in
    /// lane `AVX2_BLOCK_LANES[b]`.
    BlockLanes128,
}

impl Layout {
    /// Columns per chunk.
    fn chunk(self) -> usize {
        match self {
            Layout::BlockLanes256 => 256,
            Layout::BlockLanes128 => 128,
        }
    }

    /// Columns per `corr` / `scale` entry.
    fn group(self) -> usize {
        16
    }

    /// Bytes of `q` per token for `cols` columns. The AVX2 tile reads the
    /// same 128 bytes of each of up to 8 tokens together: with rows a
    /// multiple of 4 KiB apart those lines all fall in one L1 set (8 ways)
    /// and evict each other (2b and 9b have 2,048- to 12,288-column
    /// products), so its tokens are 256 bytes more apart: the 8 tokens' lines
    /// then take distinct sets for every such `cols`.
    pub(super) fn stride(self, cols: usize) -> usize {
        match self {
            Layout::BlockLanes256 => cols,
            Layout::BlockLanes128 => cols + 256,
        }
    }

    /// The dword lane of block `b` of a full chunk (and the index of its
    /// `corr` and `scale` within the chunk's).
    fn lane(self, b: usize) -> usize {
        match self {
            Layout::BlockLanes256 => b,
            Layout::BlockLanes128 => AVX2_BLOCK_LANES[b],
        }
    }

    /// Where column `m` of a full chunk goes.
    fn position(self, m: usize) -> usize {
        block_lanes(16 * self.lane(m / 16) + m % 16, self.chunk() / 16)
    }
}

/// Column `m = 16L + k` of a chunk of `lanes` blocks goes to vector `2 *
/// (k / 8) + k % 2` (`4 * lanes` bytes each), byte `4L + (k % 8) / 2`: the
/// partner of the weight nibble `simd::vnni_tile` and `simd::avx2_q8` put
/// there.
const fn block_lanes(m: usize, lanes: usize) -> usize {
    let (l, k) = (m / 16, m % 16);
    4 * lanes * ((k / 8) * 2 + k % 2) + 4 * l + (k % 8) / 2
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

/// [`Q8`] of `x` (`[tokens, cols]`) in `layout`: the SIMD quantizer of
/// `simd`'s path for full chunks (AVX-512 for [`Layout::BlockLanes256`],
/// AVX2 for [`Layout::BlockLanes128`]; bit-identical to [`q8_block`]; a chunk with a
/// NaN or an infinity takes the scalar rule), [`q8_block`] for the rest.
/// Columns after the last full chunk stay in natural order.
pub(super) fn quantize_q8(
    x: &[f32],
    tokens: usize,
    cols: usize,
    layout: Layout,
    simd: Option<Isa>,
) -> Q8 {
    let (chunk, group, stride) = (layout.chunk(), layout.group(), layout.stride(cols));
    let mut q = vec![0i8; tokens * stride];
    let mut corr = vec![0i32; tokens * cols / group];
    let mut scale = vec![0.0f32; tokens * cols / group];
    let full = cols / chunk * chunk;
    let mut qb = [0i8; 16];
    for t in 0..tokens {
        let (xt, row) = (&x[t * cols..(t + 1) * cols], &mut q[t * stride..t * stride + cols]);
        let groups = t * cols / group..(t + 1) * cols / group;
        let (corr, scale) = (&mut corr[groups.clone()], &mut scale[groups]);
        let mut c0 = 0;
        while c0 < cols {
            let g = c0 / group;
            if let Some(isa) = simd.filter(|_| c0 % chunk == 0 && c0 < full) {
                let ends = (c0 + chunk, g + chunk / group);
                let (xc, qc) = (&xt[c0..ends.0], &mut row[c0..ends.0]);
                let (cc, sc) = (&mut corr[g..ends.1], &mut scale[g..ends.1]);
                if q8_chunk_simd(isa, layout, xc, qc, cc, sc) {
                    c0 += chunk;
                    continue;
                }
            }
            let s = q8_block(&xt[c0..c0 + 16], &mut qb);
            let (c, at) = (c0 / chunk * chunk, c0 % chunk);
            let entry = if c0 < full { (c + 16 * layout.lane(at / 16)) / group } else { g };
            scale[entry] = 0.5 * s;
            corr[entry] = -OFFSET_Q8 * qb.iter().map(|&v| i32::from(v)).sum::<i32>();
            if c0 < full {
                for (j, v) in qb.iter().enumerate() {
                    row[c + layout.position(at + j)] = *v;
                }
            } else {
                row[c0..c0 + 16].copy_from_slice(&qb);
            }
            c0 += 16;
        }
    }
    Q8 { group, stride, q, corr, scale }
}

/// [`Q8`] of `x` (`[tokens, cols]`, `cols % 16 == 0`) for the int8 x int8
/// kernel of q8 weights (`simd::vnni_q8`): natural column order; per
/// 4-column lane `corr = -128 * sum(q)` and `scale` = the 16-column block's
/// scale (as [`round_q8`]).
pub(super) fn quantize_q8_lanes(x: &[f32], tokens: usize, cols: usize) -> Q8 {
    debug_assert!(cols % 16 == 0 && x.len() == tokens * cols);
    let mut q = vec![0i8; tokens * cols];
    let mut corr = vec![0i32; tokens * cols / 4];
    let mut scale = vec![0.0f32; tokens * cols / 4];
    let mut qb = [0i8; 16];
    for (b, blk) in x.chunks_exact(16).enumerate() {
        let s = q8_block(blk, &mut qb);
        q[16 * b..16 * b + 16].copy_from_slice(&qb);
        for (l, lane) in qb.chunks_exact(4).enumerate() {
            corr[4 * b + l] = -OFFSET_HEAD * lane.iter().map(|&v| i32::from(v)).sum::<i32>();
            scale[4 * b + l] = s;
        }
    }
    Q8 { group: 4, stride: cols, q, corr, scale }
}

/// One full chunk through the path's SIMD quantizer for `layout` (AVX-512
/// for [`Layout::BlockLanes256`], AVX2 for [`Layout::BlockLanes128`]); false
/// if the scalar rule must take it.
#[cfg(target_arch = "x86_64")]
fn q8_chunk_simd(
    isa: Isa,
    layout: Layout,
    x: &[f32],
    q: &mut [i8],
    corr: &mut [i32],
    scale: &mut [f32],
) -> bool {
    use super::dispatch::{q8_chunk128, q8_chunk256};
    match layout {
        Layout::BlockLanes256 => {
            let (Ok(x), Ok(q), Ok(c), Ok(s)) =
                (x.try_into(), q.try_into(), corr.try_into(), scale.try_into())
            else {
                return false;
            };
            q8_chunk256(isa, x, q, c, s)
        }
        Layout::BlockLanes128 => {
            let (Ok(x), Ok(q), Ok(c), Ok(s)) =
                (x.try_into(), q.try_into(), corr.try_into(), scale.try_into())
            else {
                return false;
            };
            q8_chunk128(isa, x, q, c, s)
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn q8_chunk_simd(_: Isa, _: Layout, _: &[f32], _: &mut [i8], _: &mut [i32], _: &mut [f32]) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

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
                    // Denormals: 127 / amax overflows, and 0 * inf is NaN.
                    3 if i % 5 == 0 => 0.0,
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
        use crate::simd::Path;
        let cases =
            [(Path::Avx512Vnni, Layout::BlockLanes256), (Path::Avx2, Layout::BlockLanes128)];
        for (path, layout) in cases {
            if !path.supported() {
                eprintln!("no {} on this CPU: its SIMD quantizer is never used here", path.name());
                continue;
            }
            for (cols, tokens) in [(128, 1), (256, 3), (400, 2), (2048, 2), (16, 1), (80, 2)] {
                for seed in 0..12 {
                    let x = activations(cols * tokens, seed, seed % 3 == 0);
                    let (a, b) = (
                        quantize_q8(&x, tokens, cols, layout, Some(Isa::new(path))),
                        quantize_q8(&x, tokens, cols, layout, None),
                    );
                    let at = format!("{} cols {cols} tokens {tokens} seed {seed}", path.name());
                    assert_eq!(a.q, b.q, "q, {at}");
                    assert_eq!(a.corr, b.corr, "corr, {at}");
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a.scale), bits(&b.scale), "scale, {at}");
                }
            }
        }
    }
}
