//! DeltaNet mixing of several sequences' rows in two pool runs per layer
//! (for [`crate::Model::forward_batch`]), instead of one serial conv and one
//! pool run per sequence:
//!
//! ```text
//! run 1, items (sequence, key head): conv + SiLU of the head's q, k and its
//!        value heads' v channels (each channel's window rolls on its own),
//!        q/k L2 norm, the value heads' decay and beta, token by token
//! run 2, items (sequence, value head): the delta rule and the gated norm
//!        (`DeltaNet::head`, or `head_chunked` from the model's
//!        `deltanet_chunked_min` tokens, as for one sequence)
//! ```
//!
//! Every element goes through the same f32 steps in the same order as in
//! [`DeltaNet::mix_checkpointed`] (the verify path), so a sequence's output is
//! bit-identical batched, alone or checkpointed.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use super::{DeltaNet, Projected, Seq};
use crate::config::ModelConfig;
use crate::kernels::{silu_in_place, Exec};
use crate::ops::{sigmoid, softplus};
use crate::pool::{split, SharedMut};
use crate::simd::Path;

/// One sequence's recurrent state in a batched mix.
pub(crate) struct SeqState<'s> {
    /// `[kernel - 1, conv_dim]`: the conv window.
    pub conv: &'s mut [f32],
    /// `[Hv, dk, dv]`: the delta-rule state.
    pub recurrent: &'s mut [f32],
    /// The sequence's rows of the projections.
    pub rows: Range<usize>,
}

/// Raw views of one sequence's buffers that the workers of a pool run touch
/// in disjoint parts.
#[derive(Clone, Copy)]
struct Shared {
    conv: SharedMut,
    recurrent: SharedMut,
    out: SharedMut,
}

impl DeltaNet<'_> {
    /// Conv, gates and the delta rule over the rows of every sequence in `p`
    /// (sequence `j` owns rows `seqs[j].rows`, in order and disjoint),
    /// updating their states; returns the normed, gated core output
    /// `[T, value_dim]` of all rows. A sequence of at least `chunked_min`
    /// rows takes the chunked form.
    pub(crate) fn mix_batch(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        chunked_min: usize,
        p: &mut Projected,
        seqs: &mut [SeqState<'_>],
    ) -> Vec<f32> {
        let (dk, dv, vd) =
            (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_value_dim());
        let (hk, hv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads);
        let tokens = p.qkv.len() / cfg.linear_conv_dim();
        debug_assert!(seqs.iter().all(|s| s.rows.end <= tokens));
        let mut decay = vec![0.0; tokens * hv];
        let mut core = vec![0.0; tokens * vd];
        let out = SharedMut::new(&mut core);
        let shared: Vec<Shared> = seqs
            .iter_mut()
            .map(|s| Shared {
                conv: SharedMut::new(s.conv),
                recurrent: SharedMut::new(s.recurrent),
                // SAFETY (of the later uses): rows of different sequences are disjoint.
                out,
            })
            .collect();
        let rows: Vec<Range<usize>> = seqs.iter().map(|s| s.rows.clone()).collect();
        let serial = tokens * hv * dk * dv < 1 << 16;
        let run = |f: &(dyn Fn(usize, usize) + Sync)| if serial { f(0, 1) } else { ex.pool.run(f) };

        let (qkv, b, dec) =
            (SharedMut::new(&mut p.qkv), SharedMut::new(&mut p.b), SharedMut::new(&mut decay));
        let a = &p.a;
        let items = rows.len() * hk;
        run(&|w, n| {
            for i in split(items, w, n, 1) {
                let (j, kh) = (i / hk, i % hk);
                // SAFETY: item (j, kh) touches only key head kh's channels and
                // value heads of sequence j's rows and window; items are
                // handed to one worker each; the buffers outlive the run.
                unsafe {
                    let bufs = (qkv, b, dec);
                    self.prepare_key_head(cfg, ex.path, kh, rows[j].clone(), shared[j], bufs, a)
                };
            }
        });

        let z = &p.z;
        let (qkv, beta, decay) = (&p.qkv[..], &p.b[..], &decay[..]);
        let (cd, items) = (cfg.linear_conv_dim(), rows.len() * hv);
        run(&|w, n| {
            for i in split(items, w, n, 1) {
                let (j, h) = (i / hv, i % hv);
                let r = rows[j].clone();
                let seq = Seq {
                    qkv: &qkv[r.start * cd..r.end * cd],
                    z: &z[r.start * vd..r.end * vd],
                    beta: &beta[r.start * hv..r.end * hv],
                    decay: &decay[r.start * hv..r.end * hv],
                    tokens: r.len(),
                };
                // A long enough prefill chunk takes the chunked form.
                // SAFETY: head h of sequence j: its state slice and its output
                // columns of rows r are this item's alone (`out` is offset to
                // row r.start); the buffers outlive the run.
                unsafe {
                    let o = shared[j].out.offset(r.start * vd);
                    if r.len() >= chunked_min {
                        self.head_chunked(cfg, ex.path, h, &seq, shared[j].recurrent, o);
                    } else {
                        self.head(cfg, ex.path, h, &seq, shared[j].recurrent, o, None, 0);
                    }
                }
            }
        });
        core
    }

    /// Run 1 of [`DeltaNet::mix_batch`] for key head `kh` of one sequence
    /// (rows `r`): its conv channels token by token, the q/k norms, and the
    /// decay and beta of its value heads.
    ///
    /// # Safety
    /// No other thread touches key head `kh`'s q/k channels, its value heads'
    /// v channels (of rows `r` of `qkv` and of the window in `s.conv`), or
    /// its value heads' entries of `b` and `decay` in rows `r`; the buffers
    /// have the layer's shapes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn prepare_key_head(
        &self,
        cfg: &ModelConfig,
        path: Path,
        kh: usize,
        r: Range<usize>,
        s: Shared,
        (qkv, b, decay): (SharedMut, SharedMut, SharedMut),
        a: &[f32],
    ) {
        let (dk, dv, kd) =
            (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_key_dim());
        let (cd, hv) = (cfg.linear_conv_dim(), cfg.linear_num_value_heads);
        let group = hv / cfg.linear_num_key_heads;
        let heads = kh * group..(kh + 1) * group;
        let chans = [kh * dk..(kh + 1) * dk, kd + kh * dk..kd + (kh + 1) * dk];
        let vchans = 2 * kd + heads.start * dv..2 * kd + heads.end * dv;
        let scale = 1.0 / libm::sqrtf(dk as f32);
        for t in r {
            for c in chans.iter().chain(core::iter::once(&vchans)) {
                // SAFETY: these channels of row t and of the window are ours.
                unsafe { self.conv_channels(cfg, path, qkv.offset(t * cd), s.conv, c.clone()) };
            }
            // SAFETY: as above, key head kh's q and k of row t.
            let (q, k) = unsafe {
                (qkv.slice(t * cd + chans[0].start, dk), qkv.slice(t * cd + chans[1].start, dk))
            };
            crate::ops::l2_norm(q, 1e-6);
            crate::ops::l2_norm(k, 1e-6);
            q.iter_mut().for_each(|v| *v *= scale);
            for h in heads.clone() {
                let i = t * hv + h;
                // SAFETY: value head h's gates of row t are ours.
                unsafe {
                    decay.slice(i, 1)[0] =
                        libm::expf(self.neg_a[h] * softplus(a[i] + self.dt_bias[h]));
                    let bt = b.slice(i, 1);
                    bt[0] = sigmoid(bt[0]);
                }
            }
        }
    }

    /// Causal conv + SiLU of channels `chans` of one token's `row`
    /// (`[conv_dim]`), rolling those channels of the window: the same steps
    /// as `DeltaNet::conv_step` per channel.
    ///
    /// # Safety
    /// `row` points at a `[conv_dim]` row, `window` at `[kernel - 1,
    /// conv_dim]`; no other thread touches channels `chans` of either.
    unsafe fn conv_channels(
        &self,
        cfg: &ModelConfig,
        path: Path,
        row: SharedMut,
        window: SharedMut,
        chans: Range<usize>,
    ) {
        let (cd, k) = (cfg.linear_conv_dim(), cfg.linear_conv_kernel_dim);
        debug_assert!(chans.end <= cd && k >= 1);
        let (c0, len) = (chans.start, chans.len());
        // SAFETY: channels `chans` of the row and of each window row are ours.
        let (x, mut win): (&mut [f32], Vec<&mut [f32]>) = unsafe {
            (row.slice(c0, len), (0..k - 1).map(|j| window.slice(j * cd + c0, len)).collect())
        };
        for (i, x) in x.iter_mut().enumerate() {
            let taps = &self.conv[(c0 + i) * k..(c0 + i + 1) * k];
            let mut acc = taps[k - 1] * *x;
            for (tap, w) in taps.iter().zip(&win) {
                acc += tap * w[i];
            }
            for j in 1..win.len() {
                win[j - 1][i] = win[j][i];
            }
            if let Some(last) = win.last_mut() {
                last[i] = *x;
            }
            *x = acc;
        }
        silu_in_place(path, x);
    }
}
