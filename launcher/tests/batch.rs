//! `kore-launch batch` end to end on the launcher's fake engine
//! (`KORE_LAUNCH_FAKE=echo`, kore-service's real protocol code; the engine
//! answers each chat line with its message and each raw prompt with itself):
//! 200 lines with one bad line, input order, the error row, resume after a
//! kill, stdin to stdout.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const BAD_LINE: usize = 58; // 1-based

fn kore() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kore-launch"));
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.env("XDG_CONFIG_HOME", "/nonexistent").env("KORE_LAUNCH_FAKE", "echo");
    cmd
}

/// 200 lines: chat and raw prompts with ids, some without ids, one broken.
fn input() -> (String, Vec<(Value, String)>) {
    let mut text = String::new();
    let mut expect = Vec::new();
    for n in 1..=200usize {
        if n == BAD_LINE {
            text.push_str("{\"id\": \"q58\", \"messages\": [oops\n");
            continue;
        }
        let msg = format!("message number {n}");
        let (line, name) = match n % 4 {
            0 => (
                json!({"id": format!("q{n}"), "prompt": msg, "max_tokens": 64}),
                json!({"id": format!("q{n}")}),
            ),
            1 => (
                json!({"messages": [{"role": "user", "content": msg}], "thinking": false}),
                json!({"line": n}),
            ),
            _ => (
                json!({"id": n, "messages": [{"role": "user", "content": msg}], "thinking": false}),
                json!({"id": n}),
            ),
        };
        text.push_str(&format!("{line}\n"));
        expect.push((name, msg));
    }
    (text, expect)
}

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("read OUT")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each OUT line is JSON"))
        .collect()
}

/// Every line has its row in input order; good lines carry their echoed text.
fn check(rows: &[Value], expect: &[(Value, String)]) {
    assert_eq!(rows.len(), 200, "one row per input line");
    let mut good = expect.iter();
    for (i, row) in rows.iter().enumerate() {
        if i + 1 == BAD_LINE {
            assert_eq!(row["line"], BAD_LINE, "{row}");
            assert_eq!(row["error"]["code"], "bad_json", "{row}");
            continue;
        }
        let (name, msg) = good.next().expect("an expected row");
        let (k, v) = name.as_object().and_then(|o| o.iter().next()).expect("name");
        assert_eq!(&row[k], v, "row {} out of order: {row}", i + 1);
        assert!(row.get("error").is_none(), "{row}");
        assert_eq!(row["text"], msg.as_str(), "{row}");
        assert_eq!(row["finish"], "stop", "{row}");
        assert_eq!(
            row["stats"]["generated_tokens"],
            row["token_ids"].as_array().unwrap().len(),
            "{row}"
        );
    }
}

#[test]
fn two_hundred_lines_with_a_bad_one_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (text, expect) = input();
    let (inp, out) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    std::fs::write(&inp, &text).unwrap();
    let o = kore()
        .arg("batch")
        .arg(&inp)
        .arg("-o")
        .arg(&out)
        .args(["--concurrency", "8"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("199 answered, 1 errors"), "{stderr}");
    check(&rows(&out), &expect);
    assert!(!dir.path().join("out.jsonl.partial").exists());

    // --fail-on-error turns the bad line into a non-zero exit; the rest is reused.
    let o =
        kore().arg("batch").arg(&inp).arg("-o").arg(&out).arg("--fail-on-error").output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("199 reused"), "{stderr}");
    check(&rows(&out), &expect);
}

#[test]
fn a_killed_run_resumes_without_losing_or_repeating() {
    let dir = tempfile::tempdir().unwrap();
    let (text, expect) = input();
    let (inp, out) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    let partial = dir.path().join("out.jsonl.partial");
    std::fs::write(&inp, &text).unwrap();
    let mut child = kore()
        .env("KORE_LAUNCH_FAKE_DELAY_MS", "2")
        .arg("batch")
        .arg(&inp)
        .arg("-o")
        .arg(&out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once at least 40 rows are written (and it is not finished).
    loop {
        let n = std::fs::read_to_string(&partial).map(|s| s.lines().count()).unwrap_or(0);
        if n >= 40 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the slow batch ended before it could be killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists(), "OUT appears only when the batch is complete");
    let done_before = rows(&partial).iter().filter(|r| r.get("error").is_none()).count();

    let o = kore().arg("batch").arg(&inp).arg("-o").arg(&out).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    check(&rows(&out), &expect);
    let answered = 199 - done_before;
    assert!(
        stderr.contains(&format!("{answered} answered, 1 errors, {done_before} reused")),
        "{done_before} rows were done before the kill: {stderr}"
    );
}

#[test]
fn stdin_to_stdout() {
    let mut child = kore()
        .args(["batch", "-", "-o", "-", "--max-tokens", "3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = "{\"id\":\"a\",\"prompt\":\"hello\"}\n\n[1,2]\n{\"id\":\"c\",\"prompt\":\"x\",\"max_tokens\":0}\n";
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "the blank line has no row: {rows:?}");
    // --max-tokens applies to the line without its own max_tokens.
    assert_eq!(rows[0]["id"], "a");
    assert_eq!(rows[0]["text"], "hel");
    assert_eq!(rows[0]["finish"], "length");
    assert_eq!(rows[1]["line"], 3);
    assert_eq!(rows[1]["error"]["code"], "bad_json");
    assert_eq!(rows[2]["id"], "c");
    assert_eq!(rows[2]["error"]["code"], "bad_request", "max_tokens 0 is refused by the service");
}
