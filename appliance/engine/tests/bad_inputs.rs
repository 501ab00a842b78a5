//! Bad input gets a clear, typed error naming the file and tensor, and never
//! a panic or an out-of-bounds read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use kore_engine::hf::{HfError, HfModelDir};
use kore_engine::safetensors::Safetensors;
use kore_engine::weights::WeightErrorKind;
use kore_engine::{ConfigError, ForwardError, LoadError, Logits};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A scratch copy of a fixture's config and weights.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kore-engine-bad-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        let fname = p.file_name().unwrap().to_str().unwrap().to_string();
        if !fname.starts_with("reference") {
            std::fs::copy(&p, dir.join(fname)).unwrap();
        }
    }
    dir
}

/// One tensor of a safetensors file: name, dtype, shape, bytes.
type Tensor = (String, String, Vec<usize>, Vec<u8>);

fn read_tensors(path: &Path) -> Vec<Tensor> {
    let bytes = std::fs::read(path).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    st.names()
        .map(|n| {
            let t = st.get(n).unwrap();
            (n.to_string(), t.dtype.name().to_string(), t.shape.to_vec(), t.data.to_vec())
        })
        .collect()
}

fn write_tensors(path: &Path, tensors: &[Tensor]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Rewrites `model.safetensors` of `dir` through `f`.
fn edit_weights(dir: &Path, f: impl FnOnce(&mut Vec<Tensor>)) {
    let path = dir.join("model.safetensors");
    let mut t = read_tensors(&path);
    f(&mut t);
    write_tensors(&path, &t);
}

fn load_err(dir: &Path) -> HfError {
    match HfModelDir::open(dir) {
        Err(e) => e,
        Ok(hf) => hf.model().map(|_| ()).expect_err("loading should fail"),
    }
}

#[test]
fn missing_directory_and_config() {
    let e = load_err(Path::new("/nonexistent/kore-model"));
    assert!(matches!(e, HfError::NotADirectory(_)), "{e}");
    let dir = scratch("mixed_f32_untied");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, HfError::Io { .. }) && e.to_string().contains("config.json"), "{e}");
}

#[test]
fn malformed_config_and_unknown_model_type() {
    let dir = scratch("mixed_f32_untied");
    std::fs::write(dir.join("config.json"), b"{\"model_type\": ").unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, HfError::Config { source: ConfigError::Json(_), .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");

    let cfg = std::fs::read_to_string(fixture("mixed_f32_untied").join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), cfg.replace("qwen3_5_text", "qwen3_moe")).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, HfError::Config { source: ConfigError::UnknownModelType(_), .. }), "{e}");
    assert!(e.to_string().contains("qwen3_moe"), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = scratch("mixed_f32_untied");
    edit_weights(&dir, |t| t.retain(|x| x.0 != "model.layers.2.self_attn.k_norm.weight"));
    let e = load_err(&dir);
    match &e {
        HfError::Load { source: LoadError::Weights(w), .. } => {
            assert_eq!(w.tensor, "model.layers.2.self_attn.k_norm.weight");
            assert_eq!(w.kind, WeightErrorKind::Missing);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(e.to_string().contains("model.layers.2.self_attn.k_norm.weight"), "{e}");
}

#[test]
fn untied_model_without_lm_head_is_an_error() {
    let dir = scratch("mixed_f32_untied");
    edit_weights(&dir, |t| t.retain(|x| x.0 != "lm_head.weight"));
    let e = load_err(&dir);
    assert!(e.to_string().contains("lm_head.weight") && e.to_string().contains("missing"), "{e}");
}

#[test]
fn wrong_shape_and_dtype_are_named_with_their_file() {
    let dir = scratch("mixed_f32_untied");
    edit_weights(&dir, |t| {
        let x = t.iter_mut().find(|x| x.0 == "model.layers.0.mlp.up_proj.weight").unwrap();
        x.2 = vec![x.2[1], x.2[0]]; // transposed shape, same bytes
    });
    let e = load_err(&dir);
    let msg = e.to_string();
    assert!(msg.contains("model.layers.0.mlp.up_proj.weight") && msg.contains("shape"), "{msg}");
    assert!(msg.contains("model.safetensors"), "{msg}");

    let dir = scratch("mixed_f32_untied");
    edit_weights(&dir, |t| {
        let x = t.iter_mut().find(|x| x.0 == "model.norm.weight").unwrap();
        x.1 = "I32".into(); // same byte size, wrong type
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, HfError::Load { source: LoadError::Weights(w), .. } if matches!(w.kind, WeightErrorKind::DType { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("model.norm.weight"), "{e}");
}

#[test]
fn truncated_or_corrupt_safetensors_are_rejected() {
    let dir = scratch("mixed_f32_untied");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&dir);
    assert!(
        matches!(e, HfError::Safetensors { .. }) && e.to_string().contains("model.safetensors"),
        "{e}"
    );
    std::fs::write(&path, &bytes[..5]).unwrap();
    assert!(matches!(load_err(&dir), HfError::Safetensors { .. }));
    let mut huge = bytes.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, &huge).unwrap();
    assert!(matches!(load_err(&dir), HfError::Safetensors { .. }));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(load_err(&dir), HfError::NoWeights(_)));
}

#[test]
fn bad_shard_index_is_rejected() {
    let dir = scratch("mixed_bf16_mm_sharded_mtp");
    let idx = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&idx).unwrap();
    std::fs::write(&idx, text.replace("model-00002-of-00002.safetensors", "../../etc/passwd"))
        .unwrap();
    assert!(matches!(load_err(&dir), HfError::Index { .. }));
    std::fs::write(
        &idx,
        text.replace("model-00002-of-00002.safetensors", "model-00003-of-00002.safetensors"),
    )
    .unwrap();
    let e = load_err(&dir);
    assert!(
        matches!(e, HfError::Io { .. }) && e.to_string().contains("model-00003-of-00002"),
        "{e}"
    );
    std::fs::write(&idx, "{\"weight_map\": 3}").unwrap();
    assert!(matches!(load_err(&dir), HfError::Index { .. }));
}

#[test]
fn token_outside_the_vocabulary_is_an_error_and_changes_nothing() {
    let hf = HfModelDir::open(&fixture("full_f32_tied_mm")).unwrap();
    let model = hf.model().unwrap();
    let v = model.config.vocab_size as u32;
    let mut st = model.new_state();
    let e = model.forward(&mut st, &[1, v, 2], Logits::Last).unwrap_err();
    assert_eq!(e, ForwardError::TokenOutOfRange { token: v, vocab_size: v as usize });
    assert!(e.to_string().contains(&v.to_string()));
    assert_eq!(st.position(), 0);
    assert_eq!(model.forward(&mut st, &[], Logits::Last).unwrap_err(), ForwardError::Empty);
    assert!(model.forward(&mut st, &[1, 2], Logits::Last).is_ok());
    assert_eq!(st.position(), 2);
    // A state from another model is refused.
    let other = HfModelDir::open(&fixture("linear_bf16_tied")).unwrap();
    let other = other.model().unwrap();
    let mut foreign = other.new_state();
    assert_eq!(
        model.forward(&mut foreign, &[1], Logits::Last).unwrap_err(),
        ForwardError::StateMismatch
    );
}
