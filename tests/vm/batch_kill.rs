//! A 1,000-prompt `batch` in the Kore VM survives its VMM being killed: the
//! VMM process is SIGKILLed twice mid-run, each run ends with a one-line error
//! and keeps the rows it finished (OUT.partial), and the third run resumes:
//! every prompt is answered exactly once, in input order, with the same
//! greedy answer an uninterrupted `--native` run gives. Nothing is left
//! behind: no OUT.partial, no runtime files, no VMM process.
//!
//! Needs /dev/kvm, hugepages and the guest images.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PROMPTS: usize = 1000;

fn batch(rt: &Path, input: &Path, out: &Path, native: bool) -> Command {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    cmd.args(["batch", input.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .args(["--model", kore_e2e::tiny_pack().to_str().unwrap(), "--concurrency", "4"])
        .env_remove("KORE_APPLIANCE")
        .env("KORE_RUNTIME_DIR", rt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if native {
        cmd.arg("--native");
    }
    cmd
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

/// The `kore-vmm` child of `parent`, if it runs.
fn vmm_child(parent: u32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent && kore_e2e::is_vmm_process(&e.path())).then_some(pid)
    })
}

/// Runs a batch until OUT.partial has `rows` rows, then kills its VMM.
fn run_and_kill_vmm(mut child: Child, partial: &Path, rows: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while lines(partial) < rows {
        assert!(child.try_wait().unwrap().is_none(), "the batch ended before {rows} rows");
        assert!(Instant::now() < deadline, "no {rows} rows within 300 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let vmm = vmm_child(child.id()).expect("the batch's VMM process");
    // SAFETY: kill with a pid read from /proc just now.
    assert_eq!(unsafe { libc::kill(vmm, libc::SIGKILL) }, 0);
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the batch must fail when its VMM is killed");
    let err = String::from_utf8_lossy(&out.stderr);
    let err_lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(err_lines.len(), 1, "one error line, got: {err}");
}

fn rows(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_batch_resumes_after_its_vmm_is_killed_twice() {
    kore_e2e::require_kvm();
    kore_e2e::guest_images();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let input = dir.path().join("in.jsonl");
    let mut f = std::fs::File::create(&input).unwrap();
    for i in 0..PROMPTS {
        writeln!(f, r#"{{"id":"p{i}","prompt":"KING {i}.","max_tokens":12}}"#).unwrap();
    }
    let out = dir.path().join("out.jsonl");
    let partial = PathBuf::from(format!("{}.partial", out.display()));

    for rows in [150, 500] {
        run_and_kill_vmm(batch(&rt, &input, &out, false).spawn().unwrap(), &partial, rows);
    }
    let last = batch(&rt, &input, &out, false).output().unwrap();
    // The summary line goes to stderr (stdout may carry the rows).
    let stdout = String::from_utf8_lossy(&last.stderr);
    assert!(last.status.success(), "{stdout}");
    assert!(!partial.exists(), "OUT.partial left behind");

    let got = rows(&out);
    assert_eq!(got.len(), PROMPTS, "{stdout}");
    for (i, row) in got.iter().enumerate() {
        assert_eq!(row["id"], format!("p{i}"), "row {i} out of order or duplicated");
        assert!(row.get("error").is_none(), "row {i}: {row}");
    }
    let reused: usize = stdout
        .split(" reused")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reuse count in: {stdout}"));
    assert!(reused >= 500, "the last run reused only {reused} rows: {stdout}");

    let native_out = dir.path().join("native.jsonl");
    let native = batch(&rt, &input, &native_out, true).output().unwrap();
    assert!(native.status.success(), "{}", String::from_utf8_lossy(&native.stderr));
    for (vm, nat) in got.iter().zip(rows(&native_out)) {
        assert_eq!(vm["token_ids"], nat["token_ids"], "{}", vm["id"]);
    }
    let left: Vec<_> = std::fs::read_dir(&rt).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "left in the runtime directory: {left:?}");
}
