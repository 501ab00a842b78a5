//! Prefill attention in query tiles (flash-attention style): a work item is
//! [`TILE`] consecutive tokens of one KV head, whose queries (every head of
//! the GQA group) pass each block of keys and values together, with an
//! online softmax per query row. A block of K/V is read from memory once per
//! tile, not once per token, so a long prompt's attention costs what its
//! multiply-adds cost rather than `T` passes over the whole cache.
//!
//! A row of a tile takes the softmax of its own keys in each block (exactly
//! the slice the token-by-token path takes) and weight 0 for the block's
//! later keys, which adds nothing; a row whose whole context is one block is
//! normalised before the value sums, as that path does. Past
//! [`PIECE`] keys a row ends its softmax at each piece boundary and merges the
//! pieces in order as decode does (`attention::Merged`). So a token's output is
//! bit-for-bit the same whatever tile it is in, and equal to what decode
//! (`attention::piece` and `merge`) gives it at any context length.

use alloc::vec;

use core::sync::atomic::{AtomicUsize, Ordering};

use super::{Merged, Shape, BLOCK, PIECE};
use crate::kernels::{attn, KvElem};
use crate::ops::exp;
use crate::pool::{Parallel, SharedMut};
use crate::simd::Path;

/// Tokens per tile: its queries (`TILE x` heads per KV head) and their
/// scores for one block of keys stay in L2 with the block's keys and values.
pub(super) const TILE: usize = 16;

/// [`super::attend`] for prefill calls (more than `PIECE_TOKENS` tokens):
/// items of (tile of tokens, KV head) taken from a shared counter.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_tiles<E: KvElem>(
    path: Path,
    pool: &dyn Parallel,
    sh: &Shape,
    qg: &[f32],
    keys: &[E],
    values: &[E],
    attn: &mut [f32],
    parallel: bool,
) {
    let (hd, nq, nkv) = (sh.hd, sh.nq, sh.nkv);
    let g = nq / nkv;
    let items = sh.tokens.div_ceil(TILE) * nkv;
    let out = SharedMut::new(attn);
    let (scale, stride) = (1.0 / libm::sqrtf(hd as f32), nkv * hd);
    let next = AtomicUsize::new(0);
    let run = |_worker: usize, _workers: usize| {
        let rows_max = TILE * g;
        let mut q = vec![0.0f32; rows_max * hd];
        let mut sc = vec![0.0f32; rows_max * BLOCK];
        let mut o = vec![0.0f32; rows_max * hd];
        let (mut m, mut l) = (vec![0.0f32; rows_max], vec![0.0f32; rows_max]);
        let mut merged = vec![Merged { m: f32::NEG_INFINITY, l: 0.0 }; rows_max];
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= items {
                break;
            }
            let (tile, kvh) = (i / nkv, i % nkv);
            let t0 = tile * TILE;
            let row_len = |r: usize| sh.pos0 + t0 + r / g + 1;
            // Row r: token t0 + r / g, head kvh * g + r % g.
            let head = |r: usize| (t0 + r / g) * nq + kvh * g + r % g;
            let rows = TILE.min(sh.tokens - t0) * g;
            for (r, qs) in q.chunks_exact_mut(hd).take(rows).enumerate() {
                let h = head(r);
                qs.copy_from_slice(&qg[h * 2 * hd..h * 2 * hd + hd]);
            }
            m[..rows].fill(f32::NEG_INFINITY);
            l[..rows].fill(0.0);
            o[..rows * hd].fill(0.0);
            let end = sh.pos0 + t0 + rows / g;
            let mut b0 = 0;
            while b0 < end {
                if b0 > 0 && b0 % PIECE == 0 {
                    // Rows going on past b0 end a piece: merged into their output rows.
                    for r in (0..rows).filter(|&r| row_len(r) > b0) {
                        let or = &mut o[r * hd..(r + 1) * hd];
                        let piece = (m[r], l[r], &*or);
                        // SAFETY: row r's (token, head) is this item's alone (its
                        // tile's tokens, its KV head's query heads).
                        let dst = unsafe { out.slice(head(r) * hd, hd) };
                        if b0 == PIECE {
                            merged[r] = Merged::first(piece, dst);
                        } else {
                            merged[r].fold(piece, dst);
                        }
                        (m[r], l[r]) = (f32::NEG_INFINITY, 0.0);
                        or.fill(0.0);
                    }
                }
                let n = BLOCK.min(end - b0);
                let off = kvh * hd + b0 * stride;
                attn::scores(path, &q, rows, hd, &keys[off..], stride, n, &mut sc, BLOCK, scale);
                for r in 0..rows {
                    let len = row_len(r);
                    let valid = len.saturating_sub(b0).min(n);
                    let row = &mut sc[r * BLOCK..r * BLOCK + n];
                    let (mr, lr, or) = (&mut m[r], &mut l[r], &mut o[r * hd..(r + 1) * hd]);
                    if valid > 0 {
                        softmax_step(path, &mut row[..valid], len <= BLOCK, mr, lr, or);
                    }
                    row[valid..].fill(0.0);
                }
                attn::accumulate(path, &sc, BLOCK, rows, hd, &values[off..], stride, n, &mut o);
                b0 += n;
            }
            for r in 0..rows {
                let piece = (m[r], l[r], &o[r * hd..(r + 1) * hd]);
                // SAFETY: as above: this item's own output row.
                let dst = unsafe { out.slice(head(r) * hd, hd) };
                if row_len(r) > PIECE {
                    merged[r].fold(piece, dst);
                    merged[r].finish(dst);
                } else {
                    Merged::first(piece, dst).finish(dst);
                }
            }
        }
    };
    if parallel {
        pool.run(&run);
    } else {
        run(0, 1);
    }
}

/// One block's scores of one query row (`row`: its keys in the block) into
/// probabilities, updating its running max `m`, sum `l` and output `o`
/// (rescaled when the max grows). A row whose `whole` context fits one block
/// is normalised at once (`l = 1`). Decode's blocks (`attention::block`) take
/// the same step.
pub(super) fn softmax_step(
    path: Path,
    row: &mut [f32],
    whole: bool,
    m: &mut f32,
    l: &mut f32,
    o: &mut [f32],
) {
    let bm = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if whole && *m == f32::NEG_INFINITY {
        let sum = attn::exp_shift_sum(path, row, bm);
        row.iter_mut().for_each(|p| *p /= sum);
        (*m, *l) = (bm, 1.0);
        return;
    }
    if bm > *m {
        if *m > f32::NEG_INFINITY {
            let a = exp(*m - bm);
            *l *= a;
            o.iter_mut().for_each(|x| *x *= a);
        }
        *m = bm;
    }
    *l += attn::exp_shift_sum(path, row, *m);
}
