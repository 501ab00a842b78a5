//! `generate`, `chat`, `batch` and `serve` on a mixture-of-experts pack, in the Kore VM and
//! natively: a small synthetic Qwen3.5 MoE pack (`pack synth --preset qwen3.5-moe-tiny`, 32
//! experts, 4 per token) gives the same tokens in the guest as in-process; a batch of
//! sequences decoding together (their tokens grouped by expert in one forward) gives each
//! sequence's `generate` tokens; `serve` answers an OpenAI chat request with the same text in
//! both placements.
//!
//! Needs /dev/kvm, 2 MiB hugepages and the guest images (scripts/test.sh builds them first).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `kore-launch ARGS` with no inherited KORE_* settings but the guest overrides.
fn kore(args: &[&str], runtime: &Path) -> Command {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") && !key.starts_with("KORE_GUEST_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(args).env("XDG_CONFIG_HOME", "/nonexistent").env("KORE_RUNTIME_DIR", runtime);
    cmd
}

fn last_json(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kore-launch failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// `args` natively and in the VM; returns (native, vm).
fn both(args: &[&str], runtime: &Path) -> (Value, Value) {
    let vm = last_json(&kore(args, runtime).output().unwrap());
    let mut native_args = args.to_vec();
    native_args.push("--native");
    let native = last_json(&kore(&native_args, runtime).output().unwrap());
    (native, vm)
}

/// The small MoE pack, synthesized into `dir`.
fn moe_pack(dir: &Path, runtime: &Path) -> String {
    let out = dir.join("moe-tiny");
    let o = kore(
        &[
            "pack",
            "synth",
            "--preset",
            "qwen3.5-moe-tiny",
            "--seed",
            "3",
            "-o",
            out.to_str().unwrap(),
        ],
        runtime,
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "pack synth: {}", String::from_utf8_lossy(&o.stderr));
    let toml = std::fs::read_to_string(out.join("pack.toml")).unwrap();
    assert!(toml.contains("[config.moe]"), "not an MoE pack:\n{toml}");
    out.to_str().unwrap().to_string()
}

#[test]
fn generate_chat_batch_and_serve_on_an_moe_pack_in_the_vm_and_natively() {
    kore_e2e::guest_images();
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("rt");
    let pack = moe_pack(dir.path(), &runtime);
    let p = pack.as_str();

    // generate: the guest's greedy tokens are the in-process engine's.
    let prompts = ["ROMEO:\nBut soft", "JULIET:\nO Romeo", "KING:\nMy lord"];
    let mut single = Vec::new();
    for prompt in prompts {
        let args = ["generate", "--model", p, "--prompt", prompt, "--max-tokens", "8"];
        let (native, vm) = both(&[&args[..], &["--mtp", "0", "--json"]].concat(), &runtime);
        let ids = native["token_ids"].as_array().expect("token ids").clone();
        assert!(!ids.is_empty(), "{native}");
        assert_eq!(vm["token_ids"], native["token_ids"], "vm {vm}\nnative {native}");
        single.push(native);
    }

    // chat: one-shot JSON, the same answer in both placements.
    let chat = ["chat", "--model", p, "-p", "Speak.", "--max-tokens", "6", "--json"];
    let (native, vm) = both(&chat, &runtime);
    let n = native["stats"]["generated_tokens"].as_u64().unwrap();
    assert!((1..=6).contains(&n), "{native}");
    assert_eq!((&vm["text"], &vm["thinking"]), (&native["text"], &native["thinking"]));

    // batch: the three prompts decode together (one forward a step, their tokens
    // grouped by expert), and each row equals its sequence's `generate`.
    let (input, out_vm, out_native) =
        (dir.path().join("in.jsonl"), dir.path().join("vm.jsonl"), dir.path().join("n.jsonl"));
    let lines: String = prompts
        .iter()
        .enumerate()
        .map(|(i, q)| format!("{}\n", serde_json::json!({"id": i, "prompt": q, "max_tokens": 8})))
        .collect();
    std::fs::write(&input, lines).unwrap();
    for (out, native) in [(&out_vm, false), (&out_native, true)] {
        let mut args = vec!["batch", input.to_str().unwrap(), "-o", out.to_str().unwrap()];
        args.extend(["--model", p, "--concurrency", "3"]);
        if native {
            args.push("--native");
        }
        let o = kore(&args, &runtime).output().unwrap();
        assert!(o.status.success(), "batch: {}", String::from_utf8_lossy(&o.stderr));
        let rows = kore_e2e::read_jsonl(out);
        assert_eq!(rows.len(), prompts.len(), "{rows:?}");
        for (row, g) in rows.iter().zip(&single) {
            assert_eq!(row["token_ids"], g["token_ids"], "native {native}: {row}\ngenerate {g}");
        }
    }

    // serve: an OpenAI chat request, greedy, answered alike in both placements.
    let body = serde_json::json!({
        "model": "qwen3.5-moe-tiny",
        "messages": [{"role": "user", "content": "Speak."}],
        "max_tokens": 6,
        "temperature": 0,
    });
    let mut answers = Vec::new();
    for native in [true, false] {
        let server = Server::start(p, native, &runtime);
        let v = server.post("/v1/chat/completions", &body);
        let text = v["choices"][0]["message"]["content"].as_str().map(str::to_owned);
        assert!(text.is_some(), "{v}");
        let used = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        assert!((1..=6).contains(&used), "{v}");
        answers.push(v["choices"][0]["message"].clone());
    }
    assert_eq!(answers[0], answers[1], "native vs guest");
}

/// A running `kore-launch serve --port 0`, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(pack: &str, native: bool, runtime: &Path) -> Server {
        let mut args = vec!["serve", "--model", pack, "--port", "0"];
        if native {
            args.push("--native");
        }
        let mut child = kore(&args, runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start serve");
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut seen = String::new();
            let mut buf = [0u8; 512];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                if let Some(at) = seen.find("http://") {
                    let rest = &seen[at + 7..];
                    if let Some(end) = rest.find('/') {
                        let _ = tx.send(rest[..end].to_string());
                    }
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(addr) = rx.recv_timeout(Duration::from_millis(200)) {
                return Server { child, addr };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("serve exited early: {status}");
            }
            assert!(Instant::now() < deadline, "serve printed no address in 180 s");
        }
    }

    /// `POST path` with a JSON body; the JSON response (status 200 required).
    fn post(&self, path: &str, body: &Value) -> Value {
        let body = body.to_string();
        let mut s = TcpStream::connect(&self.addr).expect("connect to serve");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("read the response");
        let (head, payload) = resp.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
        serde_json::from_str(payload).unwrap_or_else(|e| panic!("not JSON ({e}): {payload}"))
    }
}

impl Drop for Server {
    /// SIGTERM (serve stops its VM and exits), SIGKILL after 30 s.
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
