//! The bridge to kore-engine: a [`Pack`] is a `TensorSource` (borrowed views
//! straight into the mapped weights file) and carries the engine's
//! `ModelConfig`.

use crate::config::LayerType;
use crate::error::{PackError, Result};
use crate::pack::Pack;
use crate::safetensors::Dtype;
use kore_engine::{DType, LayerKind, Model, TensorSource, TensorView};

impl Pack {
    /// The engine's model configuration (context length from pack.toml).
    pub fn engine_config(&self) -> kore_engine::ModelConfig {
        let c = self.config();
        let z = |v: u64| v as usize;
        kore_engine::ModelConfig {
            vocab_size: z(c.vocab_size),
            hidden_size: z(c.hidden_size),
            intermediate_size: z(c.intermediate_size),
            layer_types: c
                .layer_types
                .iter()
                .map(|t| match t {
                    LayerType::LinearAttention => LayerKind::Linear,
                    LayerType::FullAttention => LayerKind::Full,
                })
                .collect(),
            num_attention_heads: z(c.num_attention_heads),
            num_key_value_heads: z(c.num_key_value_heads),
            head_dim: z(c.head_dim),
            rotary_dim: z(c.rotary_dim()),
            rope_theta: c.rope_theta,
            linear_conv_kernel_dim: z(c.linear_conv_kernel_dim),
            linear_num_key_heads: z(c.linear_num_key_heads),
            linear_num_value_heads: z(c.linear_num_value_heads),
            linear_key_head_dim: z(c.linear_key_head_dim),
            linear_value_head_dim: z(c.linear_value_head_dim),
            rms_norm_eps: c.rms_norm_eps as f32,
            tie_word_embeddings: c.tie_word_embeddings,
            max_position_embeddings: z(self.manifest().context_length),
            eos_token_ids: c.eos_token_ids.iter().map(|&t| t as u32).collect(),
            mtp_num_hidden_layers: z(c.mtp_num_hidden_layers),
        }
    }

    /// Loads the engine's model over this pack's mapped weights.
    pub fn model(&self) -> Result<Model<'_>> {
        Model::load(self.engine_config(), self).map_err(|e| PackError::BadManifest {
            file: self.weights().path().to_path_buf(),
            reason: format!("the engine cannot load this pack: {e}"),
        })
    }
}

fn engine_dtype(d: Dtype) -> DType {
    DType::from_safetensors(d.as_str())
}

impl TensorSource for Pack {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let t = Pack::tensor(self, name)?;
        Some(TensorView {
            dtype: engine_dtype(t.dtype),
            shape: self.shape_usize(name)?,
            data: t.data,
        })
    }

    fn location(&self, _name: &str) -> String {
        self.weights().path().display().to_string()
    }
}
