//! Shared helpers: a tiny Qwen3.5-shaped config and a Hugging Face style
//! directory written from it (BF16 weights, `model.language_model.` prefix,
//! a vision tensor to be dropped, MTP tensors, tokenizer files).
#![allow(dead_code)]

use kore_pack::config::{LayerType, PackConfig, TensorKind};
use kore_pack::safetensors::{DType, SafetensorsWriter, TensorSpec};
use kore_pack::synth::{byte_level_tokenizer, Rng};
use std::path::{Path, PathBuf};

/// A fresh empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("kore-pack-test-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A tiny but complete Qwen3.5 configuration (3 DeltaNet layers, 1 full, MTP).
pub fn tiny_config() -> PackConfig {
    PackConfig {
        vocab_size: 320,
        hidden_size: 64,
        intermediate_size: 96,
        num_hidden_layers: 4,
        layer_types: vec![
            LayerType::LinearAttention,
            LayerType::LinearAttention,
            LayerType::LinearAttention,
            LayerType::FullAttention,
        ],
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        attn_output_gate: true,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
        linear_key_head_dim: 16,
        linear_value_head_dim: 16,
        linear_conv_kernel_dim: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        partial_rotary_factor: 0.25,
        tie_word_embeddings: false,
        mtp_num_hidden_layers: 1,
        max_position_embeddings: 256,
        eos_token_ids: vec![302],
        moe: None,
    }
}

/// The HF config.json for `cfg` (multimodal wrapper with text_config).
pub fn hf_config_json(cfg: &PackConfig) -> serde_json::Value {
    let types: Vec<&str> = cfg
        .layer_types
        .iter()
        .map(|t| match t {
            LayerType::LinearAttention => "linear_attention",
            LayerType::FullAttention => "full_attention",
        })
        .collect();
    serde_json::json!({
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "text_config": {
            "model_type": "qwen3_5_text",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
            "layer_types": types, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "attn_output_gate": cfg.attn_output_gate,
            "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
            "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_parameters": {"rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor,
                                "mrope_interleaved": true, "mrope_section": [1, 1, 0]},
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "mtp_num_hidden_layers": cfg.mtp_num_hidden_layers,
            "max_position_embeddings": cfg.max_position_embeddings,
            "eos_token_id": cfg.eos_token_ids[0]
        }
    })
}

/// Random values for a tensor of `kind` (norms near their identity, A_log > 0).
pub fn values(rng: &mut Rng, name: &str, kind: TensorKind, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u = rng.unit();
            match kind {
                TensorKind::Norm if name.ends_with("linear_attn.norm.weight") => 0.8 + 0.4 * u,
                TensorKind::Norm => 0.4 * u - 0.2,
                TensorKind::Param if name.ends_with("A_log") => (1.0 + 7.0 * u).ln(),
                TensorKind::Param => u - 0.5,
                TensorKind::Conv => 0.6 * u - 0.3,
                _ => 0.3 * u - 0.15,
            }
        })
        .collect()
}

/// Writes an HF directory for `cfg` into `dir`; returns the BF16 values written by pack name.
pub fn write_hf_dir(dir: &Path, cfg: &PackConfig, seed: u64) -> Vec<(String, Vec<f32>)> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&hf_config_json(cfg)).unwrap(),
    )
    .unwrap();
    let mut rng = Rng::new(seed);
    let mut specs = Vec::new();
    let mut data = Vec::new();
    let mut kept = Vec::new();
    for e in cfg.expected_tensors() {
        let n: u64 = e.shape.iter().product();
        let vals = values(&mut rng, &e.name, e.kind, n as usize);
        let bytes: Vec<u8> =
            vals.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect();
        let exact: Vec<f32> = vals.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        let hf_name = match e.name.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => e.name.clone(),
        };
        specs.push(TensorSpec::new(hf_name, DType::BF16, e.shape.clone()));
        data.push(bytes);
        kept.push((e.name.clone(), exact));
    }
    specs.push(TensorSpec::new("model.visual.blocks.0.attn.qkv.weight", DType::BF16, vec![4, 4]));
    data.push(vec![0u8; 32]);
    write_safetensors(&dir.join("model.safetensors"), &specs, &data, 1);
    let tok = byte_level_tokenizer(
        cfg.vocab_size,
        &[(300, "<|endoftext|>"), (301, "<|im_start|>"), (302, "<|im_end|>")],
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok).unwrap();
    let tc = serde_json::json!({"chat_template": "{{ messages }}", "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_vec(&tc).unwrap()).unwrap();
    kept
}

/// Writes a safetensors file with the crate's writer.
pub fn write_safetensors(path: &Path, specs: &[TensorSpec], data: &[Vec<u8>], align: u64) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = SafetensorsWriter::new(f, path, specs, align, &[]).unwrap();
    for (s, d) in specs.iter().zip(data) {
        w.write_tensor(&s.name, d).unwrap();
    }
    w.finish().unwrap();
}
