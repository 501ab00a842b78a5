//! pack.toml reading, its errors, and the one mapping to the engine's config.

use super::*;
use crate::config::{JsonConfig, LayerKind};
use alloc::format;
use alloc::string::ToString;
use alloc::vec::Vec;

const SAMPLE: &str = r#"format_version = 1
name = "tiny-hf"
architecture = "qwen3_5_text"
context_length = 4096
mtp = true
alignment = 64

[config]
vocab_size = 4096
hidden_size = 256
intermediate_size = 768
num_hidden_layers = 4
layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 64
attn_output_gate = true
linear_num_key_heads = 4
linear_num_value_heads = 8
linear_key_head_dim = 32
linear_value_head_dim = 32
linear_conv_kernel_dim = 4
rms_norm_eps = 0.000001
rope_theta = 10000000.0
partial_rotary_factor = 0.25
tie_word_embeddings = false
mtp_num_hidden_layers = 1
max_position_embeddings = 8192
eos_token_ids = [4070, 4072]

[tokenizer]
file = "tokenizer.json"
chat_template = '''{%- if x %}{{- '<think>\n' }}{%- endif %}'''
eos_token = "<|im_end|>"

[quantization]
group_size = 16

[quantization.modules]
"model.layers.0.mlp.up_proj" = "nvfp4"

[files."weights.safetensors"]
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
bytes = 1

[files."tokenizer.json"]
sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
bytes = 2
"#;

#[test]
fn sample_manifest_gives_the_engine_config() {
    let m = Manifest::parse(SAMPLE).unwrap();
    assert_eq!(m.name, "tiny-hf");
    assert_eq!(m.tokenizer.file, "tokenizer.json");
    assert_eq!(m.quantization.modules["model.layers.0.mlp.up_proj"], Scheme::Nvfp4);
    let c = m.model_config();
    assert_eq!(
        c.layer_types,
        [LayerKind::Linear, LayerKind::Linear, LayerKind::Linear, LayerKind::Full]
    );
    assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size), (4096, 256, 768));
    assert_eq!(c.rotary_dim, 16);
    assert_eq!(c.max_position_embeddings, 4096, "context_length wins over the trained length");
    assert_eq!(c.eos_token_ids, [4070, 4072]);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.mtp_num_hidden_layers, 1);
    c.validate().unwrap();
}

#[test]
fn config_json_maps_to_the_same_section() {
    let json = r#"{"model_type":"qwen3_5","tie_word_embeddings":false,"text_config":{
        "model_type":"qwen3_5_text","vocab_size":4096,"hidden_size":256,"intermediate_size":768,
        "num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":64,
        "linear_num_key_heads":4,"linear_num_value_heads":8,"linear_key_head_dim":32,
        "linear_value_head_dim":32,"rms_norm_eps":1e-6,"max_position_embeddings":8192,
        "mtp_num_hidden_layers":1,"eos_token_id":[4070,4072],
        "rope_parameters":{"rope_theta":1e7,"partial_rotary_factor":0.25}}}"#;
    let section = PackConfig::from_json(&JsonConfig::parse(json.as_bytes()).unwrap());
    assert_eq!(section, Manifest::parse(SAMPLE).unwrap().config);
    let back = section.to_model(8192);
    assert_eq!(back, crate::ModelConfig::from_json(json.as_bytes()).unwrap());
}

#[test]
fn bad_manifests_say_what_is_wrong() {
    let cases = [
        (SAMPLE.replace("format_version = 1", "format_version = 2"), "version 2 is newer"),
        (SAMPLE.replace("format_version = 1", "format_version = 0"), "format_version 0"),
        (SAMPLE.replace("qwen3_5_text", "llama"), "architecture `llama`"),
        (SAMPLE.replace("hidden_size = 256\n", ""), "missing field `hidden_size`"),
        (SAMPLE.replace("head_dim = 64", "head_dim = \"64\""), "invalid type: string \"64\""),
        (SAMPLE.replace("num_hidden_layers = 4", "num_hidden_layers = 5"), "lists 4 layers"),
        (SAMPLE.replace("\"full_attention\"", "\"moe\""), "unknown variant `moe`"),
        (SAMPLE.replace("vocab_size = 4096", "vocab_size = -1"), "-1"),
        (SAMPLE.replace("num_key_value_heads = 2", "num_key_value_heads = 3"), "must divide"),
        (SAMPLE.replace("mtp = true", "mtp = {a = 1"), "not valid TOML"),
        (SAMPLE.replace("mtp = true", "mtp = false"), "`mtp` disagrees"),
        (SAMPLE.replace("name = \"tiny-hf\"", "name = \"x\"\nextra = 1"), "unknown field `extra`"),
        (
            format!("{SAMPLE}[files.\"../t\"]\nsha256 = \"{}\"\nbytes = 1\n", "0".repeat(64)),
            "plain",
        ),
        (SAMPLE.replace("sha256 = \"00", "sha256 = \"zz"), "64 hex digits"),
    ];
    for (text, want) in cases {
        let e = Manifest::parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{want:?} not in {e:?}");
    }
    let newer = Manifest::parse(&SAMPLE.replace("format_version = 1", "format_version = 9"));
    assert_eq!(newer, Err(ManifestError::NewerFormat { found: 9, supported: FORMAT_VERSION }));
}

#[test]
fn expected_tensors_follow_the_layer_types() {
    let c = Manifest::parse(SAMPLE).unwrap().config;
    let names: Vec<_> = c.expected_tensors().into_iter().map(|t| t.name).collect();
    assert!(names.iter().any(|n| n == "model.layers.3.self_attn.q_proj.weight"));
    assert!(names.iter().any(|n| n == "model.layers.0.linear_attn.in_proj_qkv.weight"));
    assert!(!names.iter().any(|n| n == "model.layers.0.self_attn.q_proj.weight"));
    assert!(names.iter().any(|n| n == "mtp.fc.weight"));
    assert!(names.iter().any(|n| n == "lm_head.weight"));
    let _ = "".to_string();
}

/// SAMPLE as an MoE model: 4 experts of 64, 2 per token, a shared expert of 96.
fn moe_sample() -> alloc::string::String {
    SAMPLE
        .replace("architecture = \"qwen3_5_text\"", "architecture = \"qwen3_5_moe_text\"")
        .replace("intermediate_size = 768", "intermediate_size = 64")
        .replace(
            "eos_token_ids = [4070, 4072]\n",
            "eos_token_ids = [4070, 4072]\n\n[config.moe]\nnum_experts = 4\nnum_experts_per_tok = 2\nmoe_intermediate_size = 64\nshared_expert_intermediate_size = 96\n",
        )
        .replace("model.layers.0.mlp.up_proj", "model.layers.0.mlp.experts.3.up_proj")
}

#[test]
fn moe_manifest_gives_the_engine_config_and_per_expert_tensors() {
    let m = Manifest::parse(&moe_sample()).unwrap();
    let c = m.model_config();
    let moe = c.moe.expect("moe section");
    assert_eq!((moe.num_experts, moe.num_experts_per_tok), (4, 2));
    assert_eq!((moe.moe_intermediate_size, moe.shared_expert_intermediate_size), (64, 96));
    let t = m.config.expected_tensors();
    let shape = |n: &str| t.iter().find(|e| e.name == n).map(|e| e.shape.clone());
    assert_eq!(shape("model.layers.0.mlp.gate.weight"), Some(alloc::vec![4, 256]));
    assert_eq!(shape("model.layers.2.mlp.experts.3.down_proj.weight"), Some(alloc::vec![256, 64]));
    assert_eq!(
        shape("model.layers.1.mlp.shared_expert.up_proj.weight"),
        Some(alloc::vec![96, 256])
    );
    assert_eq!(shape("model.layers.1.mlp.shared_expert_gate.weight"), Some(alloc::vec![1, 256]));
    assert_eq!(shape("mtp.layers.0.mlp.experts.0.gate_proj.weight"), Some(alloc::vec![64, 256]));
    assert_eq!(shape("model.layers.0.mlp.gate_proj.weight"), None, "no dense MLP");
    let kind = |n: &str| t.iter().find(|e| e.name == n).map(|e| e.kind);
    assert_eq!(
        kind("model.layers.0.mlp.experts.0.up_proj.weight"),
        Some(TensorKind::Linear(LinearGroup::Experts))
    );
    assert_eq!(
        kind("model.layers.0.mlp.gate.weight"),
        Some(TensorKind::Linear(LinearGroup::Router))
    );
    // The section survives a write and a read.
    #[cfg(feature = "write")]
    assert_eq!(Manifest::parse(&m.to_toml().unwrap()).unwrap(), m);
}

#[test]
fn moe_manifest_errors_name_the_architecture_and_sizes() {
    let moe = moe_sample();
    let cases = [
        (moe.replace("qwen3_5_moe_text", "qwen3_5_text"), "disagrees with [config]"),
        (SAMPLE.replace("qwen3_5_text", "qwen3_5_moe_text"), "disagrees with [config]"),
        (moe.replace("\nintermediate_size = 64\n", "\nintermediate_size = 65\n"), "must equal"),
        (moe.replace("num_experts_per_tok = 2", "num_experts_per_tok = 5"), "must not exceed"),
        (moe.replace("num_experts = 4", "num_experts = 4\nrouter = 1"), "unknown field `router`"),
    ];
    for (text, want) in cases {
        let e = Manifest::parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{want:?} not in {e:?}");
    }
}
