//! Gated full attention: q_proj yields a query and an output gate per head,
//! per-head (1+w) q_norm/k_norm, partial rotate-half RoPE, grouped-query
//! attention over the KV cache, `o_proj(attn * sigmoid(gate))`.
//!
//! The attention itself ([`attend`]) is an online softmax over blocks of
//! keys (`kernels::attn`: scores, exp, weighted value sums, on f32 or f16
//! caches) with work items taken by the pool's workers from a shared
//! counter; no allocation per key. For decode (few tokens) an item is (token,
//! key piece, KV heads): long contexts are cut into fixed pieces merged
//! afterwards, so the cost per step is linear in the context and spread over
//! every worker, and an item takes every KV head of its piece when the
//! pieces keep the workers busy, so the cache's rows are read whole. For prefill an item is (tile of tokens, KV head)
//! ([`tiles`]): each block of keys and values is read once per tile, and
//! its rows merge the same pieces the same way, so every token's output is
//! the same bits in a decode step and in a prefill call of any length.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::config::ModelConfig;
use crate::kernels::attn;
use crate::kernels::{Exec, KvElem, Product};
use crate::ops::{exp, rms_norm_1p, rope, sigmoid_in_place};
use crate::pool::{Parallel, SharedMut};
use crate::simd::Path;
use crate::state::Kv;
use crate::tensor::TensorSource;
use crate::weights::{Linear, WeightError, WeightLoader};

mod tiles;

/// Weights of one gated attention layer.
#[derive(Debug)]
pub struct Attention<'a> {
    /// `[heads * head_dim * 2, hidden]`: per head, query then gate.
    pub q_proj: Linear<'a>,
    /// `[kv_heads * head_dim, hidden]`.
    pub k_proj: Linear<'a>,
    /// `[kv_heads * head_dim, hidden]`.
    pub v_proj: Linear<'a>,
    /// `[hidden, heads * head_dim]`.
    pub o_proj: Linear<'a>,
    /// (1+w) RMSNorm over each query head `[head_dim]`.
    pub q_norm: Vec<f32>,
    /// (1+w) RMSNorm over each key head `[head_dim]`.
    pub k_norm: Vec<f32>,
}

impl<'a> Attention<'a> {
    /// Loads `<prefix>.*` (`…self_attn`).
    pub fn load<S: TensorSource + ?Sized>(
        w: &WeightLoader<'a, S>,
        cfg: &ModelConfig,
        p: &str,
    ) -> Result<Self, WeightError> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Ok(Attention {
            q_proj: w.linear(&format!("{p}.q_proj"), nq * hd * 2, h)?,
            k_proj: w.linear(&format!("{p}.k_proj"), nkv * hd, h)?,
            v_proj: w.linear(&format!("{p}.v_proj"), nkv * hd, h)?,
            o_proj: w.linear(&format!("{p}.o_proj"), h, nq * hd)?,
            q_norm: w.vector(&format!("{p}.q_norm.weight"), hd)?,
            k_norm: w.vector(&format!("{p}.k_norm.weight"), hd)?,
        })
    }

    /// Runs `tokens` rows of `x` (`[T, hidden]`, input-normed) at positions
    /// `pos0..pos0+T`, appending to the KV cache; returns `[T, hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        inv_freq: &[f32],
        x: &[f32],
        tokens: usize,
        pos0: usize,
        k_cache: &mut Kv,
        v_cache: &mut Kv,
    ) -> Vec<f32> {
        let mut p = self.project(cfg, ex, x, tokens);
        let attn = self.mix(cfg, ex, inv_freq, p.rows_mut(0..tokens), pos0, k_cache, v_cache);
        let mut y = vec![0.0; tokens * cfg.hidden_size];
        ex.matmul(&self.o_proj, &attn, tokens, &mut y);
        y
    }

    /// The q/k/v projections of `tokens` rows of `x` in one pass over the
    /// weights (rows of several sequences may share it).
    pub(crate) fn project(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        x: &[f32],
        tokens: usize,
    ) -> Projected {
        let (hd, nq, nkv) = (cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
        let mut p = Projected {
            qg: vec![0.0; tokens * nq * hd * 2], // [T, nq, 2, hd]: query | gate per head
            k: vec![0.0; tokens * nkv * hd],     // [T, nkv, hd]
            v: vec![0.0; tokens * nkv * hd],     // [T, nkv, hd]
            dims: (nq * hd * 2, nkv * hd),
        };
        ex.matmuls(
            tokens,
            &mut [
                Product::new(&self.q_proj, x, &mut p.qg),
                Product::new(&self.k_proj, x, &mut p.k),
                Product::new(&self.v_proj, x, &mut p.v),
            ],
        );
        p
    }

    /// Norms, RoPE, cache append and gated attention of one sequence's
    /// projected rows at positions `pos0..`; returns `[T, heads * head_dim]`
    /// (input of `o_proj`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mix(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        inv_freq: &[f32],
        p: ProjRows<'_>,
        pos0: usize,
        k_cache: &mut Kv,
        v_cache: &mut Kv,
    ) -> Vec<f32> {
        let (hd, nq, nkv) = (cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
        let ProjRows { qg, k, v, tokens } = p;
        for t in 0..tokens {
            for qh in qg[t * nq * hd * 2..(t + 1) * nq * hd * 2].chunks_exact_mut(2 * hd) {
                rms_norm_1p(&mut qh[..hd], &self.q_norm, cfg.rms_norm_eps);
                rope(&mut qh[..hd], pos0 + t, inv_freq);
            }
            for kh in k[t * nkv * hd..(t + 1) * nkv * hd].chunks_exact_mut(hd) {
                rms_norm_1p(kh, &self.k_norm, cfg.rms_norm_eps);
                rope(kh, pos0 + t, inv_freq);
            }
        }
        k_cache.extend_f32(k);
        v_cache.extend_f32(v);

        let shape = Shape { hd, nq, nkv, tokens, pos0 };
        let mut attn = vec![0.0; tokens * nq * hd]; // [T, nq, hd]
        let (path, pool) = (ex.path, ex.pool);
        match (&*k_cache, &*v_cache) {
            (Kv::F32(kc), Kv::F32(vc)) => attend(path, pool, &shape, qg, kc, vc, &mut attn),
            (Kv::F16(kc), Kv::F16(vc)) => attend(path, pool, &shape, qg, kc, vc, &mut attn),
            _ => unreachable!("keys and values of a layer share one precision"),
        }
        let mut gate = vec![0.0; tokens * nq * hd];
        for (g, qh) in gate.chunks_exact_mut(hd).zip(qg.chunks_exact(2 * hd)) {
            g.copy_from_slice(&qh[hd..]);
        }
        sigmoid_in_place(path, &mut gate);
        attn.iter_mut().zip(&gate).for_each(|(o, g)| *o *= g);
        attn
    }
}

/// The projections of some rows (`[T, ·]` each).
pub(crate) struct Projected {
    qg: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Row widths: query and gate, keys (= values).
    dims: (usize, usize),
}

impl Projected {
    /// Rows `r` (one sequence's tokens), mutable.
    pub(crate) fn rows_mut(&mut self, r: Range<usize>) -> ProjRows<'_> {
        let (q, kv) = self.dims;
        ProjRows {
            qg: &mut self.qg[r.start * q..r.end * q],
            k: &mut self.k[r.start * kv..r.end * kv],
            v: &self.v[r.start * kv..r.end * kv],
            tokens: r.len(),
        }
    }
}

/// One sequence's rows of [`Projected`].
pub(crate) struct ProjRows<'p> {
    qg: &'p mut [f32],
    k: &'p mut [f32],
    v: &'p [f32],
    tokens: usize,
}

/// Keys per online-softmax block: one block's scores per head stay in L1.
const BLOCK: usize = 256;
/// Keys per piece of a long context when at most [`PIECE_TOKENS`] tokens run
/// (decode, speculative verification): each token's KV head is then cut into
/// pieces that different workers take and the caller merges, so one token
/// with two KV heads still keeps every worker busy. The cut depends only on
/// the token count and context length, never on the pool: results do not
/// depend on the number of workers. Prefill tiles end and merge their rows'
/// softmax at the same boundaries ([`Merged`]), so results do not depend on
/// the call either.
const PIECE: usize = 2048;
/// See [`PIECE`]; longer calls (prefill) take tiles of tokens ([`tiles`]).
const PIECE_TOKENS: usize = 16;
/// Below this many multiply-adds attention runs on the caller alone.
const PARALLEL_MIN: usize = 1 << 16;

/// Sizes of one attention call.
struct Shape {
    hd: usize,
    nq: usize,
    nkv: usize,
    tokens: usize,
    pos0: usize,
}

impl Shape {
    /// Pieces of a token's KV head over `len` keys (decode calls only).
    fn pieces(&self, len: usize) -> usize {
        len.div_ceil(PIECE)
    }

    /// `(token, first KV head, piece, key range)` of work item `i`, an item
    /// being `span` consecutive KV heads of one piece, given `first[t]` = the
    /// first item of token `t`.
    fn item(&self, first: &[usize], span: usize, i: usize) -> (usize, usize, usize, Range<usize>) {
        let t = first.partition_point(|&f| f <= i) - 1;
        let len = self.pos0 + t + 1;
        let np = self.pieces(len);
        let (kvh, p) = ((i - first[t]) / np * span, (i - first[t]) % np);
        let keys = if np == 1 { 0..len } else { p * PIECE..len.min((p + 1) * PIECE) };
        (t, kvh, p, keys)
    }
}

/// Causal grouped-query attention of `tokens` queries (`qg`: `[T, nq, 2,
/// hd]`, query then gate) over the cache (`[pos0 + T, nkv, hd]`) into `attn`
/// (`[T, nq, hd]`, before the gate), split across `pool`: pieces of the
/// context per token for decode calls, tiles of tokens for prefill.
fn attend<E: KvElem>(
    path: Path,
    pool: &dyn Parallel,
    sh: &Shape,
    qg: &[f32],
    keys: &[E],
    values: &[E],
    attn: &mut [f32],
) {
    let (hd, nq, nkv) = (sh.hd, sh.nq, sh.nkv);
    let g = nq / nkv;
    let work: usize = (0..sh.tokens).map(|t| (sh.pos0 + t + 1) * nq * hd).sum();
    let parallel = work >= PARALLEL_MIN && pool.workers() > 1;
    if sh.tokens > PIECE_TOKENS {
        return tiles::attend_tiles(path, pool, sh, qg, keys, values, attn, parallel);
    }
    let pieces: usize = (0..sh.tokens).map(|t| sh.pieces(sh.pos0 + t + 1)).sum();
    let span = heads_per_item(nkv, pieces, if parallel { pool.workers() } else { 1 });
    // Units (token, KV head, piece) hold the partial results; first[t] and
    // units_first[t] are token t's first item and first unit.
    let (mut first, mut units_first) =
        (Vec::with_capacity(sh.tokens), Vec::with_capacity(sh.tokens));
    let (mut items, mut units) = (0, 0);
    for t in 0..sh.tokens {
        first.push(items);
        units_first.push(units);
        let np = sh.pieces(sh.pos0 + t + 1);
        items += nkv / span * np;
        units += nkv * np;
    }
    // Partial results per unit: running max, sum, unnormalised output.
    let (mut pm, mut pl, mut po) =
        (vec![0.0; units * g], vec![0.0; units * g], vec![0.0; units * g * hd]);
    // Workers write disjoint slots: one work item each, taken from a shared counter.
    let (out_m, out_l, out_o) =
        (SharedMut::new(&mut pm), SharedMut::new(&mut pl), SharedMut::new(&mut po));
    let scale = 1.0 / libm::sqrtf(hd as f32);
    let stride = nkv * hd;
    let next = AtomicUsize::new(0);
    let run = |_worker: usize, _workers: usize| {
        let mut heads = Heads::new(span, g, hd);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= items {
                break;
            }
            let (t, kvh, p, range) = sh.item(&first, span, i);
            for (j, qs) in heads.q.chunks_exact_mut(hd).enumerate() {
                let h = t * nq + kvh * g + j;
                qs.copy_from_slice(&qg[h * 2 * hd..h * 2 * hd + hd]);
            }
            let kv = (&keys[kvh * hd..], &values[kvh * hd..]);
            let whole = range.len() == sh.pos0 + t + 1;
            piece(path, scale, g, hd, kv, stride, range, whole, &mut heads);
            let np = sh.pieces(sh.pos0 + t + 1);
            for k in 0..span {
                let u = units_first[t] + (kvh + k) * np + p;
                let (m, l, o) = heads.result(k);
                // SAFETY: unit u, made by this item alone, owns these g (and g * hd) slots.
                unsafe {
                    out_m.slice(u * g, g).copy_from_slice(m);
                    out_l.slice(u * g, g).copy_from_slice(l);
                    out_o.slice(u * g * hd, g * hd).copy_from_slice(o);
                }
            }
        }
    };
    if parallel {
        pool.run(&run);
    } else {
        run(0, 1);
    }
    merge(sh, &units_first, &pm, &pl, &po, attn);
}

/// KV heads per decode work item: all of them when the pieces alone keep
/// every worker busy, else one. A cache row holds every KV head's key (or
/// value) side by side, so an item over all heads reads whole rows in one
/// pass; items of one head each read a part of every row, and the cache
/// lines the hardware fetches along with it (the other heads' parts) are
/// gone again before their item comes. Every head's sums run the same steps
/// either way, so the results do not depend on the span.
fn heads_per_item(nkv: usize, pieces: usize, workers: usize) -> usize {
    if pieces >= 2 * workers {
        nkv
    } else {
        1
    }
}

/// Working state of one work item: per KV head `k < span`, its `g` queries
/// and their running online softmax.
struct Heads {
    g: usize,
    hd: usize,
    /// Queries, `[span, g, hd]`.
    q: Vec<f32>,
    /// Scores of one block, `[span, g, BLOCK]`.
    sc: Vec<f32>,
    /// Unnormalised outputs, `[span, g, hd]`.
    o: Vec<f32>,
    /// Running max score per head, `[span, g]`.
    m: Vec<f32>,
    /// Running sum of `exp(score - m)` per head, `[span, g]`.
    l: Vec<f32>,
}

impl Heads {
    fn new(span: usize, g: usize, hd: usize) -> Self {
        let n = span * g;
        let z = |len| vec![0.0f32; len];
        Heads { g, hd, q: z(n * hd), sc: z(n * BLOCK), o: z(n * hd), m: z(n), l: z(n) }
    }

    fn span(&self) -> usize {
        self.m.len() / self.g
    }

    /// KV head `k`'s queries and online-softmax state.
    fn acc(&mut self, k: usize) -> (&[f32], Acc<'_>) {
        let (g, hd) = (self.g, self.hd);
        let acc = Acc {
            sc: &mut self.sc[k * g * BLOCK..(k + 1) * g * BLOCK],
            o: &mut self.o[k * g * hd..(k + 1) * g * hd],
            m: &mut self.m[k * g..(k + 1) * g],
            l: &mut self.l[k * g..(k + 1) * g],
        };
        (&self.q[k * g * hd..(k + 1) * g * hd], acc)
    }

    /// KV head `k`'s `(max, sum, output)` per query head.
    fn result(&self, k: usize) -> (&[f32], &[f32], &[f32]) {
        let (g, hd) = (self.g, self.hd);
        (&self.m[k * g..(k + 1) * g], &self.l[k * g..(k + 1) * g], &self.o[k * g * hd..][..g * hd])
    }
}

/// Running online-softmax state of one KV head's `g` query heads.
struct Acc<'a> {
    /// Scores of one block, `[g, BLOCK]`.
    sc: &'a mut [f32],
    /// Unnormalised output, `[g, hd]`.
    o: &'a mut [f32],
    /// Running max score per head.
    m: &'a mut [f32],
    /// Running sum of `exp(score - m)` per head.
    l: &'a mut [f32],
}

/// Attends each KV head of `heads` (`kv`: keys and values from the first
/// one's first element, rows `stride` apart, the next heads `hd` further)
/// over keys `range`, block by block and within a block head by head, scores
/// times `scale`. When the range is the `whole` context and one block, the
/// probabilities are normalised before the value sum (as a plain softmax
/// does) and `l` is set to 1.
#[allow(clippy::too_many_arguments)]
fn piece<E: KvElem>(
    path: Path,
    scale: f32,
    g: usize,
    hd: usize,
    kv: (&[E], &[E]),
    stride: usize,
    range: Range<usize>,
    whole: bool,
    heads: &mut Heads,
) {
    heads.m.fill(f32::NEG_INFINITY);
    heads.l.fill(0.0);
    heads.o.fill(0.0);
    let head_kv =
        |k: usize, b0: usize| (&kv.0[k * hd + b0 * stride..], &kv.1[k * hd + b0 * stride..]);
    let whole = whole && range.len() <= BLOCK;
    let mut b0 = range.start;
    while b0 < range.end {
        let n = BLOCK.min(range.end - b0);
        for k in 0..heads.span() {
            let (q, acc) = heads.acc(k);
            block(path, (q, scale), g, hd, head_kv(k, b0), stride, n, whole, acc);
        }
        b0 += n;
    }
}

/// One block of `n` keys folded into each query head's running online
/// softmax ([`tiles::softmax_step`], as prefill tiles fold theirs); `whole`:
/// the block is the whole context, normalised at once.
#[allow(clippy::too_many_arguments)]
fn block<E: KvElem>(
    path: Path,
    q: (&[f32], f32),
    g: usize,
    hd: usize,
    kv: (&[E], &[E]),
    stride: usize,
    n: usize,
    whole: bool,
    acc: Acc<'_>,
) {
    attn::scores(path, q.0, g, hd, kv.0, stride, n, acc.sc, BLOCK, q.1);
    for gi in 0..g {
        let row = &mut acc.sc[gi * BLOCK..gi * BLOCK + n];
        let o = &mut acc.o[gi * hd..(gi + 1) * hd];
        tiles::softmax_step(path, row, whole, &mut acc.m[gi], &mut acc.l[gi], o);
    }
    attn::accumulate(path, acc.sc, BLOCK, g, hd, kv.1, stride, n, acc.o);
}

/// Combines the pieces of every (token, KV head) into `attn`, in piece order
/// ([`Merged`]).
fn merge(sh: &Shape, first: &[usize], pm: &[f32], pl: &[f32], po: &[f32], attn: &mut [f32]) {
    let (hd, nq, nkv) = (sh.hd, sh.nq, sh.nkv);
    let g = nq / nkv;
    for t in 0..sh.tokens {
        let np = sh.pieces(sh.pos0 + t + 1);
        for kvh in 0..nkv {
            let i0 = first[t] + kvh * np;
            for gi in 0..g {
                let slot = |c: usize| (i0 + c) * g + gi;
                let dst = &mut attn[(t * nq + kvh * g + gi) * hd..][..hd];
                let piece = |c: usize| (pm[slot(c)], pl[slot(c)], &po[slot(c) * hd..][..hd]);
                let mut merged = Merged::first(piece(0), dst);
                for c in 1..np {
                    merged.fold(piece(c), dst);
                }
                merged.finish(dst);
            }
        }
    }
}

/// The running merge of one query row's pieces, each a partial online
/// softmax `(max, sum, unnormalised output)` over keys `p * PIECE..`, folded
/// in piece order into an output row. Decode ([`merge`]) and prefill
/// ([`tiles`]) both merge with it, so a token's output is the same bits
/// whichever call computes it, at any context length.
#[derive(Clone, Copy, Debug)]
pub(super) struct Merged {
    m: f32,
    l: f32,
}

impl Merged {
    /// Starts from the first piece: its output copied into `dst`.
    pub(super) fn first((m, l, o): (f32, f32, &[f32]), dst: &mut [f32]) -> Merged {
        dst.copy_from_slice(o);
        Merged { m, l }
    }

    /// Folds the next piece into `dst`.
    pub(super) fn fold(&mut self, (m, l, o): (f32, f32, &[f32]), dst: &mut [f32]) {
        let mx = if m > self.m { m } else { self.m };
        let (a, b) = (exp(self.m - mx), exp(m - mx));
        self.l = self.l * a + l * b;
        dst.iter_mut().zip(o).for_each(|(d, s)| *d = *d * a + s * b);
        self.m = mx;
    }

    /// Normalises `dst`.
    pub(super) fn finish(self, dst: &mut [f32]) {
        let inv = 1.0 / self.l;
        dst.iter_mut().for_each(|d| *d *= inv);
    }
}
