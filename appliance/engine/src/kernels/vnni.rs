//! The `avx512vnni` products on int8 activations (NVFP4 and q8 weights) as
//! GEMMs: a worker's chunk of rows is taken in tiles of [`ROWS`] rows x up
//! to 4 tokens (`simd::vnni_tile`, `simd::vnni_q8`), so each weight tile is
//! loaded and decoded once per token tile and each token's activations once
//! per row tile.

use alloc::vec::Vec;
use core::ops::Range;

use super::{Job, Prepared, Xs, TILE};
use crate::simd::avx512vnni::Q8In;
use crate::simd::vnni_q8::{self, q8_tile};
use crate::simd::vnni_tile::{self, decode_scales, nvfp4_tile, ROWS};
use crate::weights::Linear;

/// `$f::<R, n>(args)` for the runtime token count `n` in 1..=4.
macro_rules! by_tokens {
    ($f:ident, $r:literal, $n:expr, $($a:expr),*) => {
        match $n {
            1 => $f::<$r, 1>($($a),*),
            2 => $f::<$r, 2>($($a),*),
            3 => $f::<$r, 3>($($a),*),
            _ => $f::<$r, 4>($($a),*),
        }
    };
}

/// Rows `rows` of a job on int8 activations against every token.
///
/// # Panics
/// If the job's activations are not int8 or its weights are dense.
/// `scratch` holds the pre-decoded scales (grown, never shrunk or cleared).
pub(super) fn rows_job(j: &Job<'_, '_>, rows: Range<usize>, tokens: usize, scratch: &mut Vec<f32>) {
    assert!(matches!(j.xp, Prepared::Q8(_)), "the VNNI tile kernels take int8 activations");
    let cols = j.w.cols();
    let max = match j.w {
        Linear::Nvfp4 { .. } => vnni_tile::TOKENS,
        Linear::Q8 { .. } => vnni_q8::TOKENS,
        Linear::Dense { .. } => unreachable!("dense weights take f32 activations"),
    };
    let tile = j.xp.tile_tokens(cols).min(max);
    let pre = pre_scales(j.w, rows.clone(), tokens > tile, scratch);
    let per_row = pre.len() / rows.len().max(1);
    let mut out = [[0.0f32; TILE]; ROWS];
    let mut t0 = 0;
    while t0 < tokens {
        let n = tile.min(tokens - t0);
        let Xs::Q8(x) = j.xp.tile(t0, n, cols) else { unreachable!("checked above") };
        let mut r0 = rows.start;
        while r0 < rows.end {
            // One token (decode) streams its rows one at a time: a single
            // sequential stream reads DRAM faster than four interleaved ones
            // (measured 1.2x), and a row's arithmetic is the same either way.
            let nr = if n > 1 && rows.end - r0 >= ROWS { ROWS } else { 1 };
            let at = (r0 - rows.start) * per_row;
            tile_rows(j.w, r0, nr, n, x, &pre[at..at + nr * per_row], &mut out);
            for (r, o) in out.iter().enumerate().take(nr) {
                for (t, v) in o.iter().enumerate().take(n) {
                    // SAFETY: (t0 + t) * rows + r0 + r < tokens * rows =
                    // y.len(), and chunk rows are handed to one worker only.
                    unsafe { j.out.slice((t0 + t) * j.rows + r0 + r, 1)[0] = *v };
                }
            }
            r0 += nr;
        }
        t0 += n;
    }
}

/// The NVFP4 block scales of `rows` decoded once ([`decode_scales`]) into
/// `buf` when they will pass several token tiles (`many`); empty otherwise.
/// `buf` is only zeroed where it grows: a chunk's decode overwrites it all.
fn pre_scales<'b>(
    w: &Linear<'_>,
    rows: Range<usize>,
    many: bool,
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    match *w {
        Linear::Nvfp4 { scales, global_scale: gs, cols, .. } if many && cols >= 128 => {
            let n = rows.len() * (cols / 128) * 16;
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
            let out = &mut buf[..n];
            let s = &scales[rows.start * cols / 16..rows.end * cols / 16];
            // SAFETY: the caller's path (VNNI) has AVX-512 F/BW/VL; `s`
            // holds `rows.len()` rows of scales, `out` 16 floats per chunk.
            unsafe { decode_scales(s, gs, cols, out) };
            out
        }
        _ => &[],
    }
}

/// Rows `r0..r0 + nr` (`nr` is 1 or [`ROWS`]) against the `n` tokens of `x`
/// (`pre`: their pre-decoded NVFP4 scales, or empty).
#[allow(clippy::too_many_arguments)]
fn tile_rows(
    w: &Linear<'_>,
    r0: usize,
    nr: usize,
    n: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [[f32; TILE]; ROWS],
) {
    match *w {
        Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } => {
            let p = &packed[r0 * cols / 2..(r0 + nr) * cols / 2];
            let s = &scales[r0 * cols / 16..(r0 + nr) * cols / 16];
            // SAFETY: `matmuls_with` checked the path (VNNI + VBMI) is
            // supported; `p` and `s` hold `nr` rows, `cols % 16 == 0` (by
            // load), the tile holds `n <= 4` tokens quantized for this kernel.
            unsafe {
                if nr == ROWS {
                    by_tokens!(nvfp4_tile, 4, n, p, s, gs, cols, x, pre, out)
                } else {
                    by_tokens!(nvfp4_tile, 1, n, p, s, gs, cols, x, pre, out)
                }
            }
        }
        Linear::Q8 { data, scales, cols, .. } => {
            let d = &data[r0 * cols..(r0 + nr) * cols];
            let s = &scales[r0 * cols / 16..(r0 + nr) * cols / 16];
            // SAFETY: as above (the path implies F16C: `detect` requires it for
            // AVX2); `d` and `s` hold `nr` rows, `cols % 32 == 0` (by load),
            // the activations were quantized per 4-column lane for this kernel.
            unsafe {
                if nr == ROWS {
                    by_tokens!(q8_tile, 4, n, d, s, cols, x, out)
                } else {
                    by_tokens!(q8_tile, 1, n, d, s, cols, x, out)
                }
            }
        }
        Linear::Dense { .. } => unreachable!("dense weights take f32 activations"),
    }
}
