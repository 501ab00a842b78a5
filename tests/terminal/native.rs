//! chat and batch with the real engine in-process (`--native`) on the tiny
//! model (model-packs/tiny when it holds a pack, else the trained HF
//! directory model-packs/tiny-hf): the one-shot JSON, a batch whose raw-prompt
//! rows equal `generate --native` (an independent decode loop) token for
//! token, and the interactive chat in tmux.

#[allow(dead_code)] // the chat tests use more of it
mod tmux_support;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use tmux_support::{sh_quote, Tmux};

fn tiny() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("model-packs");
    if root.join("tiny/pack.toml").is_file() {
        root.join("tiny")
    } else {
        root.join("tiny-hf")
    }
}

fn kore(args: &[&str]) -> Output {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.env("XDG_CONFIG_HOME", "/nonexistent").env("KORE_RUNTIME_DIR", "/nonexistent/kore");
    cmd.args(args).output().expect("run kore-launch")
}

fn json_of(o: &Output) -> Value {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stdout {out}\nstderr {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(out.lines().last().expect("a JSON line")).expect("JSON")
}

#[test]
fn one_shot_json() {
    let model = tiny();
    let m = model.to_str().unwrap();
    let v = json_of(&kore(&[
        "chat",
        "--native",
        "--model",
        m,
        "-p",
        "ROMEO.",
        "--max-tokens",
        "12",
        "--json",
    ]));
    let stats = &v["stats"];
    let n = stats["generated_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&n), "{v}");
    assert_eq!(stats["context_used"], stats["prompt_tokens"].as_u64().unwrap() + n, "{v}");
    assert!(v["text"].is_string() && v["thinking"].is_string(), "{v}");
    assert!(
        !(v["text"].as_str().unwrap().is_empty() && v["thinking"].as_str().unwrap().is_empty()),
        "{v}"
    );
}

#[test]
fn batch_rows_equal_generate() {
    let model = tiny();
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    let prompts = ["ROMEO.\nBut soft, what light", "KING.\nMy lord, the", "HAMLET.\nTo be"];
    let mut text = String::new();
    for (i, p) in prompts.iter().enumerate() {
        text.push_str(&format!(
            "{}\n",
            serde_json::json!({"id": i, "prompt": p, "max_tokens": 10})
        ));
    }
    text.push_str("not json\n");
    text.push_str("{\"id\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"Speak.\"}],\"max_tokens\":6}\n");
    std::fs::write(&input, text).unwrap();
    let o = kore(&[
        "batch",
        "--native",
        "--model",
        m,
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = kore_e2e::read_jsonl(&out);
    assert_eq!(rows.len(), 5);
    for (i, p) in prompts.iter().enumerate() {
        let g = json_of(&kore(&[
            "generate",
            "--native",
            "--model",
            m,
            "--prompt",
            p,
            "--max-tokens",
            "10",
            "--json",
        ]));
        assert_eq!(rows[i]["id"], i);
        assert_eq!(rows[i]["token_ids"], g["token_ids"], "prompt {p:?}");
        assert_eq!(rows[i]["text"], g["text"], "prompt {p:?}");
    }
    assert_eq!(rows[3]["line"], 4);
    assert_eq!(rows[3]["error"]["code"], "bad_json");
    assert_eq!(rows[4]["id"], "chat");
    let n = rows[4]["stats"]["generated_tokens"].as_u64().unwrap();
    assert!((1..=6).contains(&n), "{}", rows[4]);
}

#[test]
fn interactive_chat_in_tmux() {
    let model = tiny();
    let cmd = format!(
        "env -u KORE_CONFIG -u KORE_LAUNCH_FAKE XDG_CONFIG_HOME=/nonexistent KORE_RUNTIME_DIR=/nonexistent/kore {} chat --native --model {} --max-tokens 24",
        sh_quote(kore_e2e::kore_launch().to_str().unwrap()),
        sh_quote(model.to_str().unwrap())
    );
    let t = Tmux::start("native", &cmd);
    t.wait_for("the banner", |s| s.contains("/help for commands"));
    t.type_line("/think off");
    t.type_line("ROMEO. Good morrow!");
    let s = t.wait_for("the status line", |s| {
        s.lines()
            .any(|l| l.starts_with(|c: char| c.is_ascii_digit()) && l.contains(" tokens a step"))
    });
    assert!(s.contains(" · context "), "{s}");
    t.type_line("/quit");
    t.wait_for("the exit", |s| s.contains("EXITED:0"));
}
