//! `kore-launch generate` through the appliance equals `generate --native`:
//! the same request goes through the chat protocol to kore-service and the
//! kore-appliance adapters, in-process (`KORE_APPLIANCE=native`) here, and in
//! the Kore VM where the guest images and KVM exist (tests/appliance_vm.rs).
//! Greedy ids and text must be identical; sampling with a seed too (both
//! paths use kore-engine's sampler with the same parameters).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn tiny_hf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf")
}

fn kore(args: &[&str], appliance: Option<&str>) -> Output {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    cmd.args(args).env_remove("KORE_APPLIANCE");
    // Never attach to an appliance a developer left running.
    let dir = std::env::temp_dir().join(format!("kore-gen-appliance-{}", std::process::id()));
    cmd.env("KORE_RUNTIME_DIR", &dir).env("XDG_RUNTIME_DIR", &dir);
    if let Some(a) = appliance {
        cmd.env("KORE_APPLIANCE", a);
    }
    cmd.output().expect("run kore-launch")
}

fn last_json(out: &Output) -> Value {
    assert!(out.status.success(), "kore-launch failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

fn both(extra: &[&str]) -> (Value, Value) {
    let model = tiny_hf();
    let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let via_protocol = last_json(&kore(&args, Some("native")));
    args.push("--native");
    let direct = last_json(&kore(&args, None));
    (direct, via_protocol)
}

fn assert_same(direct: &Value, via: &Value) {
    assert!(!direct["token_ids"].as_array().unwrap().is_empty());
    assert_eq!(direct["token_ids"], via["token_ids"]);
    assert_eq!(direct["text"], via["text"]);
    assert_eq!(direct["stop_reason"], via["stop_reason"]);
    assert_eq!(direct["stats"]["prompt_tokens"], via["stats"]["prompt_tokens"]);
    assert_eq!(direct["stats"]["generated_tokens"], via["stats"]["generated_tokens"]);
}

#[test]
fn greedy_prompt_text_through_the_protocol_equals_native() {
    let (direct, via) = both(&[
        "--prompt",
        "ROMEO:\nWhat light through yonder window",
        "--max-tokens",
        "48",
        "--mtp",
        "0",
    ]);
    assert_same(&direct, &via);
    let n = via["token_ids"].as_array().unwrap().len();
    assert_eq!(via["stats"]["generated_tokens"], n);
    assert!(n == 48 || via["stop_reason"] == "stop_token", "{via}");
}

#[test]
fn greedy_prompt_ids_through_the_protocol_equal_native() {
    let (direct, via) =
        both(&["--prompt-ids", "4071,882,198,11,4072", "--max-tokens", "20", "--mtp", "0"]);
    assert_same(&direct, &via);
}

#[test]
fn seeded_sampling_through_the_protocol_equals_native() {
    let (direct, via) = both(&[
        "--prompt",
        "KING LEAR:\n",
        "--max-tokens",
        "24",
        "--temperature",
        "0.9",
        "--top-k",
        "30",
        "--top-p",
        "0.95",
        "--seed",
        "11",
        "--mtp",
        "0",
    ]);
    assert_same(&direct, &via);
}

#[test]
fn appliance_errors_are_one_line_and_non_zero() {
    let model = tiny_hf();
    let m = model.to_str().unwrap();
    let out = kore(&["generate", "--model", m, "--prompt-ids", "999999", "--json"], Some("native"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad_request") && err.contains("999999"), "{err}");
    let out = kore(&["generate", "--model", "/nonexistent/model", "--prompt", "x"], Some("native"));
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}
