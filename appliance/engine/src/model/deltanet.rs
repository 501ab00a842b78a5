//! Gated DeltaNet (linear attention) layer: projections, causal depthwise
//! conv with a rolling window, L2-normalised q/k, the gated delta rule on an
//! f32 per-value-head state, the gated RMSNorm and the output projection.

use alloc::vec;
use alloc::vec::Vec;

use crate::config::ModelConfig;
use crate::kernels::matmul_on;
use crate::ops::{l2_norm, rms_norm_gated, sigmoid, silu, softplus};
use crate::pool::Parallel;
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
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        pool: &dyn Parallel,
        x: &[f32],
        tokens: usize,
        conv_state: &mut [f32],
        recurrent: &mut [f32],
    ) -> Vec<f32> {
        self.forward_checkpointed(cfg, pool, x, tokens, conv_state, recurrent, None)
    }

    /// [`DeltaNet::forward`] that appends `conv_state ++ recurrent` to `ckpt`
    /// after every token (speculative decoding rewinds to any of them).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_checkpointed(
        &self,
        cfg: &ModelConfig,
        pool: &dyn Parallel,
        x: &[f32],
        tokens: usize,
        conv_state: &mut [f32],
        recurrent: &mut [f32],
        mut ckpt: Option<&mut Vec<f32>>,
    ) -> Vec<f32> {
        let (kd, vd, cd) = (cfg.linear_key_dim(), cfg.linear_value_dim(), cfg.linear_conv_dim());
        let hv = cfg.linear_num_value_heads;
        let mut qkv = vec![0.0; tokens * cd]; // [T, conv_dim]
        let mut z = vec![0.0; tokens * vd]; // [T, value_dim]
        let mut b = vec![0.0; tokens * hv]; // [T, Hv]
        let mut a = vec![0.0; tokens * hv]; // [T, Hv]
        matmul_on(pool, &self.in_proj_qkv, x, tokens, &mut qkv);
        matmul_on(pool, &self.in_proj_z, x, tokens, &mut z);
        matmul_on(pool, &self.in_proj_b, x, tokens, &mut b);
        matmul_on(pool, &self.in_proj_a, x, tokens, &mut a);

        let mut core = vec![0.0; tokens * vd]; // [T, value_dim]
        for t in 0..tokens {
            let row = &mut qkv[t * cd..(t + 1) * cd];
            self.conv_step(cfg, row, conv_state);
            let (q, rest) = row.split_at_mut(kd);
            let (k, v) = rest.split_at_mut(kd);
            self.normalize_qk(cfg, q, k);
            let out = &mut core[t * vd..(t + 1) * vd];
            self.delta_rule(
                cfg,
                q,
                k,
                v,
                &b[t * hv..(t + 1) * hv],
                &a[t * hv..(t + 1) * hv],
                recurrent,
                out,
            );
            for (o, zz) in out
                .chunks_exact_mut(cfg.linear_value_head_dim)
                .zip(z[t * vd..].chunks_exact(cfg.linear_value_head_dim))
            {
                rms_norm_gated(o, zz, &self.norm, cfg.rms_norm_eps);
            }
            if let Some(c) = ckpt.as_deref_mut() {
                c.extend_from_slice(conv_state);
                c.extend_from_slice(recurrent);
            }
        }
        let mut y = vec![0.0; tokens * cfg.hidden_size];
        matmul_on(pool, &self.out_proj, &core, tokens, &mut y);
        y
    }

    /// Causal depthwise conv + SiLU for one token, in place on `row`
    /// (`[conv_dim]`), rolling the `[kernel-1, conv_dim]` window.
    fn conv_step(&self, cfg: &ModelConfig, row: &mut [f32], window: &mut [f32]) {
        let (cd, k) = (cfg.linear_conv_dim(), cfg.linear_conv_kernel_dim);
        let mut out = vec![0.0; cd];
        for (c, o) in out.iter_mut().enumerate() {
            let taps = &self.conv[c * k..(c + 1) * k];
            let mut acc = taps[k - 1] * row[c];
            for j in 0..k - 1 {
                acc += taps[j] * window[j * cd + c];
            }
            *o = silu(acc);
        }
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

    /// The gated delta rule for one token on every value head:
    /// `S *= exp(g); d = beta (v - S^T k); S += k d^T; o = S^T q`.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule(
        &self,
        cfg: &ModelConfig,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        b: &[f32],
        a: &[f32],
        state: &mut [f32],
        out: &mut [f32],
    ) {
        let (dk, dv) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim);
        let group = cfg.linear_num_value_heads / cfg.linear_num_key_heads;
        let mut delta = vec![0.0; dv];
        for h in 0..cfg.linear_num_value_heads {
            let kh = h / group; // repeat_interleave: value head h reads key head h / group
            let (qh, khv) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
            let vh = &v[h * dv..(h + 1) * dv];
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv]; // [dk, dv]
            let decay = libm::expf(self.neg_a[h] * softplus(a[h] + self.dt_bias[h]));
            let beta = sigmoid(b[h]);
            s.iter_mut().for_each(|x| *x *= decay);
            // delta = beta * (v - S^T k)
            delta.copy_from_slice(vh);
            for (i, &ki) in khv.iter().enumerate() {
                for (d, sv) in delta.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                    *d -= sv * ki;
                }
            }
            delta.iter_mut().for_each(|d| *d *= beta);
            // S += k delta^T
            for (i, &ki) in khv.iter().enumerate() {
                for (sv, d) in s[i * dv..(i + 1) * dv].iter_mut().zip(&delta) {
                    *sv += ki * d;
                }
            }
            // o = S^T q
            let o = &mut out[h * dv..(h + 1) * dv];
            o.fill(0.0);
            for (i, &qi) in qh.iter().enumerate() {
                for (ov, sv) in o.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                    *ov += sv * qi;
                }
            }
        }
    }
}
