//! Manifest reading on a pack.toml shaped like kore-pack's output (the reader's own cases are
//! kore-pack-format's tests; the comparison with kore-pack on a real pack is in the boot tests).

use super::*;
use kore_engine::LayerKind;

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
    assert_eq!(m.tokenizer_file, "tokenizer.json");
    let c = &m.config;
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
}

#[test]
fn bad_manifests_say_what_is_wrong() {
    let cases = [
        (SAMPLE.replace("format_version = 1", "format_version = 2"), "format version 2 is newer"),
        (SAMPLE.replace("qwen3_5_text", "llama"), "architecture `llama`"),
        (SAMPLE.replace("hidden_size = 256\n", ""), "missing field `hidden_size`"),
        (SAMPLE.replace("head_dim = 64", "head_dim = \"64\""), "invalid type: string"),
        (
            SAMPLE.replace("num_hidden_layers = 4", "num_hidden_layers = 5"),
            "num_hidden_layers is 5",
        ),
        (SAMPLE.replace("\"full_attention\"", "\"moe\""), "unknown variant `moe`"),
        (SAMPLE.replace("vocab_size = 4096", "vocab_size = -1"), "-1"),
        (SAMPLE.replace("num_key_value_heads = 2", "num_key_value_heads = 3"), "multiple of"),
        (SAMPLE.replace("mtp = true", "mtp = {a = 1"), "not valid TOML"),
    ];
    for (text, want) in cases {
        let e = Manifest::parse(&text).unwrap_err().to_string();
        assert!(e.starts_with("pack.toml: ") && e.contains(want), "{want:?} not in {e:?}");
    }
    let files: [(&[u8], &[u8]); 1] = [(b"pack.toml", b"\xff")];
    assert_eq!(Pack::from_files(files).unwrap_err(), PackError::NotUtf8);
}

#[test]
fn missing_files_are_named() {
    let files: [(&[u8], &[u8]); 1] = [(b"pack.toml", SAMPLE.as_bytes())];
    let e = Pack::from_files(files).unwrap_err();
    assert_eq!(e, PackError::MissingFile("weights.safetensors".into()));
}
