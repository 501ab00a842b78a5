//! The prefix cache in the Kore guest: a 10-turn chat on the default pack
//! against an appliance kept up with `kore-launch up`, one `batch` run per
//! turn (each a new process attaching to it; a `session` name on odd turns,
//! which changes nothing). Turn k's `cached_tokens` covers the earlier turns
//! (up to the previous generation prompt's `<think>`), and each answer equals
//! an uncached run of the same conversation (a one-line `batch --native`: a
//! new process whose cache starts empty).
//! Also `bench --concurrency` in the guest and natively. Needs the guest
//! images and KVM (fails, never skips, without them).

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

fn kore(args: &[&str], runtime: &Path) -> std::process::Output {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") && !key.starts_with("KORE_GUEST_") {
            cmd.env_remove(key);
        }
    }
    // The prefix cache's files stay in the test's directory, never the user's cache.
    cmd.args(args).env("XDG_CONFIG_HOME", "/nonexistent").env("KORE_RUNTIME_DIR", runtime);
    cmd.env("XDG_CACHE_HOME", runtime.join("xdg-cache"));
    cmd.output().expect("run kore-launch")
}

/// Runs one request line through `batch` (attached to the appliance, or
/// natively in a new process with `native`: the pack).
fn ask(line: &Value, dir: &Path, runtime: &Path, native: Option<&str>) -> Value {
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    std::fs::write(&input, format!("{line}\n")).unwrap();
    let _ = std::fs::remove_file(&output);
    let mut args = vec!["batch", input.to_str().unwrap(), "-o", output.to_str().unwrap()];
    if let Some(pack) = native {
        // Uncached: no prefix cache at all (memory or disk).
        args.extend(["--native", "--model", pack, "--cache", "0", "--cache-disk", "0"]);
    }
    let o = kore(&args, runtime);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let row: Value =
        serde_json::from_str(std::fs::read_to_string(&output).unwrap().trim()).unwrap();
    assert!(row.get("error").is_none(), "{row}");
    row
}

#[test]
fn ten_turn_chat_in_the_guest_reuses_earlier_turns() {
    let kore_e2e::VmScratch { pack, dir, runtime } = kore_e2e::VmScratch::new();
    let o = kore(&["up", "--model", &pack], &runtime);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    struct Down<'a>(&'a Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = kore(&["down"], self.0);
        }
    }
    let _down = Down(&runtime);
    let mut messages: Vec<Value> = Vec::new();
    let mut prev_prompt = 0u64;
    for k in 0..10 {
        messages.push(json!({"role": "user", "content": format!("Turn {k}: what news?")}));
        let fresh = json!({"id": k, "messages": messages, "thinking": false, "max_tokens": 10});
        let mut with = fresh.clone();
        if k % 2 == 1 {
            with["session"] = json!("vm-chat");
        }
        let a = ask(&with, dir.path(), &runtime, None);
        let b = ask(&fresh, dir.path(), &runtime, Some(pack.as_str()));
        assert_eq!(a["token_ids"], b["token_ids"], "turn {k}: guest (cached) vs uncached");
        let cached = a["stats"]["cached_tokens"].as_u64().unwrap();
        let prompt = a["stats"]["prompt_tokens"].as_u64().unwrap();
        eprintln!("guest turn {k}: prompt {prompt} tokens, {cached} cached");
        if k == 0 {
            assert_eq!(cached, 0);
        } else {
            assert!(cached + 4 >= prev_prompt && cached < prev_prompt, "turn {k}: {cached}");
        }
        assert_eq!(b["stats"]["cached_tokens"], 0);
        prev_prompt = prompt;
        messages.push(json!({"role": "assistant", "content": a["text"]}));
    }
}

#[test]
fn bench_concurrency_in_the_guest_and_natively() {
    let kore_e2e::VmScratch { pack, dir: _dir, runtime } = kore_e2e::VmScratch::new();
    let args = ["bench", "--model", &pack, "--threads", "2", "--concurrency", "3", "--json"];
    for native in [false, true] {
        let mut a = args.to_vec();
        if native {
            a.push("--native");
        }
        let o = kore(&a, &runtime);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(v["concurrency"], 3, "native={native}: {v}");
        let (one, all) = (
            v["decode_tok_per_s"].as_f64().unwrap(),
            v["aggregate_decode_tok_per_s"].as_f64().unwrap(),
        );
        assert!(one > 0.0 && (all - 3.0 * one).abs() <= 1e-6 * all, "native={native}: {v}");
    }
    let o = kore(
        &["bench", "--native", "--model", &pack, "--mtp", "2", "--concurrency", "2"],
        &runtime,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("one sequence at a time"));
}
