//! Exact rescoring of a quantized output head's best candidates.
//!
//! A decode step reads the whole head, so a pack may store it in NVFP4
//! (0.5625 bytes a weight). NVFP4 alone changes the greedy token at a few
//! percent of positions; the head is then only a screen: for each row of
//! logits the [`RESCORE_ROWS`] highest candidates are scored again with exact
//! weights (a tied model's BF16 embedding, or an untied pack's
//! `lm_head_exact` copy) and their logits replaced. The tokens sampling can
//! pick (greedy, top-k 20, the bulk of top-p) then carry exact logits, while a
//! step reads the quantized head plus [`RESCORE_ROWS`] rows of the exact one.
//! Logits outside the candidates stay the screen's.

use alloc::vec;
use alloc::vec::Vec;

use crate::kernels::dot;
use crate::scan::top_k;
use crate::weights::Linear;

/// Candidates per row that are rescored with the exact head.
pub const RESCORE_ROWS: usize = 64;

/// Replaces, in each `vocab`-long row of `logits`, the logits of its
/// [`RESCORE_ROWS`] highest entries by `exact`'s row dotted with the matching
/// row of `hidden` (`[n, hidden]`).
pub(crate) fn rescore(exact: &Linear<'_>, hidden: &[f32], logits: &mut [f32]) {
    let (vocab, h) = (exact.rows(), exact.cols());
    debug_assert_eq!(hidden.len() / h * vocab, logits.len());
    let (mut ids, mut row) = (Vec::with_capacity(2 * RESCORE_ROWS), vec![0.0f32; h]);
    for (x, z) in hidden.chunks_exact(h).zip(logits.chunks_exact_mut(vocab)) {
        top_k(z, RESCORE_ROWS, &mut ids);
        for &i in &ids {
            exact.decode_row(i as usize, &mut row);
            z[i as usize] = dot(&row, x);
        }
    }
}
