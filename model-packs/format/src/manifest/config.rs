//! The `[config]` section of pack.toml (Qwen3.5 text models, dense or with
//! `[config.moe]` mixture-of-experts MLPs), its one mapping to and from the
//! engine's [`ModelConfig`], and the tensor list it implies.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use super::ManifestError;
use crate::config::{JsonConfig, LayerKind, ModelConfig, MoeConfig};

/// The architecture name recorded in pack.toml for a dense model.
pub const ARCHITECTURE: &str = "qwen3_5_text";

/// The architecture name recorded in pack.toml for a mixture-of-experts model.
pub const ARCHITECTURE_MOE: &str = "qwen3_5_moe_text";

/// Token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Gated DeltaNet.
    LinearAttention,
    /// Gated full attention.
    FullAttention,
}

/// The `[config]` section: everything needed to rebuild the engine's
/// [`ModelConfig`] ([`PackConfig::to_model`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackConfig {
    /// Vocabulary (embedding rows).
    pub vocab_size: u64,
    /// Residual width.
    pub hidden_size: u64,
    /// MLP width.
    pub intermediate_size: u64,
    /// Decoder layers (without the MTP layers).
    pub num_hidden_layers: u64,
    /// Per-layer mixer.
    pub layer_types: Vec<LayerType>,
    /// Query heads of full attention.
    pub num_attention_heads: u64,
    /// Key/value heads of full attention.
    pub num_key_value_heads: u64,
    /// Full-attention head size.
    pub head_dim: u64,
    /// Whether q_proj also produces a sigmoid output gate per head.
    pub attn_output_gate: bool,
    /// DeltaNet key heads.
    pub linear_num_key_heads: u64,
    /// DeltaNet value heads.
    pub linear_num_value_heads: u64,
    /// DeltaNet key head size.
    pub linear_key_head_dim: u64,
    /// DeltaNet value head size.
    pub linear_value_head_dim: u64,
    /// DeltaNet causal conv kernel.
    pub linear_conv_kernel_dim: u64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Fraction of head_dim that is rotated.
    pub partial_rotary_factor: f64,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// MTP layers present in the pack (0 = no MTP head).
    pub mtp_num_hidden_layers: u64,
    /// Trained context length.
    pub max_position_embeddings: u64,
    /// End-of-sequence token ids.
    #[serde(default)]
    pub eos_token_ids: Vec<u64>,
    /// `[config.moe]`: every layer's MLP (and the MTP layer's) is a mixture of
    /// experts; absent for dense models. Then `intermediate_size` equals
    /// `moe.moe_intermediate_size` and no dense MLP exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<PackMoe>,
}

/// `[config.moe]` of pack.toml (Hugging Face's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackMoe {
    /// Routed experts per layer.
    pub num_experts: u64,
    /// Experts each token is routed to.
    pub num_experts_per_tok: u64,
    /// Inner width of a routed expert.
    pub moe_intermediate_size: u64,
    /// Inner width of the shared expert.
    pub shared_expert_intermediate_size: u64,
}

/// Which family of Linear a weight belongs to (quantization is chosen per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinearGroup {
    /// gate_proj, up_proj, down_proj of a dense MLP or of an MoE layer's
    /// shared expert (trunk and MTP).
    Mlp,
    /// q/k/v/o_proj of full attention (trunk and MTP).
    Attention,
    /// DeltaNet in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, out_proj.
    LinearAttention,
    /// The output head.
    LmHead,
    /// The MTP input projection `mtp.fc`.
    MtpFc,
    /// The routed experts' gate_proj, up_proj, down_proj (MoE models).
    Experts,
    /// The MoE router `mlp.gate` and the shared expert's gate
    /// `mlp.shared_expert_gate` (never quantized by default: they pick the experts).
    Router,
}

impl LinearGroup {
    /// The spelling used on the command line and in docs.
    pub fn as_str(self) -> &'static str {
        match self {
            LinearGroup::Mlp => "mlp",
            LinearGroup::Attention => "attention",
            LinearGroup::LinearAttention => "linear-attention",
            LinearGroup::LmHead => "lm-head",
            LinearGroup::MtpFc => "mtp-fc",
            LinearGroup::Experts => "experts",
            LinearGroup::Router => "router",
        }
    }

    /// Every group.
    pub const ALL: [LinearGroup; 7] = [
        Self::Mlp,
        Self::Attention,
        Self::LinearAttention,
        Self::LmHead,
        Self::MtpFc,
        Self::Experts,
        Self::Router,
    ];

    /// Parses [`as_str`](Self::as_str) spellings.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

/// What kind of tensor an expected entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A Linear weight `[out, in]`, quantizable.
    Linear(LinearGroup),
    /// The token embedding.
    Embedding,
    /// An RMSNorm weight.
    Norm,
    /// The DeltaNet depthwise conv weight `[C, 1, k]`.
    Conv,
    /// A per-head parameter (A_log, dt_bias).
    Param,
}

/// One tensor the configuration requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    /// Full name (`model.layers.0.mlp.gate_proj.weight`...).
    pub name: String,
    /// Logical shape (for a quantized Linear, the unquantized `[out, in]`).
    pub shape: Vec<u64>,
    /// Kind.
    pub kind: TensorKind,
}

impl ExpectedTensor {
    /// For a Linear, the module name (the name without `.weight`).
    pub fn module(&self) -> Option<&str> {
        match self.kind {
            TensorKind::Linear(_) => self.name.strip_suffix(".weight"),
            _ => None,
        }
    }
}

impl PackConfig {
    /// Checks internal consistency.
    pub fn validate(&self) -> Result<(), ManifestError> {
        let bad = |r: String| Err(ManifestError::Invalid(format!("config: {r}")));
        if self.layer_types.len() as u64 != self.num_hidden_layers {
            return bad(format!(
                "layer_types lists {} layers but num_hidden_layers is {}",
                self.layer_types.len(),
                self.num_hidden_layers
            ));
        }
        // Sizes and head counts: the engine's own checks, on what the engine will get.
        let trained = self.to_model(self.max_position_embeddings);
        trained.validate().map_err(|e| ManifestError::Invalid(format!("config: {e}")))?;
        let eps_ok = self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0;
        let rope_ok = self.rope_theta > 1.0 && self.rope_theta.is_finite();
        let frac_ok = self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0;
        if !(eps_ok && rope_ok && frac_ok) {
            return bad("rms_norm_eps, rope_theta or partial_rotary_factor is out of range".into());
        }
        let rot = self.head_dim as f64 * self.partial_rotary_factor;
        if libm::trunc(rot) != rot || rot as u64 % 2 != 0 {
            return bad(format!(
                "head_dim × partial_rotary_factor = {rot} must be an even integer"
            ));
        }
        if self.mtp_num_hidden_layers > 8 {
            return bad(format!(
                "mtp_num_hidden_layers = {} is out of range",
                self.mtp_num_hidden_layers
            ));
        }
        if self.eos_token_ids.iter().any(|&t| t >= self.vocab_size) {
            return bad("an eos_token_id lies outside the vocabulary".into());
        }
        if let Some(m) = &self.moe {
            if m.moe_intermediate_size != self.intermediate_size {
                return bad(format!(
                    "intermediate_size = {} must equal moe.moe_intermediate_size = {} in an MoE model",
                    self.intermediate_size, m.moe_intermediate_size
                ));
            }
        }
        Ok(())
    }

    /// The architecture pack.toml records for this config.
    pub fn architecture(&self) -> &'static str {
        if self.moe.is_some() {
            ARCHITECTURE_MOE
        } else {
            ARCHITECTURE
        }
    }

    /// The engine's model configuration; `context_length` (pack.toml's) becomes
    /// `max_position_embeddings`. The one mapping from pack.toml to the engine.
    pub fn to_model(&self, context_length: u64) -> ModelConfig {
        let z = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        ModelConfig {
            vocab_size: z(self.vocab_size),
            hidden_size: z(self.hidden_size),
            intermediate_size: z(self.intermediate_size),
            layer_types: self
                .layer_types
                .iter()
                .map(|t| match t {
                    LayerType::LinearAttention => LayerKind::Linear,
                    LayerType::FullAttention => LayerKind::Full,
                })
                .collect(),
            num_attention_heads: z(self.num_attention_heads),
            num_key_value_heads: z(self.num_key_value_heads),
            head_dim: z(self.head_dim),
            rotary_dim: z(self.rotary_dim()),
            rope_theta: self.rope_theta,
            linear_conv_kernel_dim: z(self.linear_conv_kernel_dim),
            linear_num_key_heads: z(self.linear_num_key_heads),
            linear_num_value_heads: z(self.linear_num_value_heads),
            linear_key_head_dim: z(self.linear_key_head_dim),
            linear_value_head_dim: z(self.linear_value_head_dim),
            rms_norm_eps: self.rms_norm_eps as f32,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: z(context_length),
            eos_token_ids: self.eos_token_ids.iter().map(|&t| t as u32).collect(),
            mtp_num_hidden_layers: z(self.mtp_num_hidden_layers),
            moe: self.moe.map(|m| MoeConfig {
                num_experts: z(m.num_experts),
                num_experts_per_tok: z(m.num_experts_per_tok),
                moe_intermediate_size: z(m.moe_intermediate_size),
                shared_expert_intermediate_size: z(m.shared_expert_intermediate_size),
            }),
        }
    }

    /// The section for a model read from `config.json` ([`JsonConfig::parse`]).
    /// Attention is gated: that reader rejects anything else.
    pub fn from_json(j: &JsonConfig) -> PackConfig {
        let m = &j.model;
        let w = |v: usize| v as u64;
        PackConfig {
            vocab_size: w(m.vocab_size),
            hidden_size: w(m.hidden_size),
            intermediate_size: w(m.intermediate_size),
            num_hidden_layers: w(m.layer_types.len()),
            layer_types: m
                .layer_types
                .iter()
                .map(|k| match k {
                    LayerKind::Linear => LayerType::LinearAttention,
                    LayerKind::Full => LayerType::FullAttention,
                })
                .collect(),
            num_attention_heads: w(m.num_attention_heads),
            num_key_value_heads: w(m.num_key_value_heads),
            head_dim: w(m.head_dim),
            attn_output_gate: true,
            linear_num_key_heads: w(m.linear_num_key_heads),
            linear_num_value_heads: w(m.linear_num_value_heads),
            linear_key_head_dim: w(m.linear_key_head_dim),
            linear_value_head_dim: w(m.linear_value_head_dim),
            linear_conv_kernel_dim: w(m.linear_conv_kernel_dim),
            rms_norm_eps: j.rms_norm_eps,
            rope_theta: m.rope_theta,
            partial_rotary_factor: j.partial_rotary_factor,
            tie_word_embeddings: m.tie_word_embeddings,
            mtp_num_hidden_layers: w(m.mtp_num_hidden_layers),
            max_position_embeddings: w(m.max_position_embeddings),
            eos_token_ids: m.eos_token_ids.iter().map(|&t| u64::from(t)).collect(),
            moe: m.moe.map(|e| PackMoe {
                num_experts: w(e.num_experts),
                num_experts_per_tok: w(e.num_experts_per_tok),
                moe_intermediate_size: w(e.moe_intermediate_size),
                shared_expert_intermediate_size: w(e.shared_expert_intermediate_size),
            }),
        }
    }

    /// Number of rotated dimensions per head.
    pub fn rotary_dim(&self) -> u64 {
        (self.head_dim as f64 * self.partial_rotary_factor) as u64
    }

    /// Every tensor the configuration implies, in a stable order.
    pub fn expected_tensors(&self) -> Vec<ExpectedTensor> {
        let mut v = Vec::new();
        let h = self.hidden_size;
        push(&mut v, "model.embed_tokens.weight", vec![self.vocab_size, h], TensorKind::Embedding);
        for (i, &lt) in self.layer_types.iter().enumerate() {
            let p = format!("model.layers.{i}");
            match lt {
                LayerType::FullAttention => self.push_attention(&mut v, &p),
                LayerType::LinearAttention => self.push_deltanet(&mut v, &p),
            }
            self.push_mlp_and_norms(&mut v, &p);
        }
        push(&mut v, "model.norm.weight", vec![h], TensorKind::Norm);
        if !self.tie_word_embeddings {
            push(
                &mut v,
                "lm_head.weight",
                vec![self.vocab_size, h],
                TensorKind::Linear(LinearGroup::LmHead),
            );
        }
        if self.mtp_num_hidden_layers > 0 {
            push(&mut v, "mtp.fc.weight", vec![h, 2 * h], TensorKind::Linear(LinearGroup::MtpFc));
            push(&mut v, "mtp.pre_fc_norm_embedding.weight", vec![h], TensorKind::Norm);
            push(&mut v, "mtp.pre_fc_norm_hidden.weight", vec![h], TensorKind::Norm);
            for j in 0..self.mtp_num_hidden_layers {
                let p = format!("mtp.layers.{j}");
                self.push_attention(&mut v, &p);
                self.push_mlp_and_norms(&mut v, &p);
            }
            push(&mut v, "mtp.norm.weight", vec![h], TensorKind::Norm);
        }
        v
    }

    fn push_attention(&self, v: &mut Vec<ExpectedTensor>, p: &str) {
        let (h, hd) = (self.hidden_size, self.head_dim);
        let q_out = self.num_attention_heads * hd * if self.attn_output_gate { 2 } else { 1 };
        let kv_out = self.num_key_value_heads * hd;
        let lin = TensorKind::Linear(LinearGroup::Attention);
        push(v, &format!("{p}.self_attn.q_proj.weight"), vec![q_out, h], lin);
        push(v, &format!("{p}.self_attn.k_proj.weight"), vec![kv_out, h], lin);
        push(v, &format!("{p}.self_attn.v_proj.weight"), vec![kv_out, h], lin);
        push(
            v,
            &format!("{p}.self_attn.o_proj.weight"),
            vec![h, self.num_attention_heads * hd],
            lin,
        );
        push(v, &format!("{p}.self_attn.q_norm.weight"), vec![hd], TensorKind::Norm);
        push(v, &format!("{p}.self_attn.k_norm.weight"), vec![hd], TensorKind::Norm);
    }

    fn push_deltanet(&self, v: &mut Vec<ExpectedTensor>, p: &str) {
        let h = self.hidden_size;
        let key_dim = self.linear_num_key_heads * self.linear_key_head_dim;
        let value_dim = self.linear_num_value_heads * self.linear_value_head_dim;
        let nv = self.linear_num_value_heads;
        let lin = TensorKind::Linear(LinearGroup::LinearAttention);
        let a = format!("{p}.linear_attn");
        push(v, &format!("{a}.in_proj_qkv.weight"), vec![2 * key_dim + value_dim, h], lin);
        push(v, &format!("{a}.in_proj_z.weight"), vec![value_dim, h], lin);
        push(v, &format!("{a}.in_proj_b.weight"), vec![nv, h], lin);
        push(v, &format!("{a}.in_proj_a.weight"), vec![nv, h], lin);
        let conv = vec![2 * key_dim + value_dim, 1, self.linear_conv_kernel_dim];
        push(v, &format!("{a}.conv1d.weight"), conv, TensorKind::Conv);
        push(v, &format!("{a}.A_log"), vec![nv], TensorKind::Param);
        push(v, &format!("{a}.dt_bias"), vec![nv], TensorKind::Param);
        push(v, &format!("{a}.norm.weight"), vec![self.linear_value_head_dim], TensorKind::Norm);
        push(v, &format!("{a}.out_proj.weight"), vec![h, value_dim], lin);
    }

    fn push_mlp_and_norms(&self, v: &mut Vec<ExpectedTensor>, p: &str) {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        match &self.moe {
            Some(m) => self.push_moe(v, p, m),
            None => push_swiglu(v, &format!("{p}.mlp"), h, i, LinearGroup::Mlp),
        }
        push(v, &format!("{p}.input_layernorm.weight"), vec![h], TensorKind::Norm);
        push(v, &format!("{p}.post_attention_layernorm.weight"), vec![h], TensorKind::Norm);
    }
}

impl PackConfig {
    /// An MoE layer's MLP, in the checkpoints' per-expert naming:
    /// `mlp.gate` (router), `mlp.experts.E.{gate,up,down}_proj`,
    /// `mlp.shared_expert.*` and `mlp.shared_expert_gate`.
    fn push_moe(&self, v: &mut Vec<ExpectedTensor>, p: &str, m: &PackMoe) {
        let h = self.hidden_size;
        let router = TensorKind::Linear(LinearGroup::Router);
        push(v, &format!("{p}.mlp.gate.weight"), vec![m.num_experts, h], router);
        for e in 0..m.num_experts {
            let x = format!("{p}.mlp.experts.{e}");
            push_swiglu(v, &x, h, m.moe_intermediate_size, LinearGroup::Experts);
        }
        let shared = m.shared_expert_intermediate_size;
        push_swiglu(v, &format!("{p}.mlp.shared_expert"), h, shared, LinearGroup::Mlp);
        push(v, &format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h], router);
    }
}

/// A SwiGLU MLP's three Linears under `prefix`.
fn push_swiglu(v: &mut Vec<ExpectedTensor>, prefix: &str, h: u64, i: u64, group: LinearGroup) {
    let kind = TensorKind::Linear(group);
    push(v, &format!("{prefix}.gate_proj.weight"), vec![i, h], kind);
    push(v, &format!("{prefix}.up_proj.weight"), vec![i, h], kind);
    push(v, &format!("{prefix}.down_proj.weight"), vec![h, i], kind);
}

fn push(v: &mut Vec<ExpectedTensor>, name: &str, shape: Vec<u64>, kind: TensorKind) {
    v.push(ExpectedTensor { name: name.to_string(), shape, kind });
}
