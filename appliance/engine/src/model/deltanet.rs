//! Gated DeltaNet (linear attention) layer: projections, causal depthwise
//! conv with a rolling window, L2-normalised q/k, the gated delta rule on an
//! f32 per-value-head state, the gated RMSNorm and the output projection.
//! The rule runs token by token (decode, short batches, and whenever the
//! state after every token is checkpointed for speculative verification) or,
//! when chosen for long enough prompts (`Model::deltanet_chunked_min`), in the
//! chunked form of [`chunked`] (measured slower here, so off by default).

mod batch;
mod chunked;

pub(crate) use batch::SeqState;

use alloc::vec;
use alloc::vec::Vec;

use crate::config::ModelConfig;
use crate::kernels::{delta_step_with, silu_in_place, DeltaToken, Exec, Product};
use crate::ops::{l2_norm, rms_norm_gated, sigmoid, softplus};
use crate::pool::{split, SharedMut};
use crate::simd::Path;
use crate::tensor::TensorSource;
use crate::weights::{Linear, WeightError, WeightLoader};

/// Weights of one Gated DeltaNet layer.
#[derive(Debug)]
pub struct DeltaNet<'a> {
    /// `[2*key_dim + value_dim, hidden]`: q | k | v before the conv.
    pub in_proj_qkv: Linear<'a>,
    /// `[value_dim, hidden]`: output gate of the norm.
    pub in_proj_z: Linear<'a>,
    /// `[value_heads, hidden]`: beta (write strength) logits.
    pub in_proj_b: Linear<'a>,
    /// `[value_heads, hidden]`: decay logits.
    pub in_proj_a: Linear<'a>,
    /// `[hidden, value_dim]`.
    pub out_proj: Linear<'a>,
    /// Conv taps `[conv_dim, kernel]`; tap `kernel-1` multiplies the current input.
    pub conv: Vec<f32>,
    /// `-exp(A_log)` per value head.
    pub neg_a: Vec<f32>,
    /// `dt_bias` per value head.
    pub dt_bias: Vec<f32>,
    /// Gated RMSNorm weight `[value_head_dim]`.
    pub norm: Vec<f32>,
}

impl<'a> DeltaNet<'a> {
    /// Loads `<prefix>.linear_attn.*`.
    pub fn load<S: TensorSource + ?Sized>(
        w: &WeightLoader<'a, S>,
        cfg: &ModelConfig,
        p: &str,
    ) -> Result<Self, WeightError> {
        let (h, kd, vd, hv) = (
            cfg.hidden_size,
            cfg.linear_key_dim(),
            cfg.linear_value_dim(),
            cfg.linear_num_value_heads,
        );
        let cd = cfg.linear_conv_dim();
        let a_log = w.vector(&alloc::format!("{p}.A_log"), hv)?;
        Ok(DeltaNet {
            in_proj_qkv: w.linear(&alloc::format!("{p}.in_proj_qkv"), 2 * kd + vd, h)?,
            in_proj_z: w.linear(&alloc::format!("{p}.in_proj_z"), vd, h)?,
            in_proj_b: w.linear(&alloc::format!("{p}.in_proj_b"), hv, h)?,
            in_proj_a: w.linear(&alloc::format!("{p}.in_proj_a"), hv, h)?,
            out_proj: w.linear(&alloc::format!("{p}.out_proj"), h, vd)?,
            conv: w.conv(&alloc::format!("{p}.conv1d.weight"), cd, cfg.linear_conv_kernel_dim)?,
            neg_a: a_log.iter().map(|a| -libm::expf(*a)).collect(),
            dt_bias: w.vector(&alloc::format!("{p}.dt_bias"), hv)?,
            norm: w.vector(&alloc::format!("{p}.norm.weight"), cfg.linear_value_head_dim)?,
        })
    }

    /// Runs `tokens` rows of `x` (`[T, hidden]`, already input-normed) through
    /// the layer, updating `conv_state` and `recurrent`; returns `[T, hidden]`.
    /// With `ckpt`, appends `conv_state ++ recurrent` to it after every token
    /// (speculative decoding rewinds to any of them); without, forwards of at
    /// least `chunked_min` tokens take the chunked form.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_checkpointed(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        chunked_min: usize,
        x: &[f32],
        tokens: usize,
        conv_state: &mut [f32],
        recurrent: &mut [f32],
        ckpt: Option<&mut Vec<f32>>,
    ) -> Vec<f32> {
        let mut p = self.project(cfg, ex, x, tokens);
        let core = match ckpt {
            // Without checkpoints the conv and gates run per key head across
            // the pool ([`DeltaNet::mix_batch`], the same f32 steps), not on
            // the caller alone.
            None => {
                let mut one = [SeqState { conv: conv_state, recurrent, rows: 0..tokens }];
                self.mix_batch(cfg, ex, chunked_min, &mut p, &mut one)
            }
            Some(c) => {
                self.mix_checkpointed(cfg, ex, p.rows_mut(0..tokens), conv_state, recurrent, c)
            }
        };
        let mut y = vec![0.0; tokens * cfg.hidden_size];
        ex.matmul(&self.out_proj, &core, tokens, &mut y);
        y
    }

    /// The input projections of `tokens` rows of `x` (`[T, hidden]`), in one
    /// pass over the weights (rows of several sequences may share it).
    pub(crate) fn project(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        x: &[f32],
        tokens: usize,
    ) -> Projected {
        let (vd, cd) = (cfg.linear_value_dim(), cfg.linear_conv_dim());
        let hv = cfg.linear_num_value_heads;
        let mut p = Projected {
            qkv: vec![0.0; tokens * cd],
            z: vec![0.0; tokens * vd],
            b: vec![0.0; tokens * hv],
            a: vec![0.0; tokens * hv],
            dims: (cd, vd, hv),
        };
        ex.matmuls(
            tokens,
            &mut [
                Product::new(&self.in_proj_qkv, x, &mut p.qkv),
                Product::new(&self.in_proj_z, x, &mut p.z),
                Product::new(&self.in_proj_b, x, &mut p.b),
                Product::new(&self.in_proj_a, x, &mut p.a),
            ],
        );
        p
    }

    /// Conv, gates and the delta rule over one sequence's projected rows
    /// (`p`), updating its `conv_state` and `recurrent` state and recording
    /// them after every token into `ckpt` (speculative verification; without
    /// checkpoints forwards take [`DeltaNet::mix_batch`]); returns the normed,
    /// gated core output `[T, value_dim]` (input of `out_proj`).
    pub(crate) fn mix_checkpointed(
        &self,
        cfg: &ModelConfig,
        ex: Exec<'_>,
        p: ProjRows<'_>,
        conv_state: &mut [f32],
        recurrent: &mut [f32],
        ckpt: &mut Vec<f32>,
    ) -> Vec<f32> {
        let (kd, vd, cd) = (cfg.linear_key_dim(), cfg.linear_value_dim(), cfg.linear_conv_dim());
        let hv = cfg.linear_num_value_heads;
        let ProjRows { qkv, z, b, a, tokens } = p;
        // Conv, q/k normalisation and the per-head gates, token by token
        // (the conv window rolls); the window after token t is checkpointed.
        let (conv_len, rec_len) = (conv_state.len(), recurrent.len());
        let stride = conv_len + rec_len;
        let base = ckpt.len();
        ckpt.resize(base + tokens * stride, 0.0);
        let mut decay = vec![0.0; tokens * hv]; // [T, Hv]: exp(g)
        for t in 0..tokens {
            let row = &mut qkv[t * cd..(t + 1) * cd];
            self.conv_step(cfg, ex.path, row, conv_state);
            let (q, rest) = row.split_at_mut(kd);
            self.normalize_qk(cfg, q, &mut rest[..kd]);
            for h in 0..hv {
                let (at, bt) = (&mut a[t * hv + h], &mut b[t * hv + h]);
                decay[t * hv + h] = libm::expf(self.neg_a[h] * softplus(*at + self.dt_bias[h]));
                *bt = sigmoid(*bt);
            }
            let at = base + t * stride;
            ckpt[at..at + conv_len].copy_from_slice(conv_state);
        }

        // The rule: value heads are independent, so workers take whole heads
        // and run every token through them (a head's state stays in cache).
        let mut core = vec![0.0; tokens * vd]; // [T, value_dim]
        let seq = Seq { qkv, z, beta: b, decay: &decay, tokens };
        let ck = Some(SharedMut::new(&mut ckpt[base..]));
        let (st, out) = (SharedMut::new(recurrent), SharedMut::new(&mut core));
        let heads = |w: usize, n: usize| {
            let (st, out, ck) = (st, out, ck);
            for h in split(hv, w, n, 1) {
                // SAFETY: head h's state, its output columns and its checkpoint
                // slices are touched by this worker only (heads split disjointly);
                // all buffers outlive `pool.run`.
                unsafe { self.head(cfg, ex.path, h, &seq, st, out, ck, conv_len) };
            }
        };
        if tokens * hv * cfg.linear_key_head_dim * cfg.linear_value_head_dim < 1 << 16 {
            heads(0, 1);
        } else {
            ex.pool.run(&heads);
        }
        core
    }

    /// Every token through value head `h`: the delta rule on its state, then
    /// the gated norm of its output; records the state after each token.
    ///
    /// # Safety
    /// No other thread may touch head `h`'s slices of `st` (`[Hv, dk, dv]`),
    /// `out` (`[T, value_dim]`) or the checkpoint (`[T, conv_len + Hv*dk*dv]`)
    /// during the call; the buffers must have those sizes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn head(
        &self,
        cfg: &ModelConfig,
        path: Path,
        h: usize,
        seq: &Seq<'_>,
        st: SharedMut,
        out: SharedMut,
        ck: Option<SharedMut>,
        conv_len: usize,
    ) {
        let (dk, dv, hv) =
            (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_num_value_heads);
        let (kd, vd, cd) = (cfg.linear_key_dim(), cfg.linear_value_dim(), cfg.linear_conv_dim());
        let kh = h / (hv / cfg.linear_num_key_heads); // repeat_interleave: value head h reads key head h / group
        let stride = conv_len + hv * dk * dv;
        // SAFETY: per the contract, head h's state slice is ours alone.
        let s = unsafe { st.slice(h * dk * dv, dk * dv) };
        let mut u = vec![0.0; dv];
        for t in 0..seq.tokens {
            let row = &seq.qkv[t * cd..(t + 1) * cd];
            let tok = DeltaToken {
                q: &row[kh * dk..(kh + 1) * dk],
                k: &row[kd + kh * dk..kd + (kh + 1) * dk],
                v: &row[2 * kd + h * dv..2 * kd + (h + 1) * dv],
                g: seq.decay[t * hv + h],
                beta: seq.beta[t * hv + h],
            };
            // SAFETY: output columns h*dv.. of token t are ours alone.
            let o = unsafe { out.slice(t * vd + h * dv, dv) };
            delta_step_with(path, s, &tok, &mut u, o);
            let z = &seq.z[t * vd + h * dv..t * vd + (h + 1) * dv];
            rms_norm_gated(path, o, z, &self.norm, cfg.rms_norm_eps);
            if let Some(ck) = ck {
                // SAFETY: head h's part of token t's checkpoint is ours alone.
                let dst = unsafe { ck.slice(t * stride + conv_len + h * dk * dv, dk * dv) };
                dst.copy_from_slice(s);
            }
        }
    }

    /// [`DeltaNet::head`] in the chunked form (no checkpoints).
    ///
    /// # Safety
    /// As [`DeltaNet::head`].
    unsafe fn head_chunked(
        &self,
        cfg: &ModelConfig,
        path: Path,
        h: usize,
        seq: &Seq<'_>,
        st: SharedMut,
        out: SharedMut,
    ) {
        let (dk, dv, hv) =
            (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_num_value_heads);
        let (kd, vd, cd) = (cfg.linear_key_dim(), cfg.linear_value_dim(), cfg.linear_conv_dim());
        let kh = h / (hv / cfg.linear_num_key_heads);
        let hs = chunked::HeadSeq {
            rows: seq.qkv,
            stride: cd,
            q: kh * dk,
            k: kd + kh * dk,
            v: 2 * kd + h * dv,
            decay: seq.decay,
            beta: seq.beta,
            gb_stride: hv,
            gb: h,
            tokens: seq.tokens,
            dk,
            dv,
        };
        // SAFETY: per the contract, head h's state slice is ours alone.
        let s = unsafe { st.slice(h * dk * dv, dk * dv) };
        chunked::run_head(path, &hs, s, |t, o| {
            let z = &seq.z[t * vd + h * dv..t * vd + (h + 1) * dv];
            rms_norm_gated(path, o, z, &self.norm, cfg.rms_norm_eps);
            // SAFETY: output columns h*dv.. of token t are ours alone.
            let dst = unsafe { out.slice(t * vd + h * dv, dv) };
            dst.copy_from_slice(o);
        });
    }

    /// Causal depthwise conv + SiLU for one token, in place on `row`
    /// (`[conv_dim]`), rolling the `[kernel-1, conv_dim]` window.
    fn conv_step(&self, cfg: &ModelConfig, path: Path, row: &mut [f32], window: &mut [f32]) {
        let (cd, k) = (cfg.linear_conv_dim(), cfg.linear_conv_kernel_dim);
        let mut out = vec![0.0; cd];
        for (c, o) in out.iter_mut().enumerate() {
            let taps = &self.conv[c * k..(c + 1) * k];
            let mut acc = taps[k - 1] * row[c];
            for j in 0..k - 1 {
                acc += taps[j] * window[j * cd + c];
            }
            *o = acc;
        }
        silu_in_place(path, &mut out);
        if k > 1 {
            window.copy_within(cd.., 0);
            window[(k - 2) * cd..].copy_from_slice(row);
        }
        row.copy_from_slice(&out);
    }

    /// L2-normalises each key head of q and k; scales q by 1/sqrt(key_head_dim).
    fn normalize_qk(&self, cfg: &ModelConfig, q: &mut [f32], k: &mut [f32]) {
        let dk = cfg.linear_key_head_dim;
        let scale = 1.0 / libm::sqrtf(dk as f32);
        for (qh, kh) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)) {
            l2_norm(qh, 1e-6);
            l2_norm(kh, 1e-6);
            qh.iter_mut().for_each(|v| *v *= scale);
        }
    }
}

/// The input projections of some rows (`[T, ·]` each).
pub(crate) struct Projected {
    qkv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    /// Row widths: conv_dim, value_dim, value heads.
    dims: (usize, usize, usize),
}

impl Projected {
    /// Rows `r` (one sequence's tokens), mutable.
    pub(crate) fn rows_mut(&mut self, r: core::ops::Range<usize>) -> ProjRows<'_> {
        let (cd, vd, hv) = self.dims;
        ProjRows {
            qkv: &mut self.qkv[r.start * cd..r.end * cd],
            z: &self.z[r.start * vd..r.end * vd],
            b: &mut self.b[r.start * hv..r.end * hv],
            a: &mut self.a[r.start * hv..r.end * hv],
            tokens: r.len(),
        }
    }
}

/// One sequence's rows of [`Projected`].
pub(crate) struct ProjRows<'p> {
    qkv: &'p mut [f32],
    z: &'p [f32],
    b: &'p mut [f32],
    a: &'p mut [f32],
    tokens: usize,
}

/// A layer's per-token inputs to the rule, after the conv and the gates.
struct Seq<'s> {
    /// `[T, conv_dim]`: q | k | v, normalised.
    qkv: &'s [f32],
    /// `[T, value_dim]`: the norm's gate.
    z: &'s [f32],
    /// `[T, Hv]`: write strengths.
    beta: &'s [f32],
    /// `[T, Hv]`: `exp(g)`.
    decay: &'s [f32],
    tokens: usize,
}
