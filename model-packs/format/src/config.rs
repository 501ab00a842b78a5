//! The engine's model configuration and the one reader of a Hugging Face
//! `config.json`: a `qwen3_5_text` or `qwen3_5_moe_text` config, or the
//! `text_config` inside a `qwen3_5` / `qwen3_5_moe` multimodal config. Nothing
//! is hard-coded: `layer_types` decides each layer's kind, [`MoeConfig`]
//! whether every layer's MLP is a mixture of experts, and every shape comes
//! from here.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use serde_json::{Map, Value};

/// Largest size or count a config may name: far above any real model, low
/// enough that nothing derived from untrusted input overflows.
const MAX_SIZE: usize = 1 << 24;

/// What is wrong with a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Not valid JSON, or not a JSON object.
    Json(String),
    /// `model_type` is not one this engine runs.
    UnknownModelType(String),
    /// A required field is absent.
    Missing(&'static str),
    /// A field has a wrong type or an inconsistent value.
    Invalid {
        /// The field.
        field: &'static str,
        /// Why it is wrong.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Json(e) => write!(f, "not a valid JSON config: {e}"),
            ConfigError::UnknownModelType(t) => write!(
                f,
                "unsupported model_type `{t}`: this engine runs Qwen3.5 models (`qwen3_5`, `qwen3_5_text`, `qwen3_5_moe` or `qwen3_5_moe_text`)"
            ),
            ConfigError::Missing(field) => write!(f, "required field `{field}` is missing"),
            ConfigError::Invalid { field, reason } => write!(f, "field `{field}`: {reason}"),
        }
    }
}

impl core::error::Error for ConfigError {}

/// The kind of token mixer in one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention with a recurrent state).
    Linear,
    /// Gated full softmax attention with a KV cache.
    Full,
}

/// The mixture-of-experts MLP of a Qwen3.5 MoE model (every decoder layer
/// and the MTP layer): a softmax router picks `num_experts_per_tok` of
/// `num_experts` SwiGLU experts per token (their weights renormalised to sum
/// to 1), plus one shared SwiGLU expert scaled by a sigmoid gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Routed experts per layer.
    pub num_experts: usize,
    /// Experts each token is routed to (top-k).
    pub num_experts_per_tok: usize,
    /// Inner width of each routed expert.
    pub moe_intermediate_size: usize,
    /// Inner width of the shared expert.
    pub shared_expert_intermediate_size: usize,
}

impl MoeConfig {
    /// Checks the counts and sizes.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sizes: [(&'static str, usize); 4] = [
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("shared_expert_intermediate_size", self.shared_expert_intermediate_size),
        ];
        for (field, v) in sizes {
            if v == 0 || v > MAX_SIZE {
                return Err(invalid(field, "must be positive and at most 2^24"));
            }
        }
        if self.num_experts > MAX_EXPERTS {
            return Err(invalid("num_experts", "must be at most 4096"));
        }
        if self.num_experts_per_tok > self.num_experts {
            return Err(invalid("num_experts_per_tok", "must not exceed num_experts"));
        }
        Ok(())
    }
}

/// Most routed experts a layer may have (the largest published Qwen MoE has 512).
pub const MAX_EXPERTS: usize = 4096;

/// Everything the engine needs to know about a Qwen3.5 text model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size (rows of the embedding and lm_head).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Dense MLP inner width (an MoE model has no dense MLP: there it
    /// equals `moe.moe_intermediate_size` and nothing reads it).
    pub intermediate_size: usize,
    /// Kind of each decoder layer, in order.
    pub layer_types: Vec<LayerKind>,
    /// Full attention: query heads.
    pub num_attention_heads: usize,
    /// Full attention: key/value heads (GQA).
    pub num_key_value_heads: usize,
    /// Full attention: per-head dimension.
    pub head_dim: usize,
    /// Full attention: leading dims of each head that get RoPE (even).
    pub rotary_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// Linear attention: causal conv kernel width.
    pub linear_conv_kernel_dim: usize,
    /// Linear attention: key heads.
    pub linear_num_key_heads: usize,
    /// Linear attention: value heads (a multiple of the key heads).
    pub linear_num_value_heads: usize,
    /// Linear attention: key head dimension.
    pub linear_key_head_dim: usize,
    /// Linear attention: value head dimension.
    pub linear_value_head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Longest sequence (prompt + generated) the state accepts.
    pub max_position_embeddings: usize,
    /// End-of-sequence ids named by the config (may be empty).
    pub eos_token_ids: Vec<u32>,
    /// MTP layers the checkpoint declares (0 when absent).
    pub mtp_num_hidden_layers: usize,
    /// The mixture-of-experts MLP (`None`: dense SwiGLU MLPs).
    pub moe: Option<MoeConfig>,
}

/// A `config.json` as read: the engine's configuration plus the two settings
/// it keeps only in derived form (pack.toml records them as written).
#[derive(Clone, Debug, PartialEq)]
pub struct JsonConfig {
    /// The engine's configuration.
    pub model: ModelConfig,
    /// `rms_norm_eps` at full precision.
    pub rms_norm_eps: f64,
    /// The rotated fraction of each head (`rotary_dim = head_dim * factor`).
    pub partial_rotary_factor: f64,
}

impl ModelConfig {
    /// Parses `config.json` bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        JsonConfig::parse(bytes).map(|c| c.model)
    }
}

impl JsonConfig {
    /// Parses `config.json` bytes: the one reader of Hugging Face configs.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let root: Value =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
        let root = root
            .as_object()
            .ok_or_else(|| ConfigError::Json("top level is not an object".into()))?;
        let model_type = root
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or(ConfigError::Missing("model_type"))?;
        let (text_type, moe) = match model_type {
            "qwen3_5_text" | "qwen3_5" => ("qwen3_5_text", false),
            "qwen3_5_moe_text" | "qwen3_5_moe" => ("qwen3_5_moe_text", true),
            other => return Err(ConfigError::UnknownModelType(other.to_string())),
        };
        if model_type == text_type {
            return Self::from_text(root, None, moe);
        }
        let text = root.get("text_config").ok_or(ConfigError::Missing("text_config"))?;
        let text = text.as_object().ok_or(ConfigError::Invalid {
            field: "text_config",
            reason: "must be an object".into(),
        })?;
        if let Some(t) = text.get("model_type").and_then(Value::as_str) {
            if t != text_type {
                return Err(ConfigError::UnknownModelType(t.to_string()));
            }
        }
        Self::from_text(text, Some(root), moe)
    }

    /// Reads the text model's settings from `c`; a multimodal wrapper's `outer`
    /// object decides `tie_word_embeddings` and supplies `eos_token_id` when the
    /// text config lacks it. `moe`: the config is a `qwen3_5_moe_text` one.
    fn from_text(
        c: &Map<String, Value>,
        outer: Option<&Map<String, Value>>,
        moe: bool,
    ) -> Result<Self, ConfigError> {
        let tie_override =
            outer.and_then(|o| o.get("tie_word_embeddings")).and_then(Value::as_bool);
        let num_layers = req_usize(c, "num_hidden_layers")?;
        let head_dim = match c.get("head_dim") {
            Some(_) => req_usize(c, "head_dim")?,
            None => req_usize(c, "hidden_size")? / req_usize(c, "num_attention_heads")?.max(1),
        };
        let partial = rope_field(c, "partial_rotary_factor")?.unwrap_or(0.25);
        let eps = opt_f64(c, "rms_norm_eps")?.unwrap_or(1e-6);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(invalid("partial_rotary_factor", "must be in (0, 1]"));
        }
        let rotary_dim = (head_dim as f64 * partial) as usize;
        let moe = if moe { Some(moe_config(c)?) } else { None };
        let cfg = ModelConfig {
            vocab_size: req_usize(c, "vocab_size")?,
            hidden_size: req_usize(c, "hidden_size")?,
            intermediate_size: match moe {
                Some(m) => m.moe_intermediate_size,
                None => req_usize(c, "intermediate_size")?,
            },
            layer_types: layer_types(c, num_layers)?,
            num_attention_heads: req_usize(c, "num_attention_heads")?,
            num_key_value_heads: req_usize(c, "num_key_value_heads")?,
            head_dim,
            rotary_dim,
            rope_theta: rope_field(c, "rope_theta")?.unwrap_or(10000.0),
            linear_conv_kernel_dim: opt_usize(c, "linear_conv_kernel_dim")?.unwrap_or(4),
            linear_num_key_heads: req_usize(c, "linear_num_key_heads")?,
            linear_num_value_heads: req_usize(c, "linear_num_value_heads")?,
            linear_key_head_dim: req_usize(c, "linear_key_head_dim")?,
            linear_value_head_dim: req_usize(c, "linear_value_head_dim")?,
            rms_norm_eps: eps as f32,
            tie_word_embeddings: match tie_override {
                Some(t) => t,
                None => c.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            },
            max_position_embeddings: opt_usize(c, "max_position_embeddings")?.unwrap_or(32768),
            eos_token_ids: match c.get("eos_token_id").filter(|v| !v.is_null()) {
                Some(_) => eos_ids(c)?,
                None => outer.map(eos_ids).transpose()?.unwrap_or_default(),
            },
            mtp_num_hidden_layers: opt_usize(c, "mtp_num_hidden_layers")?.unwrap_or(0),
            moe,
        };
        check_unsupported(c)?;
        cfg.validate()?;
        Ok(JsonConfig { model: cfg, rms_norm_eps: eps, partial_rotary_factor: partial })
    }
}

impl ModelConfig {
    /// Checks that the shapes are consistent and non-degenerate.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sizes: [(&'static str, usize); 13] = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.layer_types.len()),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in sizes {
            if v == 0 || v > MAX_SIZE {
                return Err(invalid(field, "must be positive and at most 2^24"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(invalid("num_key_value_heads", "must divide num_attention_heads"));
        }
        if self.linear_num_value_heads % self.linear_num_key_heads != 0 {
            return Err(invalid("linear_num_key_heads", "must divide linear_num_value_heads"));
        }
        if self.rotary_dim % 2 != 0 || self.rotary_dim == 0 || self.rotary_dim > self.head_dim {
            return Err(invalid(
                "partial_rotary_factor",
                "head_dim * factor must be a positive even number",
            ));
        }
        if self.rms_norm_eps.is_nan()
            || self.rms_norm_eps < 0.0
            || self.rope_theta.is_nan()
            || self.rope_theta <= 0.0
        {
            return Err(invalid("rms_norm_eps/rope_theta", "must be positive numbers"));
        }
        if let Some(m) = &self.moe {
            m.validate()?;
        }
        Ok(())
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layer_types.len()
    }

    /// Width of the linear-attention key (= query) projection: key heads x key dim.
    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// Width of the linear-attention value projection.
    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels of the causal conv (q | k | v).
    pub fn linear_conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }
}

/// The MoE settings of a `qwen3_5_moe_text` config (transformers' defaults
/// where a field is absent are those of Qwen3.5-35B-A3B).
fn moe_config(c: &Map<String, Value>) -> Result<MoeConfig, ConfigError> {
    let moe_inter = opt_usize(c, "moe_intermediate_size")?.unwrap_or(512);
    Ok(MoeConfig {
        num_experts: opt_usize(c, "num_experts")?.unwrap_or(256),
        num_experts_per_tok: opt_usize(c, "num_experts_per_tok")?.unwrap_or(8),
        moe_intermediate_size: moe_inter,
        shared_expert_intermediate_size: opt_usize(c, "shared_expert_intermediate_size")?
            .unwrap_or(512),
    })
}

fn invalid(field: &'static str, reason: &str) -> ConfigError {
    ConfigError::Invalid { field, reason: reason.to_string() }
}

fn opt_usize(c: &Map<String, Value>, field: &'static str) -> Result<Option<usize>, ConfigError> {
    match c.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(field, "must be a non-negative integer")),
    }
}

fn req_usize(c: &Map<String, Value>, field: &'static str) -> Result<usize, ConfigError> {
    opt_usize(c, field)?.ok_or(ConfigError::Missing(field))
}

fn opt_f64(c: &Map<String, Value>, field: &'static str) -> Result<Option<f64>, ConfigError> {
    match c.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| invalid(field, "must be a number")),
    }
}

/// A RoPE setting: `rope_parameters.<field>` (transformers 5), else
/// `rope_scaling.<field>`, else the legacy top-level field.
fn rope_field(c: &Map<String, Value>, field: &'static str) -> Result<Option<f64>, ConfigError> {
    for section in ["rope_parameters", "rope_scaling"] {
        if let Some(p) = c.get(section).and_then(Value::as_object) {
            if let Some(v) = opt_f64(p, field)? {
                return Ok(Some(v));
            }
        }
    }
    opt_f64(c, field)
}

fn layer_types(c: &Map<String, Value>, n: usize) -> Result<Vec<LayerKind>, ConfigError> {
    let Some(v) = c.get("layer_types").filter(|v| !v.is_null()) else {
        // transformers' default: every `full_attention_interval`-th layer is full attention.
        let interval = opt_usize(c, "full_attention_interval")?.unwrap_or(4).max(1);
        return Ok((0..n)
            .map(|i| if (i + 1) % interval == 0 { LayerKind::Full } else { LayerKind::Linear })
            .collect());
    };
    let arr = v.as_array().ok_or_else(|| invalid("layer_types", "must be a list"))?;
    if arr.len() != n {
        return Err(invalid(
            "layer_types",
            &format!("has {} entries but num_hidden_layers is {n}", arr.len()),
        ));
    }
    arr.iter()
        .map(|t| match t.as_str() {
            Some("linear_attention") => Ok(LayerKind::Linear),
            Some("full_attention") => Ok(LayerKind::Full),
            _ => Err(invalid("layer_types", &format!("unknown layer type {t}"))),
        })
        .collect()
}

/// `eos_token_id` of `c` (a number or a list; none when absent), as in
/// `config.json` and `generation_config.json`.
pub fn eos_ids(c: &Map<String, Value>) -> Result<Vec<u32>, ConfigError> {
    let bad = || invalid("eos_token_id", "must be an integer or a list of integers");
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad);
    match c.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(alloc::vec![one(v)?]),
    }
}

/// Rejects settings this engine does not implement rather than running them wrong.
fn check_unsupported(c: &Map<String, Value>) -> Result<(), ConfigError> {
    if c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err(invalid("attention_bias", "biased attention projections are not supported"));
    }
    if c.get("attn_output_gate").and_then(Value::as_bool) == Some(false) {
        return Err(invalid("attn_output_gate", "only gated attention (true) is supported"));
    }
    if c.get("norm_topk_prob").and_then(Value::as_bool) == Some(false) {
        return Err(invalid(
            "norm_topk_prob",
            "only renormalised top-k weights (true) are supported",
        ));
    }
    let dense_layers = c.get("mlp_only_layers").and_then(Value::as_array).map_or(0, Vec::len);
    let sparse_step = opt_usize(c, "decoder_sparse_step")?.unwrap_or(1);
    if dense_layers > 0 || sparse_step > 1 {
        return Err(invalid("mlp_only_layers", "every layer must be MoE (or none)"));
    }
    if let Some(act) = c.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(invalid("hidden_act", "only silu is supported"));
        }
    }
    if let Some(p) = c.get("rope_parameters").and_then(Value::as_object) {
        if let Some(t) = p.get("rope_type").and_then(Value::as_str) {
            if t != "default" && t != "mrope" {
                return Err(invalid(
                    "rope_parameters",
                    &format!("rope_type `{t}` is not supported"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"{"model_type":"qwen3_5_text","vocab_size":10,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":2,"layer_types":["linear_attention","full_attention"],"num_attention_heads":2,
        "num_key_value_heads":1,"head_dim":8,"linear_num_key_heads":1,"linear_num_value_heads":2,
        "linear_key_head_dim":4,"linear_value_head_dim":4,"rope_parameters":{"rope_theta":1e7,"partial_rotary_factor":0.25},
        "eos_token_id":[3,4]}"#;

    #[test]
    fn parses_text_and_wrapped_configs() {
        let c = ModelConfig::from_json(TEXT.as_bytes()).unwrap();
        assert_eq!(c.layer_types, [LayerKind::Linear, LayerKind::Full]);
        assert_eq!(c.rotary_dim, 2);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.eos_token_ids, [3, 4]);
        assert!(!c.tie_word_embeddings);
        let wrapped = format!(
            r#"{{"model_type":"qwen3_5","tie_word_embeddings":true,"text_config":{TEXT}}}"#
        );
        let w = ModelConfig::from_json(wrapped.as_bytes()).unwrap();
        assert!(w.tie_word_embeddings);
        assert_eq!(w.hidden_size, 8);
    }

    #[test]
    fn default_layer_types_follow_the_interval() {
        let s = TEXT
            .replace(r#""layer_types":["linear_attention","full_attention"],"#, "")
            .replace("\"num_hidden_layers\":2", "\"num_hidden_layers\":8");
        let c = ModelConfig::from_json(s.as_bytes()).unwrap();
        assert_eq!(c.layer_types.iter().filter(|k| **k == LayerKind::Full).count(), 2);
        assert_eq!(c.layer_types[3], LayerKind::Full);
    }

    #[test]
    fn parses_moe_configs() {
        let moe = TEXT.replace("qwen3_5_text", "qwen3_5_moe_text").replace(
            "\"intermediate_size\":16,",
            "\"num_experts\":6,\"num_experts_per_tok\":2,\"moe_intermediate_size\":4,\"shared_expert_intermediate_size\":12,",
        );
        let c = ModelConfig::from_json(moe.as_bytes()).unwrap();
        let m = c.moe.unwrap();
        assert_eq!((m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size), (6, 2, 4));
        assert_eq!((m.shared_expert_intermediate_size, c.intermediate_size), (12, 4));
        let wrapped = format!(r#"{{"model_type":"qwen3_5_moe","text_config":{moe}}}"#);
        assert_eq!(ModelConfig::from_json(wrapped.as_bytes()).unwrap().moe, Some(m));
        // A dense text config inside an MoE wrapper is refused, and the reverse.
        let mixed = format!(r#"{{"model_type":"qwen3_5_moe","text_config":{TEXT}}}"#);
        assert!(matches!(
            ModelConfig::from_json(mixed.as_bytes()),
            Err(ConfigError::UnknownModelType(_))
        ));
        assert!(ModelConfig::from_json(TEXT.as_bytes()).unwrap().moe.is_none());
        let too_many = moe.replace("\"num_experts_per_tok\":2", "\"num_experts_per_tok\":7");
        assert!(matches!(
            ModelConfig::from_json(too_many.as_bytes()),
            Err(ConfigError::Invalid { field: "num_experts_per_tok", .. })
        ));
        let unnormed =
            moe.replace("\"num_experts\":6,", "\"num_experts\":6,\"norm_topk_prob\":false,");
        assert!(ModelConfig::from_json(unnormed.as_bytes()).is_err());
        let partly_dense =
            moe.replace("\"num_experts\":6,", "\"num_experts\":6,\"mlp_only_layers\":[0],");
        assert!(ModelConfig::from_json(partly_dense.as_bytes()).is_err());
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(matches!(ModelConfig::from_json(b"{"), Err(ConfigError::Json(_))));
        assert!(matches!(ModelConfig::from_json(b"{}"), Err(ConfigError::Missing("model_type"))));
        let llama = TEXT.replace("qwen3_5_text", "llama");
        assert!(matches!(
            ModelConfig::from_json(llama.as_bytes()),
            Err(ConfigError::UnknownModelType(_))
        ));
        let missing = TEXT.replace("\"hidden_size\":8,", "");
        assert!(matches!(
            ModelConfig::from_json(missing.as_bytes()),
            Err(ConfigError::Missing("hidden_size"))
        ));
        let gqa = TEXT.replace("\"num_key_value_heads\":1", "\"num_key_value_heads\":3");
        assert!(matches!(ModelConfig::from_json(gqa.as_bytes()), Err(ConfigError::Invalid { .. })));
        let lt = TEXT.replace("\"full_attention\"]", "\"moe\"]");
        assert!(matches!(
            ModelConfig::from_json(lt.as_bytes()),
            Err(ConfigError::Invalid { field: "layer_types", .. })
        ));
        let neg = TEXT.replace("\"vocab_size\":10", "\"vocab_size\":-1");
        assert!(matches!(
            ModelConfig::from_json(neg.as_bytes()),
            Err(ConfigError::Invalid { field: "vocab_size", .. })
        ));
    }
}
