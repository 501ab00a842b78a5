//! `generate --model HF_DIR` in the Kore VM: the directory is imported on the fly with its
//! dtypes kept, so the guest gives transformers' greedy tokens (the committed reference
//! fixtures of kore-engine, made by scripts/reference/gen_fixtures.py and, for Qwen3.5 MoE,
//! gen_moe_fixtures.py) on f32 checkpoints at every `--guest-cpu` level and on bf16 ones,
//! and `--native`'s on an f16 copy of the f32 one.
//!
//! Needs /dev/kvm and the guest images (scripts/test.sh builds them first).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    kore_e2e::repo_root().join("appliance/engine/tests/fixtures").join(name)
}

/// The prompts and transformers' greedy continuations of a fixture's reference.safetensors.
fn reference(dir: &Path) -> Vec<(Vec<i32>, Vec<i32>)> {
    let t = Tensors::read(&dir.join("reference.safetensors"));
    (0..)
        .map_while(|i| Some((t.i32s(&format!("prompt_{i}"))?, t.i32s(&format!("generated_{i}"))?)))
        .collect()
}

/// A safetensors file read plainly (header JSON + little-endian data).
struct Tensors {
    header: serde_json::Map<String, Value>,
    data: Vec<u8>,
}

impl Tensors {
    fn read(path: &Path) -> Tensors {
        let bytes = std::fs::read(path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        Tensors { header: header.as_object().unwrap().clone(), data: bytes[8 + n..].to_vec() }
    }

    fn range(&self, name: &str) -> Option<(&str, std::ops::Range<usize>)> {
        let t = self.header.get(name)?;
        let off = t["data_offsets"].as_array()?;
        let (a, b) = (off[0].as_u64()? as usize, off[1].as_u64()? as usize);
        Some((t["dtype"].as_str()?, a..b))
    }

    fn i32s(&self, name: &str) -> Option<Vec<i32>> {
        let (dtype, r) = self.range(name)?;
        assert_eq!(dtype, "I32", "{name}");
        Some(self.data[r].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
    }

    /// A copy with every F32 tensor stored as F16 (the same header order and names).
    fn to_f16(&self) -> Vec<u8> {
        let mut names: Vec<&String> = self.header.keys().filter(|k| *k != "__metadata__").collect();
        names.sort_by_key(|n| self.range(n).unwrap().1.start);
        let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
        for name in names {
            let (dtype, r) = self.range(name).unwrap();
            let start = data.len();
            let mut entry = self.header[name.as_str()].clone();
            if dtype == "F32" {
                for c in self.data[r].chunks(4) {
                    let v = f32::from_le_bytes(c.try_into().unwrap());
                    data.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
                }
                entry["dtype"] = "F16".into();
            } else {
                data.extend_from_slice(&self.data[r]);
            }
            entry["data_offsets"] = serde_json::json!([start, data.len()]);
            header.insert(name.clone(), entry);
        }
        let mut head = serde_json::to_vec(&Value::Object(header)).unwrap();
        head.resize(head.len().div_ceil(8) * 8, b' ');
        let mut out = (head.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&head);
        out.extend_from_slice(&data);
        out
    }
}

/// A Hugging Face directory of the fixture's config and weights, with a small tokenizer
/// (the prompts are given as ids; the tokenizer only decodes).
fn hf_dir(fixture_dir: &Path, into: &Path, f16: bool) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    std::fs::copy(fixture_dir.join("config.json"), into.join("config.json")).unwrap();
    let weights = fixture_dir.join("model.safetensors");
    if f16 {
        std::fs::write(into.join("model.safetensors"), Tensors::read(&weights).to_f16()).unwrap();
    } else {
        std::fs::copy(&weights, into.join("model.safetensors")).unwrap();
    }
    let tokenizer =
        kore_e2e::repo_root().join("appliance/tokenizer/tests/data/small_tokenizer.json");
    std::fs::copy(tokenizer, into.join("tokenizer.json")).unwrap();
    into.to_path_buf()
}

fn generate(model: &Path, prompt: &[i32], n: usize, runtime: &Path, native: bool) -> Value {
    generate_at(model, prompt, n, runtime, native, "host")
}

fn generate_at(
    model: &Path,
    prompt: &[i32],
    n: usize,
    runtime: &Path,
    native: bool,
    guest_cpu: &str,
) -> Value {
    let ids = prompt.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(kore_e2e::kore_launch());
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") && !key.starts_with("KORE_GUEST_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["generate", "--model", model.to_str().unwrap(), "--prompt-ids", &ids])
        .args(["--max-tokens", &n.to_string(), "--mtp", "0", "--json"])
        .args(["--guest-cpu", guest_cpu])
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .env("KORE_RUNTIME_DIR", runtime);
    if native {
        cmd.arg("--native");
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kore-launch failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<i32> {
    v["token_ids"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap() as i32).collect()
}

#[test]
fn f32_and_bf16_checkpoints_in_the_guest_equal_transformers() {
    kore_e2e::require_kvm();
    let tmp = tempfile::tempdir().unwrap();
    for name in ["mixed_f32_untied", "linear_bf16_tied", "moe_f32_untied", "moe_bf16_tied_mm_fused"]
    {
        let dir = hf_dir(&fixture(name), &tmp.path().join(name), false);
        let cases = reference(&fixture(name));
        assert!(!cases.is_empty(), "{name}: no reference cases");
        // Every guest CPU level for the f32 checkpoint (kernel paths avx512vnni, avx2, generic).
        let levels: &[&str] =
            if name.contains("f32") { &["host", "x86-64-v3", "x86-64-v2"] } else { &["host"] };
        for level in levels {
            for (i, (prompt, want)) in cases.iter().enumerate() {
                let rt = tmp.path().join("rt");
                let vm = generate_at(&dir, prompt, want.len(), &rt, false, level);
                assert_eq!(&ids(&vm), want, "{name} prompt {i} at {level}: guest vs transformers");
            }
        }
    }
}

#[test]
fn an_f16_checkpoint_in_the_guest_equals_native() {
    kore_e2e::require_kvm();
    let tmp = tempfile::tempdir().unwrap();
    let dir = hf_dir(&fixture("mixed_f32_untied"), &tmp.path().join("f16"), true);
    let rt = tmp.path().join("rt");
    for (prompt, want) in reference(&fixture("mixed_f32_untied")) {
        let vm = generate(&dir, &prompt, want.len(), &rt, false);
        let native = generate(&dir, &prompt, want.len(), &rt, true);
        assert_eq!(ids(&vm), ids(&native), "f16: guest vs native");
        assert_eq!(ids(&vm).len(), want.len());
    }
    // The import kept the dtype: the cached pack's weights are F16, not converted.
    let packs: Vec<_> = std::fs::read_dir(rt.join("packs")).unwrap().flatten().collect();
    let weights = Tensors::read(&packs[0].path().join("weights.safetensors"));
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        let t = weights.range(name).unwrap_or_else(|| panic!("{name} in the pack"));
        assert_eq!(t.0, "F16", "{name}");
    }
}
