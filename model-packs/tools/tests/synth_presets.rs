//! `pack synth`: deterministic per seed, and the presets carry the published Qwen3.5 shapes.
//!
//! Reference values: the Qwen3.5-9B text config as read from transformers' `Qwen3_5TextConfig`
//! and the released config.json (summarised in the project's FACTS notes): hidden 4096,
//! 32 layers `[linear, linear, linear, full] x 8`, 16 attention heads / 4 KV heads / head_dim
//! 256 with the output gate, linear attention 16 key heads / 32 value heads of 128/128, conv
//! kernel 4, intermediate 12288, vocab 248320, rope_theta 1e7, partial rotary 0.25, rms eps 1e-6,
//! untied embeddings, one MTP layer. The other sizes' distinguishing values (hidden, layers,
//! intermediate, attention and KV heads, linear value heads, tied embeddings) were read on
//! 2026-12-03 from public third-party copies of the released configs (a per-model table of the
//! Qwen3.5 `text_config` values keyed by `Qwen/Qwen3.5-{0.8B,2B,4B,9B,27B}`, THUDM/slime's
//! `scripts/models/qwen3.5-{0.8B,27B}.sh`, and a 27B config.json); the Hugging Face configs
//! themselves cannot be fetched here. Every preset also carries what all Qwen3.5 dense models
//! share (layer pattern, vocab, head dims, conv kernel, RoPE, MTP).

mod common;

use common::{temp_dir, tiny_config};
use kore_pack::config::LayerType;
use kore_pack::integrity::sha256_file;
use kore_pack::synth::{preset, synth_config, PRESETS};
use kore_pack::NoProgress;

fn weights_sha(seed: u64) -> (String, String) {
    let dir = temp_dir(&format!("synth-seed-{seed}"));
    synth_config("seeded", tiny_config(), &dir, seed, &NoProgress).unwrap();
    let w = sha256_file(&dir.join("weights.safetensors"), &NoProgress).unwrap();
    let t = sha256_file(&dir.join("tokenizer.json"), &NoProgress).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (w, t)
}

#[test]
fn same_seed_same_bytes_other_seed_other_weights() {
    let a = weights_sha(42);
    assert_eq!(a, weights_sha(42), "same seed, same sha256");
    let b = weights_sha(43);
    assert_ne!(a.0, b.0, "another seed gives other weights");
    assert_eq!(a.1, b.1, "the tokenizer does not depend on the seed");
}

#[test]
fn nine_b_preset_matches_the_published_config() {
    let c = preset("qwen3.5-9b").unwrap();
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size),
        (4096, 32, 12288, 248320)
    );
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (16, 4, 256));
    assert!(c.attn_output_gate);
    assert_eq!((c.linear_num_key_heads, c.linear_num_value_heads), (16, 32));
    assert_eq!(
        (c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim),
        (128, 128, 4)
    );
    assert_eq!((c.rope_theta, c.partial_rotary_factor, c.rms_norm_eps), (1e7, 0.25, 1e-6));
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.mtp_num_hidden_layers, 1);
    // Parameters without the MTP layer: 8.95B (untied embeddings) as published.
    let params: u64 = c
        .expected_tensors()
        .iter()
        .filter(|t| !t.name.starts_with("mtp."))
        .map(|t| t.shape.iter().product::<u64>())
        .sum();
    assert!((8.90e9..9.00e9).contains(&(params as f64)), "{params} parameters");
}

#[test]
fn every_preset_matches_its_published_sizes() {
    // (preset, hidden, layers, intermediate, heads, kv heads, linear value heads, tied)
    let published = [
        ("qwen3.5-0.8b", 1024, 24, 3584, 8, 2, 16, true),
        ("qwen3.5-2b", 2048, 24, 6144, 8, 2, 16, true),
        ("qwen3.5-4b", 2560, 32, 9216, 16, 4, 32, true),
        ("qwen3.5-9b", 4096, 32, 12288, 16, 4, 32, false),
        ("qwen3.5-27b", 5120, 64, 17408, 24, 4, 48, false),
    ];
    assert_eq!(published.len(), PRESETS.len());
    for (name, h, layers, inter, heads, kv, lv, tied) in published {
        let c = preset(name).unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.intermediate_size),
            (h, layers, inter),
            "{name}"
        );
        assert_eq!((c.num_attention_heads, c.num_key_value_heads), (heads, kv), "{name}");
        assert_eq!(c.linear_num_value_heads, lv, "{name}");
        assert_eq!(c.tie_word_embeddings, tied, "{name}");
    }
}

#[test]
fn every_preset_has_the_shared_qwen35_structure() {
    for name in PRESETS {
        let c = preset(name).unwrap();
        let want: Vec<LayerType> = (0..c.num_hidden_layers)
            .map(|i| if i % 4 == 3 { LayerType::FullAttention } else { LayerType::LinearAttention })
            .collect();
        assert_eq!(c.layer_types, want, "{name}: [linear x3, full] pattern");
        assert_eq!(c.vocab_size, 248320, "{name}");
        assert_eq!(
            (c.head_dim, c.linear_key_head_dim, c.linear_value_head_dim),
            (256, 128, 128),
            "{name}"
        );
        assert_eq!(c.linear_num_key_heads, 16, "{name}");
        assert_eq!(
            c.linear_num_value_heads % c.linear_num_key_heads,
            0,
            "{name}: value heads group key heads"
        );
        assert_eq!(c.num_attention_heads % c.num_key_value_heads, 0, "{name}: GQA groups");
        assert_eq!(
            (c.linear_conv_kernel_dim, c.rope_theta, c.partial_rotary_factor),
            (4, 1e7, 0.25),
            "{name}"
        );
        assert_eq!(c.mtp_num_hidden_layers, 1, "{name}");
        c.validate().unwrap();
    }
}

/// Parameters of `c` without the MTP layer: all, and read by one token
/// (the router, the shared expert and the routed experts of each layer).
fn params(c: &kore_pack::PackConfig) -> (f64, f64) {
    let moe = c.moe.unwrap();
    let (mut all, mut active) = (0u64, 0u64);
    for t in c.expected_tensors().iter().filter(|t| !t.name.starts_with("mtp.")) {
        let n: u64 = t.shape.iter().product();
        all += n;
        active += if t.name.contains(".mlp.experts.") { 0 } else { n };
    }
    let expert = 3 * moe.moe_intermediate_size * c.hidden_size;
    active += c.num_hidden_layers * moe.num_experts_per_tok * expert;
    (all as f64 / 1e9, active as f64 / 1e9)
}

#[test]
fn moe_preset_has_the_published_35b_a3b_shapes() {
    let c = preset("qwen3.5-35b-a3b").unwrap();
    let m = c.moe.unwrap();
    assert_eq!((c.hidden_size, c.num_hidden_layers, c.vocab_size), (2048, 40, 248320));
    assert_eq!((m.num_experts, m.num_experts_per_tok), (256, 8));
    assert_eq!((m.moe_intermediate_size, m.shared_expert_intermediate_size), (512, 512));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (16, 2, 256));
    assert_eq!((c.linear_num_key_heads, c.linear_num_value_heads), (16, 32));
    assert!(!c.tie_word_embeddings);
    let (all, active) = params(&c);
    // "35B total, 3B activated" (A3B), with untied embeddings of 0.5B each.
    assert!((34.0..36.5).contains(&all), "{all:.2}B parameters");
    assert!((2.5..3.5).contains(&active), "{active:.2}B active parameters");
    c.validate().unwrap();
}

#[test]
fn cut_depth_keeps_the_shapes_and_the_pattern() {
    let c = preset("qwen3.5-35b-a3b").unwrap();
    let cut = kore_pack::synth::cut_depth(c.clone(), 6).unwrap();
    assert_eq!(cut.num_hidden_layers, 6);
    assert_eq!(cut.layer_types[..], c.layer_types[..6]);
    assert_eq!((cut.hidden_size, cut.moe), (c.hidden_size, c.moe));
    cut.validate().unwrap();
    assert!(kore_pack::synth::cut_depth(c.clone(), 0).is_err());
    assert!(kore_pack::synth::cut_depth(c, 41).is_err());
}

#[test]
fn tiny_moe_preset_synthesizes_a_pack_the_engine_routes() {
    let dir = temp_dir("synth-moe-tiny");
    let head = kore_pack::head::HeadFormat::Nvfp4;
    let pack =
        kore_pack::synth::synth("qwen3.5-moe-tiny", &dir, 1, head, Some(2), &NoProgress).unwrap();
    kore_pack::pack::verify(&dir, &NoProgress).unwrap();
    let m = pack.manifest();
    assert_eq!((m.architecture.as_str(), m.config.num_hidden_layers), ("qwen3_5_moe_text", 2));
    assert!(m.name.contains("2of4layers"), "{}", m.name);
    let q = &m.quantization.modules;
    assert!(q.contains_key("model.layers.1.mlp.experts.31.down_proj"));
    assert!(!q.contains_key("model.layers.1.mlp.gate"), "the router stays BF16");
    let model = pack.model().unwrap();
    let mut st = model.new_state();
    let prompt: Vec<u32> = (0..40).map(|i| i * 6151 % 248000).collect();
    let l = model.forward(&mut st, &prompt, kore_engine::Logits::Last).unwrap();
    assert!(l.iter().all(|v| v.is_finite()));
    let (_, passes) = model.expert_reads();
    assert!(passes > 2 * 4, "40 tokens route to more than 4 experts a layer: {passes}");
    let _ = std::fs::remove_dir_all(&dir);
}
