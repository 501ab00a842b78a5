//! The products on int8 activations as GEMMs: `avx512vnni` (NVFP4 weights:
//! tiles of 2 rows x up to 8 tokens; q8 weights: 4 rows x 4 tokens) and
//! `avx2` (NVFP4: 1 row x 8 tokens), the kernels themselves through
//! [`dispatch`]. A worker's chunk of rows is taken in such tiles, so each
//! weight tile is loaded and decoded once per token tile and each token's
//! activations once per row tile.

use alloc::vec::Vec;
use core::ops::Range;

use super::dispatch::{self, Isa};
use super::{Job, Prepared, Xs};
use crate::simd::types::{TILE, TILE_ROWS};

/// Rows `rows` of a job on int8 activations against every token, on
/// `isa` (`avx512vnni`, or `avx2` for NVFP4 weights).
///
/// # Panics
/// If the job's activations are not int8 or its weights are dense.
/// `scratch` holds the pre-decoded scales (grown, never shrunk or cleared).
pub(super) fn rows_job(
    isa: Isa,
    j: &Job<'_, '_, '_>,
    rows: Range<usize>,
    tokens: usize,
    scratch: &mut Vec<f32>,
) {
    assert!(matches!(j.xp, Prepared::Q8(_)), "the int8 tile kernels take int8 activations");
    let cols = j.w.cols();
    let (max, max_rows) = dispatch::q8_tile_shape(isa, j.w);
    let tile = j.xp.tile_tokens(cols).min(max);
    let pre = dispatch::pre_scales(isa, j.w, rows.clone(), tokens > tile, scratch);
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
            dispatch::q8_tile(isa, j.w, r0, nr, n, x, pre, &mut out);
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
