//! `up` / `status` / `down` and attaching, on the launcher's fake engine
//! (`KORE_LAUNCH_FAKE=echo`) in a temporary runtime directory: stale files
//! are cleaned, chat and batch attach to the running appliance (without the
//! fake variable, without `--native` and with guest image paths that do not
//! exist they could not run otherwise), and `down` stops it and removes its
//! files. The same with the Kore VM: tests/appliance_vm.rs.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn kore(rt: &Path, fake: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    // No guest images: a command that does not attach cannot boot a VM either.
    cmd.env("XDG_CONFIG_HOME", "/nonexistent")
        .env("KORE_RUNTIME_DIR", rt)
        .env("KORE_GUEST_KERNEL", "/nonexistent/kore-kernel")
        .env("KORE_GUEST_IMAGE", "/nonexistent/kore-appliance");
    if fake {
        cmd.env("KORE_LAUNCH_FAKE", "echo");
    }
    cmd.args(args).output().expect("run kore-launch")
}

fn json_of(o: &Output) -> Value {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stdout {out}\nstderr {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(out.lines().last().expect("a JSON line")).expect("JSON")
}

/// Stops the appliance even when an assertion failed.
struct Down<'a>(&'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = kore(self.0, false, &["down"]);
    }
}

#[test]
fn up_attach_status_down() {
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("kore");
    std::fs::create_dir_all(&rt).unwrap();
    let _down = Down(&rt);

    // Leftovers of a dead appliance: a pidfile naming a process that is not ours, and a socket.
    std::fs::write(rt.join("kore.pid"), "999999999\n").unwrap();
    std::fs::write(rt.join("kore.sock"), "").unwrap();
    let st = json_of(&kore(&rt, false, &["status", "--json"]));
    assert_eq!(st["running"], false);
    assert!(st["stale"].as_str().unwrap().contains("999999999"), "{st}");

    // Without an appliance, without --native and without guest images nothing can
    // serve: this is what makes the attach checks below meaningful.
    let o = kore(&rt, false, &["chat", "-p", "hi"]);
    assert!(!o.status.success());

    let o = kore(&rt, true, &["up"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cleaning up after an appliance that is gone")
    );
    let st = json_of(&kore(&rt, false, &["status", "--json"]));
    assert_eq!(st["running"], true, "{st}");
    assert_eq!(st["info"]["model"], "fake", "{st}");
    let pid = st["pid"].as_u64().unwrap();
    assert_eq!(std::fs::read_to_string(rt.join("kore.pid")).unwrap().trim(), pid.to_string());

    // A second `up` finds it running.
    let o = kore(&rt, true, &["up"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("already up"), "{o:?}");

    // chat and batch attach (no fake variable here).
    let chat =
        json_of(&kore(&rt, false, &["chat", "-p", "attached?", "--thinking", "off", "--json"]));
    assert_eq!(chat["text"], "attached?");
    let input = dir.path().join("in.jsonl");
    let out = dir.path().join("out.jsonl");
    std::fs::write(&input, "{\"id\":1,\"prompt\":\"one\"}\n{\"id\":2,\"prompt\":\"two\"}\n")
        .unwrap();
    let o = kore(
        &rt,
        false,
        &["batch", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--concurrency", "2"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = kore_e2e::read_jsonl(&out);
    assert_eq!((rows[0]["text"].as_str(), rows[1]["text"].as_str()), (Some("one"), Some("two")));

    let o = kore(&rt, false, &["down"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("appliance stopped (pid {pid})")),
        "{o:?}"
    );
    assert!(!rt.join("kore.pid").exists() && !rt.join("kore.sock").exists());
    // The daemon has exited (gone, or a zombie until its new parent reaps it).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start().chars().next());
    assert!(stat.is_empty() || state == Some(Some('Z')), "the daemon still runs: {stat}");
    let st = json_of(&kore(&rt, false, &["status", "--json"]));
    assert_eq!(st["running"], false);
    assert!(st.get("stale").is_none(), "{st}");
}
