//! The products on int8 activations as GEMMs: `avx512vnni` (NVFP4 weights:
//! `simd::vnni_tile`, tiles of 2 rows x up to 8 tokens; q8 weights:
//! `simd::vnni_q8`, 4 rows x 4 tokens) and `avx2` (NVFP4; `simd::avx2_q8`,
//! 2 rows x 4 tokens). A worker's chunk of rows is taken in such tiles, so
//! each weight tile is loaded and decoded once per token tile and each
//! token's activations once per row tile.

use alloc::vec::Vec;
use core::ops::Range;

use super::{Job, Prepared, Xs, TILE, TILE_ROWS};
use crate::simd::avx2_q8::{self, nvfp4_tile as avx2_tile};
use crate::simd::avx512vnni::Q8In;
use crate::simd::vnni_q8::{self, q8_tile};
use crate::simd::vnni_tile::{self, decode_scales, nvfp4_tile};
use crate::simd::Path;
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

/// `$f::<R, n>(args)` for the runtime token count `n` in 1..=8.
macro_rules! by_tokens8 {
    ($f:ident, $r:literal, $n:expr, $($a:expr),*) => {
        match $n {
            1 => $f::<$r, 1>($($a),*),
            2 => $f::<$r, 2>($($a),*),
            3 => $f::<$r, 3>($($a),*),
            4 => $f::<$r, 4>($($a),*),
            5 => $f::<$r, 5>($($a),*),
            6 => $f::<$r, 6>($($a),*),
            7 => $f::<$r, 7>($($a),*),
            _ => $f::<$r, 8>($($a),*),
        }
    };
}

/// Rows `rows` of a job on int8 activations against every token, on
/// `path` (`avx512vnni`, or `avx2` for NVFP4 weights).
///
/// # Panics
/// If the job's activations are not int8 or its weights are dense.
/// `scratch` holds the pre-decoded scales (grown, never shrunk or cleared).
pub(super) fn rows_job(
    path: Path,
    j: &Job<'_, '_, '_>,
    rows: Range<usize>,
    tokens: usize,
    scratch: &mut Vec<f32>,
) {
    assert!(matches!(j.xp, Prepared::Q8(_)), "the int8 tile kernels take int8 activations");
    let cols = j.w.cols();
    let (max, max_rows) = match (path, j.w) {
        (Path::Avx2, _) => (avx2_q8::TOKENS, avx2_q8::ROWS),
        (_, Linear::Nvfp4 { .. }) => (vnni_tile::TOKENS, vnni_tile::ROWS),
        (_, Linear::Q8 { .. }) => (vnni_q8::TOKENS, vnni_q8::ROWS),
        (_, Linear::Dense { .. }) => unreachable!("dense weights take f32 activations"),
    };
    let tile = j.xp.tile_tokens(cols).min(max);
    let pre = pre_scales(path, j.w, rows.clone(), tokens > tile, scratch);
    // AVX2 tiles of two rows pay only with pre-decoded scales (one row
    // decodes two chunks' scales at once; measured 1.1x at 4 tokens).
    let max_rows = if path == Path::Avx2 && pre.is_empty() { 1 } else { max_rows };
    let per_row = pre.len() / rows.len().max(1);
    let mut out = [[0.0f32; TILE]; TILE_ROWS];
    let mut t0 = 0;
    while t0 < tokens {
        let n = tile.min(tokens - t0);
        let Xs::Q8(x) = j.xp.tile(t0, n, cols) else { unreachable!("checked above") };
        let mut r0 = rows.start;
        while r0 < rows.end {
            // One token (decode) streams its rows one at a time: a single
            // sequential stream reads DRAM faster than four interleaved ones
            // (measured 1.2x), and a row's arithmetic is the same either way.
            let nr = if n > 1 && rows.end - r0 >= max_rows { max_rows } else { 1 };
            let at = (r0 - rows.start) * per_row;
            let pre = &pre[at..at + nr * per_row];
            if path == Path::Avx2 {
                avx2_rows(j.w, r0, nr, n, x, pre, &mut out);
            } else {
                tile_rows(j.w, r0, nr, n, x, pre, &mut out);
            }
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

/// The NVFP4 block scales of `rows` decoded once ([`decode_scales`], or
/// `avx2_q8::decode_scales` on `avx2`) into `buf` when they will pass several
/// token tiles (`many`); empty otherwise. `buf` is only zeroed where it
/// grows: a chunk's decode overwrites it all.
fn pre_scales<'b>(
    path: Path,
    w: &Linear<'_>,
    rows: Range<usize>,
    many: bool,
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    match *w {
        Linear::Nvfp4 { scales, global_scale: gs, cols, .. }
            if many && cols >= 64 && path == Path::Avx2 =>
        {
            let out = grown(buf, rows.len() * (cols / 64) * 8);
            let s = &scales[rows.start * cols / 16..rows.end * cols / 16];
            // SAFETY: the path (AVX2 + FMA) is supported (`matmuls_with`);
            // `s` holds `rows.len()` rows of scales, `out` 8 floats per chunk.
            unsafe { avx2_q8::decode_scales(s, gs, cols, out) };
            out
        }
        Linear::Nvfp4 { scales, global_scale: gs, cols, .. }
            if many && cols >= vnni_tile::CHUNK =>
        {
            let out = grown(buf, rows.len() * (cols / vnni_tile::CHUNK) * 16);
            let s = &scales[rows.start * cols / 16..rows.end * cols / 16];
            // SAFETY: the caller's path (VNNI) has AVX-512 F/BW/VL; `s`
            // holds `rows.len()` rows of scales, `out` 16 floats per chunk.
            unsafe { decode_scales(s, gs, cols, out) };
            out
        }
        _ => &[],
    }
}

/// The first `n` floats of `buf`, grown (zero-filled) if it is shorter.
fn grown(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// Rows `r0..r0 + nr` (`nr` is 1 or the kernel's `ROWS`) against the `n` tokens of `x`
/// (`pre`: their pre-decoded NVFP4 scales, or empty).
#[allow(clippy::too_many_arguments)]
fn tile_rows(
    w: &Linear<'_>,
    r0: usize,
    nr: usize,
    n: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [[f32; TILE]; TILE_ROWS],
) {
    match *w {
        Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } => {
            let p = &packed[r0 * cols / 2..(r0 + nr) * cols / 2];
            let s = &scales[r0 * cols / 16..(r0 + nr) * cols / 16];
            // SAFETY: `matmuls_with` checked the path (VNNI + VBMI) is
            // supported; `p` and `s` hold `nr` rows, `cols % 16 == 0` (by
            // load), the tile holds `n <= 4` tokens quantized for this kernel.
            unsafe {
                if nr == vnni_tile::ROWS {
                    by_tokens8!(nvfp4_tile, 2, n, p, s, gs, cols, x, pre, out)
                } else {
                    by_tokens8!(nvfp4_tile, 1, n, p, s, gs, cols, x, pre, out)
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
                if nr == vnni_q8::ROWS {
                    by_tokens!(q8_tile, 4, n, d, s, cols, x, out)
                } else {
                    by_tokens!(q8_tile, 1, n, d, s, cols, x, out)
                }
            }
        }
        Linear::Dense { .. } => unreachable!("dense weights take f32 activations"),
    }
}

/// `avx2` NVFP4 rows `r0..r0 + nr` (`nr` is 1 or `avx2_q8::ROWS`) against
/// the `n` tokens of `x` (`pre`: their pre-decoded scales, or empty).
fn avx2_rows(
    w: &Linear<'_>,
    r0: usize,
    nr: usize,
    n: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [[f32; TILE]; TILE_ROWS],
) {
    let Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } = *w else {
        unreachable!("avx2 takes int8 activations for NVFP4 weights only");
    };
    let p = &packed[r0 * cols / 2..(r0 + nr) * cols / 2];
    let s = &scales[r0 * cols / 16..(r0 + nr) * cols / 16];
    // SAFETY: `matmuls_with` checked AVX2 (+FMA) is supported; `p` and `s`
    // hold `nr` rows, `cols % 16 == 0` (by load), the tile holds `n <= 4`
    // tokens quantized in 64-column chunks (`q8act`).
    unsafe {
        if nr == avx2_q8::ROWS {
            by_tokens!(avx2_tile, 2, n, p, s, gs, cols, x, pre, out)
        } else {
            by_tokens!(avx2_tile, 1, n, p, s, gs, cols, x, pre, out)
        }
    }
}
