//! Manifest reading on a pack.toml shaped like kore-pack's output (the reader's own cases are
//! kore-pack-format's tests; the comparison with kore-pack on a real pack is in the boot tests).

use super::*;
use kore_engine::LayerKind;

/// The default pack's manifest, as kore-pack wrote it.
const SAMPLE: &str = include_str!("../../../../model-packs/tiny/pack.toml");

#[test]
fn sample_manifest_gives_the_engine_config() {
    let m = Manifest::parse(SAMPLE).unwrap();
    assert_eq!(m.name, "tiny");
    assert_eq!(m.tokenizer_file, "tokenizer.json");
    let c = &m.config;
    assert_eq!(c.layer_types.len(), 8);
    assert_eq!(c.layer_types[3], LayerKind::Full);
    assert_eq!(c.layer_types[4], LayerKind::Linear);
    assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size), (4096, 256, 768));
    assert_eq!(c.rotary_dim, 16);
    assert_eq!(c.max_position_embeddings, m.context_length);
    assert_eq!(c.eos_token_ids, [4070]);
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
            SAMPLE.replace("num_hidden_layers = 8", "num_hidden_layers = 5"),
            "num_hidden_layers is 5",
        ),
        (SAMPLE.replace("\"full_attention\"", "\"moe\""), "unknown variant `moe`"),
        (SAMPLE.replace("vocab_size = 4096", "vocab_size = -1"), "-1"),
        (SAMPLE.replace("num_key_value_heads = 2", "num_key_value_heads = 3"), "must divide"),
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
