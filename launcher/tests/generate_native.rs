//! `kore-launch generate --native` end to end on a reference fixture: the
//! JSON output's greedy ids equal transformers' (fixtures from
//! scripts/reference/gen_fixtures.py), and bad input exits non-zero with a
//! one-line error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kore_engine::safetensors::Safetensors;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/engine/tests/fixtures").join(name)
}

fn kore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kore-launch")).args(args).output().expect("run kore-launch")
}

fn ids(st: &Safetensors<'_>, name: &str) -> Vec<u32> {
    st.get(name)
        .unwrap()
        .data
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {line}"))
}

fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr.clone()).unwrap();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "stderr: {err}");
    lines[0].to_string()
}

#[test]
fn greedy_json_output_matches_transformers() {
    for (name, case) in [("mixed_f32_untied", 1), ("mixed_bf16_mm_sharded_mtp", 2)] {
        let dir = fixture(name);
        let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
        let st = Safetensors::parse(&bytes).unwrap();
        let prompt = ids(&st, &format!("prompt_{case}"));
        let want = ids(&st, &format!("generated_{case}"));
        let prompt_arg: Vec<String> = prompt.iter().map(u32::to_string).collect();
        let max = want.len().to_string();
        let out = kore(&[
            "generate",
            "--native",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &prompt_arg.join(","),
            "--max-tokens",
            &max,
            "--mtp",
            "0",
            "--json",
        ]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let v = last_json(&out);
        let got: Vec<u32> =
            v["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(got, want, "{name}: greedy ids");
        assert!(v["text"].is_string());
        let stats = &v["stats"];
        assert_eq!(stats["prompt_tokens"].as_u64(), Some(prompt.len() as u64));
        assert_eq!(stats["generated_tokens"].as_u64(), Some(want.len() as u64));
        for key in ["prefill_ms", "prefill_tok_per_s", "decode_tok_per_s", "tokens_per_step"] {
            assert!(
                stats[key].as_f64().is_some_and(|x| x >= 0.0),
                "{name}: stats.{key} = {}",
                stats[key]
            );
        }
    }
}

#[test]
fn bad_input_exits_non_zero_with_one_line() {
    let dir = fixture("full_f32_tied_mm");
    let d = dir.to_str().unwrap();
    let e = one_line_error(&kore(&[
        "generate",
        "--native",
        "--model",
        d,
        "--prompt-ids",
        "1,256,2",
        "--json",
    ]));
    assert!(e.contains("256") && e.contains("vocabulary"), "{e}");
    let out = kore(&["generate", "--native", "--model", "/nonexistent/model", "--prompt-ids", "1"]);
    assert_eq!(out.status.code(), Some(3));
    let e = one_line_error(&out);
    assert!(e.contains("/nonexistent/model"), "{e}");
    // No tokenizer.json in the fixture: text prompts are refused clearly.
    let e = one_line_error(&kore(&["generate", "--native", "--model", d, "--prompt", "hello"]));
    assert!(e.contains("tokenizer.json") && e.contains("prompt_ids"), "{e}");
    // The guest boots packs: a Hugging Face directory is imported first; this
    // fixture (extra reference tensors, no tokenizer) cannot be, and the error
    // names it before anything boots.
    let e = one_line_error(&kore(&["generate", "--model", d, "--prompt-ids", "1"]));
    assert!(e.contains("cannot import it as a pack") && e.contains(d), "{e}");
}
