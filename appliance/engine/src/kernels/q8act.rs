//! Activations quantized to int8 per 16-column block for the NVFP4 kernels
//! on int8 dot products (`simd::avx512vnni`, 128-column chunks, and
//! `simd::avx2_q8`, 64-column chunks): `q = round(x * 127 / amax)`, each
//! chunk laid out as `[even columns | odd columns]`, and per 8-column group
//! the scale (halved: the kernels' E2M1 values are doubled) and
//! `-OFFSET * sum(q)` (the unsigned-offset correction of the VNNI and AVX2
//! kernels, whose E2M1 bytes are offset by +12).

use alloc::vec;
use alloc::vec::Vec;

/// Activations quantized per 16-column block: `q = round(x * 127 / amax)`,
/// permuted per full chunk of columns as `[even | odd]`; per 8-column group
/// `corr = -OFFSET * sum(q)` and `scale = amax / 127 / 2`.
pub(super) struct Q8 {
    /// Columns per `corr` / `scale` entry: 8, or 4 for [`quantize_q8_lanes`].
    pub(super) group: usize,
    pub(super) q: Vec<i8>,
    pub(super) corr: Vec<i32>,
    pub(super) scale: Vec<f32>,
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

/// Position of column `i` of a `chunk`-column chunk in the `[even | odd]` layout.
fn even_odd(i: usize, chunk: usize) -> usize {
    (i % 2) * chunk / 2 + i / 2
}

/// [`Q8`] of `x` (`[tokens, cols]`): AVX-512 for the blocks of full
/// 128-column chunks when `simd` (bit-identical to [`q8_block`]; blocks with
/// a NaN or an infinity take the scalar path), [`q8_block`] for the rest.
/// `chunk` is 128 (VNNI) or 64 (AVX2); `simd` needs `chunk == 128`.
pub(super) fn quantize_q8(x: &[f32], tokens: usize, cols: usize, simd: bool, chunk: usize) -> Q8 {
    debug_assert!(!simd || chunk == 128);
    let mut q = vec![0i8; tokens * cols];
    let mut corr = vec![0i32; tokens * cols / 8];
    let mut scale = vec![0.0f32; tokens * cols / 8];
    let full = cols / chunk * chunk;
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
                    let (c, at) = (c0 / 128 * 128, c0 % 128);
                    row[c + at / 2..c + at / 2 + 8].copy_from_slice(&qb[..8]);
                    row[c + 64 + at / 2..c + 64 + at / 2 + 8].copy_from_slice(&qb[8..]);
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
                let (c, at) = (c0 / chunk * chunk, c0 % chunk);
                for (j, v) in qb.iter().enumerate() {
                    row[c + even_odd(at + j, chunk)] = *v;
                }
            } else {
                row[c0..c0 + 16].copy_from_slice(&qb);
            }
        }
    }
    Q8 { group: 8, q, corr, scale }
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
    Q8 { group: 4, q, corr, scale }
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
#[cfg(target_arch = "x86_64")]
const OFFSET_HEAD: i32 = crate::simd::vnni_q8::OFFSET;
#[cfg(not(target_arch = "x86_64"))]
const OFFSET_HEAD: i32 = 128;
#[cfg(not(target_arch = "x86_64"))]
const OFFSET_Q8: i32 = 12;

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
                let (a, b) = (
                    quantize_q8(&x, tokens, cols, true, 128),
                    quantize_q8(&x, tokens, cols, false, 128),
                );
                assert_eq!(a.q, b.q, "q, cols {cols} tokens {tokens} seed {seed}");
                assert_eq!(a.corr, b.corr, "corr, cols {cols} tokens {tokens} seed {seed}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.scale), bits(&b.scale), "scale, cols {cols} seed {seed}");
            }
        }
    }
}
