//! The VMM runs in its own confined process (docs/security.md): while an
//! appliance is up, the VMM runs as its own small binary `kore-vmm` (not as
//! kore-launch: no HTTP server, runtime or engine in it), every thread of which
//! shows `Seccomp: 2` and `NoNewPrivs: 1`, runs as a non-root uid when the
//! launcher is root (as scripts/test.sh and CI run it), sits in its own
//! network namespace and sees an empty root directory; the appliance still answers; `down` leaves no VMM
//! process and no socket behind.
//!
//! Needs /dev/kvm, hugepages and the guest images, like tests/vm/appliance_vm.rs.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn kore(rt: &Path, args: &[&str]) -> Output {
    Command::new(kore_e2e::kore_launch())
        .args(args)
        .env_remove("KORE_APPLIANCE")
        .env("KORE_RUNTIME_DIR", rt)
        .output()
        .expect("run kore-launch")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kore-launch failed: {stderr}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Stops the appliance even when an assertion failed.
struct Down<'a>(&'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = kore(self.0, &["down"]);
    }
}

fn field(status: &str, key: &str) -> String {
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_default();
    line[key.len()..].split_whitespace().next().unwrap_or_default().to_string()
}

#[test]
fn every_vmm_thread_is_filtered_unprivileged_and_offline() {
    kore_e2e::require_kvm();
    kore_e2e::guest_images();
    let pack = kore_e2e::tiny_pack();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("kore");
    let _down = Down(&rt);
    ok(&kore(&rt, &["up", "--model", pack.to_str().unwrap()]));

    let status = ok(&kore(&rt, &["status", "--json"]));
    let st: Value = serde_json::from_str(status.lines().last().unwrap()).unwrap();
    let vmm = &st["vmm"];
    let pid = vmm["pid"].as_u64().unwrap_or_else(|| panic!("status has no VMM pid: {st}"));
    assert_eq!(vmm["seccomp"], true, "{st}");
    let proc_dir = Path::new("/proc").join(pid.to_string());
    assert!(kore_e2e::is_vmm_process(&proc_dir), "VMM pid {pid} is not kore-vmm");
    let comm = std::fs::read_to_string(proc_dir.join("comm")).unwrap();
    assert_eq!(comm.trim(), "kore-vmm", "the VMM process runs {comm}");

    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten().collect();
    let mut vcpus = 0;
    for t in &tasks {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap();
        let s = std::fs::read_to_string(t.path().join("status")).unwrap();
        if comm.starts_with("kvm-") {
            continue; // a kernel worker KVM attaches to the process, not VMM code
        }
        vcpus += comm.starts_with("kore-vcpu") as usize;
        assert_eq!(field(&s, "Seccomp:"), "2", "thread {comm}");
        assert_eq!(field(&s, "NoNewPrivs:"), "1", "thread {comm}");
        if root {
            assert_ne!(field(&s, "Uid:"), "0", "thread {comm} still runs as root");
        }
    }
    assert!(vcpus >= 1, "no vCPU thread among {} tasks", tasks.len());
    if root {
        assert_eq!(vmm["namespaces"], true, "{st}");
        let ns = |p: &str| std::fs::read_link(p).unwrap();
        assert_ne!(ns(&format!("/proc/{pid}/ns/net")), ns("/proc/self/ns/net"));
        assert_eq!(vmm["empty_root"], true, "{st}");
        let seen: Vec<_> =
            std::fs::read_dir(format!("/proc/{pid}/root/")).unwrap().flatten().collect();
        assert!(seen.is_empty(), "the VMM still sees host files: {seen:?}");
    }

    let out = ok(&kore(&rt, &["generate", "--prompt", "KING.", "--max-tokens", "4", "--json"]));
    let g: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(g["token_ids"].as_array().map(Vec::len), Some(4), "{g}");

    ok(&kore(&rt, &["down"]));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the VMM process outlived `down`");
    assert!(!rt.join("kore.sock").exists(), "the socket outlived `down`");
}
