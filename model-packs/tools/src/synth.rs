//! `pack synth`: packs with the exact shapes of published Qwen3.5 models
//! (dense, and the MoE `qwen3.5-35b-a3b`) and random NVFP4 weights, for
//! benchmarks without downloads; [`cut_depth`] keeps a preset's shapes but
//! only its first layers, for machines that cannot hold the whole model.
//!
//! Every Linear (lm_head and mtp.fc included) is NVFP4, except an MoE
//! model's router and shared-expert gate, which are BF16 as in published
//! checkpoints; embeddings are BF16; norms, conv1d, A_log and dt_bias are F32. Bytes come from a seeded
//! xoshiro256** generator and are streamed to disk, so memory stays small
//! whatever the model size. Random NVFP4 codes with block scales in
//! [128, 448] and `weight_scale_2 = 1 / (717·√K)` give weights of standard
//! deviation about `1/√K`, so activations stay finite through the stack.
//!
//! The tokenizer is a byte-level BPE with no merges (one token per byte), the
//! full 248,320-entry vocabulary (unused ids are filler tokens) and Qwen3.5's
//! special-token ids; see docs/pack-format.md.
//!
//! The output head follows `--head` ([`crate::head`]): `q8` heads are random
//! int8 with F16 block scales of the embedding's magnitude.

use crate::config::{LayerType, LinearGroup, PackConfig, PackMoe, TensorKind};
use crate::error::{PackError, Result};
use crate::head::{HeadFormat, LM_HEAD, LM_HEAD_EXACT, Q8_GROUP};
use crate::manifest::{
    Manifest, Quantization, Scheme, TokenizerEntry, ALIGNMENT, FORMAT_VERSION, TOKENIZER_FILE,
};
use crate::nvfp4::GROUP;
use crate::output::{write_pack, WeightsWriter};
use crate::pack::Pack;
use crate::progress::Progress;
use crate::safetensors::{DType, TensorSpec};
use std::collections::BTreeMap;
use std::path::Path;

/// Dense preset names accepted by [`preset`].
pub const PRESETS: [&str; 5] =
    ["qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b"];

/// Mixture-of-experts preset names accepted by [`preset`]: the published
/// 35B-A3B, and a small one with the same structure for tests.
pub const MOE_PRESETS: [&str; 2] = ["qwen3.5-35b-a3b", "qwen3.5-moe-tiny"];

/// Qwen3.5 special tokens (id, text) used by synthetic tokenizers: the ones
/// the chat template needs (tool calls and results included), so that a
/// synthetic pack can `chat` and `serve`.
pub const QWEN35_SPECIALS: [(u64, &str); 9] = [
    (248044, "<|endoftext|>"),
    (248045, "<|im_start|>"),
    (248046, "<|im_end|>"),
    (248058, "<tool_call>"),
    (248059, "</tool_call>"),
    (248066, "<tool_response>"),
    (248067, "</tool_response>"),
    (248068, "<think>"),
    (248069, "</think>"),
];

/// The published configuration of a Qwen3.5 model (or the small MoE test model).
pub fn preset(name: &str) -> Result<PackConfig> {
    if MOE_PRESETS.contains(&name) {
        return Ok(moe_preset(name));
    }
    // (hidden, layers, intermediate, heads, kv heads, linear value heads, tied)
    let (h, layers, inter, heads, kv, lv, tied) = match name {
        "qwen3.5-0.8b" => (1024, 24, 3584, 8, 2, 16, true),
        "qwen3.5-2b" => (2048, 24, 6144, 8, 2, 16, true),
        "qwen3.5-4b" => (2560, 32, 9216, 16, 4, 32, true),
        "qwen3.5-9b" => (4096, 32, 12288, 16, 4, 32, false),
        "qwen3.5-27b" => (5120, 64, 17408, 24, 4, 48, false),
        other => {
            return Err(PackError::Invalid(format!(
                "unknown preset `{other}`; choose one of {}, {}",
                PRESETS.join(", "),
                MOE_PRESETS.join(", ")
            )))
        }
    };
    let layer_types =
        (0..layers)
            .map(|i| {
                if (i + 1) % 4 == 0 {
                    LayerType::FullAttention
                } else {
                    LayerType::LinearAttention
                }
            })
            .collect();
    Ok(PackConfig {
        vocab_size: 248320,
        hidden_size: h,
        intermediate_size: inter,
        num_hidden_layers: layers,
        layer_types,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: 256,
        attn_output_gate: true,
        linear_num_key_heads: 16,
        linear_num_value_heads: lv,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        linear_conv_kernel_dim: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        partial_rotary_factor: 0.25,
        tie_word_embeddings: tied,
        mtp_num_hidden_layers: 1,
        max_position_embeddings: 262144,
        eos_token_ids: vec![248046, 248044],
        moe: None,
    })
}

/// Qwen3.5-35B-A3B as transformers' `Qwen3_5MoeTextConfig` defaults describe
/// it (40 layers `[linear x3, full] x 10`, hidden 2048, 256 experts of 512,
/// 8 routed + 1 shared of 512, 16 query / 2 KV heads of 256, DeltaNet 16 key
/// / 32 value heads of 128, untied, one MTP layer), or `qwen3.5-moe-tiny`:
/// the same structure at hidden 128 with 32 experts of 64 (4 routed), for tests.
fn moe_preset(name: &str) -> PackConfig {
    let big = name == "qwen3.5-35b-a3b";
    // (hidden, layers, heads, kv, head dim, linear k/v heads, linear head dim, experts, k, expert, shared)
    let (h, layers, heads, kv, hd, lk, lv, ld, e, k, inter, shared) = if big {
        (2048, 40, 16, 2, 256, 16, 32, 128, 256, 8, 512, 512)
    } else {
        (128, 4, 4, 2, 64, 4, 8, 32, 32, 4, 64, 128)
    };
    PackConfig {
        vocab_size: 248320,
        hidden_size: h,
        intermediate_size: inter,
        num_hidden_layers: layers,
        layer_types: (0..layers)
            .map(|i| {
                if (i + 1) % 4 == 0 {
                    LayerType::FullAttention
                } else {
                    LayerType::LinearAttention
                }
            })
            .collect(),
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: hd,
        attn_output_gate: true,
        linear_num_key_heads: lk,
        linear_num_value_heads: lv,
        linear_key_head_dim: ld,
        linear_value_head_dim: ld,
        linear_conv_kernel_dim: 4,
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        partial_rotary_factor: 0.25,
        tie_word_embeddings: !big,
        mtp_num_hidden_layers: 1,
        max_position_embeddings: 262144,
        eos_token_ids: vec![248046, 248044],
        moe: Some(PackMoe {
            num_experts: e,
            num_experts_per_tok: k,
            moe_intermediate_size: inter,
            shared_expert_intermediate_size: shared,
        }),
    }
}

/// `config` with only its first `layers` decoder layers (same shapes, same
/// layer pattern; the MTP head stays): a smaller model for hosts that cannot
/// hold the whole one. Synthetic weights measure speed per layer only.
pub fn cut_depth(mut config: PackConfig, layers: u64) -> Result<PackConfig> {
    if layers == 0 || layers > config.num_hidden_layers {
        return Err(PackError::Invalid(format!(
            "--layers {layers}: the model has {} layers; choose 1..={}",
            config.num_hidden_layers, config.num_hidden_layers
        )));
    }
    config.num_hidden_layers = layers;
    config.layer_types.truncate(layers as usize);
    Ok(config)
}
/// Writes a synthetic pack for `preset_name` into `out`, seeded by `seed`,
/// with the output head stored as `head`; `layers` keeps only the first
/// layers ([`cut_depth`]).
pub fn synth(
    preset_name: &str,
    out: &Path,
    seed: u64,
    head: HeadFormat,
    layers: Option<u64>,
    progress: &dyn Progress,
) -> Result<Pack> {
    let mut config = preset(preset_name)?;
    let mut name = preset_name.to_string();
    if let Some(n) = layers {
        let all = config.num_hidden_layers;
        config = cut_depth(config, n)?;
        if n < all {
            name = format!("{preset_name}-{n}of{all}layers");
        }
    }
    synth_config_with(&name, config, out, seed, Some(head), progress)
}

/// Writes a synthetic pack for an arbitrary `config` (used by tests with tiny
/// shapes): an untied head as NVFP4, a tied one as the embedding.
pub fn synth_config(
    name: &str,
    config: PackConfig,
    out: &Path,
    seed: u64,
    progress: &dyn Progress,
) -> Result<Pack> {
    synth_config_with(name, config, out, seed, None, progress)
}

/// [`synth_config`] with the head stored as `head` (`None`: as
/// [`synth_config`] does).
pub fn synth_config_with(
    name: &str,
    config: PackConfig,
    out: &Path,
    seed: u64,
    head: Option<HeadFormat>,
    progress: &dyn Progress,
) -> Result<Pack> {
    config.validate().map_err(|e| PackError::from_manifest(Path::new(name), e))?;
    let mut expected = config.expected_tensors();
    let separate = matches!(head, Some(HeadFormat::Q8 | HeadFormat::Nvfp4));
    if config.tie_word_embeddings && separate {
        expected.push(crate::head::separate_head(&config));
    }
    if head.is_some_and(|h| crate::head::stores_exact_copy(&config, h)) {
        expected.push(crate::head::exact_head(&config));
    }
    let mut specs = Vec::new();
    let mut modules = BTreeMap::new();
    let mut jobs = Vec::new();
    for e in &expected {
        let is_head = e.module() == Some(LM_HEAD);
        match (e.kind, e.module()) {
            (TensorKind::Linear(_), Some(m))
                if (is_head
                    && head == Some(HeadFormat::Q8)
                    && e.shape[1] % Q8_GROUP as u64 == 0)
                    || m == LM_HEAD_EXACT =>
            {
                let (n, k) = (e.shape[0], e.shape[1]);
                specs.push(TensorSpec::new(format!("{m}.weight"), DType::I8, vec![n, k]));
                specs.push(TensorSpec::new(
                    format!("{m}.weight_scale"),
                    DType::F16,
                    vec![n, k / Q8_GROUP as u64],
                ));
                modules.insert(m.to_string(), Scheme::Q8);
                jobs.push(Job::Q8 { module: m.to_string(), n, k });
            }
            (TensorKind::Linear(g), _)
                if (is_head && head == Some(HeadFormat::Bf16)) || g == LinearGroup::Router =>
            {
                specs.push(TensorSpec::new(e.name.clone(), DType::BF16, e.shape.clone()));
                let numel = e.shape.iter().product();
                let init = init_for(&e.name, e.kind);
                jobs.push(Job::Plain { name: e.name.clone(), dtype: DType::BF16, numel, init });
            }
            (TensorKind::Linear(_), Some(m)) if e.shape[1] % GROUP as u64 == 0 => {
                let (n, k) = (e.shape[0], e.shape[1]);
                specs.push(TensorSpec::new(format!("{m}.weight"), DType::U8, vec![n, k / 2]));
                specs.push(TensorSpec::new(
                    format!("{m}.weight_scale"),
                    DType::F8E4M3,
                    vec![n, k / GROUP as u64],
                ));
                specs.push(TensorSpec::new(format!("{m}.weight_scale_2"), DType::F32, vec![]));
                modules.insert(m.to_string(), Scheme::Nvfp4);
                jobs.push(Job::Nvfp4 { module: m.to_string(), n, k });
            }
            (kind, _) => {
                let dtype = if matches!(kind, TensorKind::Embedding | TensorKind::Linear(_)) {
                    DType::BF16
                } else {
                    DType::F32
                };
                specs.push(TensorSpec::new(e.name.clone(), dtype, e.shape.clone()));
                let numel = e.shape.iter().product();
                jobs.push(Job::Plain {
                    name: e.name.clone(),
                    dtype,
                    numel,
                    init: init_for(&e.name, kind),
                });
            }
        }
    }
    let tokenizer = byte_level_tokenizer(config.vocab_size, &QWEN35_SPECIALS)?;
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: name.to_string(),
        architecture: config.architecture().into(),
        context_length: config.max_position_embeddings,
        mtp: config.mtp_num_hidden_layers > 0,
        alignment: ALIGNMENT,
        source: Some(format!("pack synth (random weights, seed {seed})")),
        config,
        tokenizer: TokenizerEntry {
            file: TOKENIZER_FILE.into(),
            chat_template: Some(CHAT_TEMPLATE.into()),
            bos_token: None,
            eos_token: Some("<|im_end|>".into()),
        },
        quantization: Quantization {
            group_size: GROUP as u64,
            producer: Some("kore-synth".into()),
            modules,
        },
        files: BTreeMap::new(),
    };
    let mut rng = Rng::new(seed);
    write_pack(out, manifest, &specs, &tokenizer, progress, |w| {
        jobs.iter().try_for_each(|j| write_job(w, j, &mut rng, progress))
    })
}

/// A simple ChatML template (our own; Qwen3.5's thinking prompt suffix).
pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}";

#[derive(Debug, Clone, Copy)]
enum Init {
    /// Uniform in [lo, hi).
    Uniform(f32, f32),
    /// ln(uniform(lo, hi)) (A_log).
    LogUniform(f32, f32),
}

fn init_for(name: &str, kind: TensorKind) -> Init {
    match kind {
        TensorKind::Embedding | TensorKind::Linear(_) => Init::Uniform(-0.05, 0.05),
        TensorKind::Norm if name.ends_with("linear_attn.norm.weight") => Init::Uniform(0.9, 1.1),
        TensorKind::Norm => Init::Uniform(-0.1, 0.1),
        TensorKind::Conv => Init::Uniform(-0.25, 0.25),
        TensorKind::Param if name.ends_with("A_log") => Init::LogUniform(1.0, 16.0),
        TensorKind::Param => Init::Uniform(-1.0, 1.0),
    }
}

enum Job {
    Nvfp4 { module: String, n: u64, k: u64 },
    Q8 { module: String, n: u64, k: u64 },
    Plain { name: String, dtype: DType, numel: u64, init: Init },
}

const CHUNK: usize = 1 << 20;

fn write_job(
    w: &mut WeightsWriter,
    job: &Job,
    rng: &mut Rng,
    progress: &dyn Progress,
) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    match job {
        Job::Nvfp4 { module, n, k } => {
            w.begin(&format!("{module}.weight"))?;
            stream(w, n * k / 2, &mut buf, progress, |b| rng.fill(b))?;
            w.begin(&format!("{module}.weight_scale"))?;
            stream(w, n * k / GROUP as u64, &mut buf, progress, |b| {
                rng.fill(b);
                b.iter_mut().for_each(|x| *x = 0x70 + *x % 15);
            })?;
            let s2 = 1.0 / (717.0 * (*k as f32).sqrt());
            w.write_tensor(&format!("{module}.weight_scale_2"), &s2.to_le_bytes())
        }
        Job::Q8 { module, n, k } => {
            w.begin(&format!("{module}.weight"))?;
            stream(w, n * k, &mut buf, progress, |b| {
                rng.fill(b);
                b.iter_mut().for_each(|x| *x = (*x as i8).max(-127) as u8);
            })?;
            // Uniform int8 in ±127 times 0.05 / 127: the embedding's range.
            let s = half::f16::from_f32(0.05 / 127.0).to_le_bytes();
            w.begin(&format!("{module}.weight_scale"))?;
            stream(w, n * k / Q8_GROUP as u64 * 2, &mut buf, progress, |b| {
                b.chunks_exact_mut(2).for_each(|e| e.copy_from_slice(&s));
            })
        }
        Job::Plain { name, dtype, numel, init } => {
            w.begin(name)?;
            let size = dtype.size();
            stream(w, numel * size as u64, &mut buf, progress, |b| {
                for e in b.chunks_exact_mut(size) {
                    let v = rng.sample(*init);
                    if size == 2 {
                        e.copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes());
                    } else {
                        e.copy_from_slice(&v.to_le_bytes());
                    }
                }
            })
        }
    }
}

fn stream(
    w: &mut WeightsWriter,
    total: u64,
    buf: &mut [u8],
    progress: &dyn Progress,
    mut fill: impl FnMut(&mut [u8]),
) -> Result<()> {
    let mut left = total;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n]);
        w.write(&buf[..n])?;
        progress.inc(n as u64);
        left -= n as u64;
    }
    Ok(())
}

/// xoshiro256** seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    /// Seeds the generator.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn sample(&mut self, init: Init) -> f32 {
        match init {
            Init::Uniform(lo, hi) => lo + (hi - lo) * self.unit(),
            Init::LogUniform(lo, hi) => (lo + (hi - lo) * self.unit()).ln(),
        }
    }
}

/// GPT-2 byte-to-character table used by byte-level BPE.
pub fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0u32..256 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(c).unwrap_or('?');
    }
    table
}

/// A Hugging Face tokenizer.json: byte-level BPE without merges (ids 0–255 are
/// the bytes), filler tokens up to the first special id, the given specials,
/// and reserved special tokens for every remaining id below `vocab_size`.
pub fn byte_level_tokenizer(vocab_size: u64, specials: &[(u64, &str)]) -> Result<Vec<u8>> {
    use serde_json::{json, Map, Value};
    let first_special = specials.iter().map(|s| s.0).min().unwrap_or(vocab_size).min(vocab_size);
    if first_special < 256 {
        return Err(PackError::Invalid(
            "special token ids must be above the 256 byte tokens".into(),
        ));
    }
    let chars = byte_chars();
    let mut vocab = Map::new();
    for (b, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    for id in 256..first_special {
        vocab.insert(format!("<|kore_filler_{id}|>"), json!(id));
    }
    let added: Vec<Value> = (first_special..vocab_size)
        .map(|id| {
            let content = specials.iter().find(|s| s.0 == id).map(|s| s.1.to_string()).unwrap_or_else(|| format!("<|kore_reserved_{id}|>"));
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    serde_json::to_vec(&tok)
        .map_err(|e| PackError::Invalid(format!("cannot serialize tokenizer: {e}")))
}

/// Qwen3.5's pre-tokenizer split regex (see FACTS: Tokenizer).
pub const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
