//! `--model PACK_DIR` end to end: `kore-launch pack import` of a transformers
//! reference fixture, then `generate --native` on the bf16 pack gives
//! transformers' own greedy ids (a bf16 pack is exact), the NVFP4 pack loads
//! and generates, `tokenize` reads the pack's tokenizer, and broken packs fail
//! with a one-line error naming the file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kore_engine::safetensors::Safetensors;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/engine/tests/fixtures").join(name)
}

fn kore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kore-launch"))
        .args(args)
        .env(
            "KORE_CACHE_DIR",
            std::env::temp_dir().join(format!("kore-cache-{}", std::process::id())),
        )
        .output()
        .expect("run kore-launch")
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kore-launch-packs-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn last_json(out: &Output) -> serde_json::Value {
    let stdout = ok(out);
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success(), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "stderr: {err}");
    lines[0].to_string()
}

fn ids(st: &Safetensors<'_>, name: &str) -> Vec<u32> {
    let t = st.get(name).unwrap();
    t.data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect()
}

fn generate(model: &Path, prompt: &[u32], max: usize) -> Vec<u32> {
    let prompt: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let max = max.to_string();
    let m = model.to_str().unwrap();
    let args = [
        "generate",
        "--native",
        "--model",
        m,
        "--prompt-ids",
        &prompt.join(","),
        "--max-tokens",
        &max,
        "--mtp",
        "0",
        "--json",
    ];
    let v = last_json(&kore(&args));
    v["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn import(src: &Path, out: &Path, quant: &str) {
    let s = ok(&kore(&[
        "pack",
        "import",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--quant",
        quant,
    ]));
    assert!(s.contains("tensors"), "{s}");
    assert!(out.join("pack.toml").is_file());
}

#[test]
fn bf16_pack_generates_exactly_what_transformers_does() {
    // The fixture has no tokenizer, which a pack requires: add a byte-level one.
    let fixture_dir = fixture("mixed_bf16_mm_sharded_mtp");
    let src = temp_dir("src");
    std::fs::create_dir_all(&src).unwrap();
    for e in std::fs::read_dir(&fixture_dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    std::fs::write(
        src.join("tokenizer.json"),
        kore_pack::synth::byte_level_tokenizer(256, &[]).unwrap(),
    )
    .unwrap();
    let bytes = std::fs::read(src.join("reference.safetensors")).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    let (prompt, want) = (ids(&st, "prompt_2"), ids(&st, "generated_2"));
    let pack = temp_dir("bf16");
    import(&src, &pack, "bf16");
    ok(&kore(&["pack", "verify", pack.to_str().unwrap()]));
    assert_eq!(generate(&pack, &prompt, want.len()), want, "bf16 pack vs transformers");
    assert_eq!(generate(&src, &prompt, want.len()), want, "HF directory vs transformers");

    let nv = temp_dir("nvfp4");
    import(&src, &nv, "nvfp4");
    let inspect = last_json(&kore(&["pack", "inspect", nv.to_str().unwrap(), "--json"]));
    assert!(inspect["nvfp4_modules"].as_u64().unwrap() > 0, "{inspect}");
    let got = generate(&nv, &prompt, want.len());
    assert_eq!(got.len(), want.len());
    for d in [src, pack, nv] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn tokenize_reads_the_packs_tokenizer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf");
    let pack = temp_dir("tok");
    import(&src, &pack, "nvfp4");
    let text = "ROMEO.\nBut soft, what light<|im_end|>";
    let from = |m: &Path| {
        last_json(&kore(&["tokenize", "--model", m.to_str().unwrap(), "--text", text, "--json"]))
    };
    let (a, b) = (from(&pack), from(&src));
    assert_eq!(a, b);
    assert!(a["ids"].as_array().unwrap().contains(&serde_json::json!(4072)), "{a}");
    std::fs::remove_dir_all(pack).unwrap();
}

#[test]
fn broken_packs_fail_with_one_line_naming_the_file() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf");
    let pack = temp_dir("broken");
    import(&src, &pack, "nvfp4");
    let p = pack.to_str().unwrap();
    let gen = |p: &str| {
        kore(&["generate", "--native", "--model", p, "--prompt", "KING.", "--max-tokens", "2"])
    };

    let weights = pack.join("weights.safetensors");
    let full = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &full[..full.len() / 2]).unwrap();
    let err = one_line_error(&gen(p));
    assert!(err.contains("weights.safetensors") && err.contains("truncated"), "{err}");
    std::fs::write(&weights, &full).unwrap();

    // Same size, one byte changed: only the digest in pack.toml can tell.
    let mut flipped = full.clone();
    *flipped.last_mut().unwrap() ^= 1;
    std::fs::write(&weights, &flipped).unwrap();
    let out = gen(p);
    assert_eq!(out.status.code(), Some(3));
    let err = one_line_error(&out);
    assert!(err.contains("weights.safetensors") && err.contains("sha256 mismatch"), "{err}");
    std::fs::write(&weights, &full).unwrap();

    let tok = pack.join("tokenizer.json");
    std::fs::rename(&tok, pack.join("moved.json")).unwrap();
    let err = one_line_error(&gen(p));
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::rename(pack.join("moved.json"), &tok).unwrap();

    let manifest = pack.join("pack.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("format_version = 1", "format_version = 99")).unwrap();
    let err = one_line_error(&gen(p));
    assert!(err.contains("pack.toml") && err.contains("newer"), "{err}");
    std::fs::write(&manifest, &text).unwrap();

    let out = gen(p);
    ok(&out);
    std::fs::remove_dir_all(pack).unwrap();
}

/// A line such as `ANTONY.` or `FIRST CITIZEN.`: a speaker heading of a play.
fn is_speaker_heading(line: &str) -> bool {
    let name = line.trim().strip_suffix('.').unwrap_or("");
    name.len() >= 2 && name.chars().all(|c| c.is_ascii_uppercase() || c == ' ')
}

#[test]
fn default_pack_continues_a_shakespeare_prompt() {
    // From a subdirectory of the checkout, with no --model: the default pack is found.
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_kore-launch"))
        .current_dir(launcher)
        .args([
            "generate",
            "--native",
            "--prompt",
            "ROMEO.\nBut soft, what light",
            "--max-tokens",
            "40",
            "--json",
        ])
        .output()
        .unwrap();
    let v = last_json(&out);
    let text = v["text"].as_str().unwrap();
    assert_eq!(v["stats"]["generated_tokens"].as_u64(), Some(40), "{v}");
    assert!(text.lines().any(is_speaker_heading), "no speaker heading in {text:?}");
    let words = text.split_whitespace().filter(|w| w.chars().any(|c| c.is_ascii_alphabetic()));
    assert!(words.count() >= 10, "{text:?}");
}
