//! Gated full attention: q_proj yields a query and an output gate per head,
//! per-head (1+w) q_norm/k_norm, partial rotate-half RoPE, grouped-query
//! attention over the KV cache, `o_proj(attn * sigmoid(gate))`.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use crate::config::ModelConfig;
use crate::kernels::{dot, matmul_on, matmuls_on, Product};
use crate::ops::{rms_norm_1p, rope, sigmoid, softmax};
use crate::pool::Parallel;
use crate::tensor::TensorSource;
use crate::weights::{Linear, WeightError, WeightLoader};

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
        pool: &dyn Parallel,
        inv_freq: &[f32],
        x: &[f32],
        tokens: usize,
        pos0: usize,
        k_cache: &mut Vec<f32>,
        v_cache: &mut Vec<f32>,
    ) -> Vec<f32> {
        let (hd, nq, nkv) = (cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
        let mut qg = vec![0.0; tokens * nq * hd * 2]; // [T, nq, 2, hd]: query | gate per head
        let mut k = vec![0.0; tokens * nkv * hd]; // [T, nkv, hd]
        let mut v = vec![0.0; tokens * nkv * hd]; // [T, nkv, hd]
        matmuls_on(
            pool,
            tokens,
            &mut [
                Product::new(&self.q_proj, x, &mut qg),
                Product::new(&self.k_proj, x, &mut k),
                Product::new(&self.v_proj, x, &mut v),
            ],
        );
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
        k_cache.extend_from_slice(&k);
        v_cache.extend_from_slice(&v);

        let mut attn = vec![0.0; tokens * nq * hd]; // [T, nq, hd]
        let scale = 1.0 / libm::sqrtf(hd as f32);
        let group = nq / nkv;
        let mut scores = Vec::new();
        for t in 0..tokens {
            let len = pos0 + t + 1; // causal: keys 0..=pos
            for h in 0..nq {
                let q = &qg[(t * nq + h) * 2 * hd..(t * nq + h) * 2 * hd + hd];
                let gate = &qg[(t * nq + h) * 2 * hd + hd..(t * nq + h + 1) * 2 * hd];
                let kvh = h / group;
                scores.clear();
                scores.extend((0..len).map(|s| {
                    dot(q, &k_cache[(s * nkv + kvh) * hd..(s * nkv + kvh + 1) * hd]) * scale
                }));
                softmax(&mut scores);
                let out = &mut attn[(t * nq + h) * hd..(t * nq + h + 1) * hd];
                for (s, p) in scores.iter().enumerate() {
                    let vs = &v_cache[(s * nkv + kvh) * hd..(s * nkv + kvh + 1) * hd];
                    for (o, vv) in out.iter_mut().zip(vs) {
                        *o += p * vv;
                    }
                }
                for (o, g) in out.iter_mut().zip(gate) {
                    *o *= sigmoid(*g);
                }
            }
        }
        let mut y = vec![0.0; tokens * cfg.hidden_size];
        matmul_on(pool, &self.o_proj, &attn, tokens, &mut y);
        y
    }
}
