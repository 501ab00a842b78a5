//! Faults end with one clear error and leave the host clean, and the next
//! boot works:
//! - the guest panics during boot (the ring-3 test image, told to panic with
//!   `KORE_GUEST_CMDLINE_APPEND=fault=panic`, in place of the appliance);
//! - the guest hangs during boot (`fault=hang`): the boot ends after
//!   `KORE_BOOT_TIMEOUT_S`, naming the hang, and the VMM process is gone;
//! - the disk fills up under `batch`'s output (a 64 KiB tmpfs): the rows
//!   written so far stay in OUT.partial and a rerun elsewhere completes.
//!
//! Needs root (for the tmpfs), /dev/kvm, hugepages and the guest images.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

fn kore(rt: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    cmd.args(args).env_remove("KORE_APPLIANCE").env("KORE_RUNTIME_DIR", rt);
    cmd
}

fn one_error_line(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let first = err.lines().find(|l| l.starts_with("kore-launch: error:"));
    first.unwrap_or_else(|| panic!("no error line in: {err}")).to_string()
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(true)
}

fn hugepages_free() -> u64 {
    let s = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    s.ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn a_guest_that_panics_while_booting_is_reported_and_cleaned_up() {
    kore_e2e::require_kvm();
    let images = kore_e2e::guest_images();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let pack = kore_e2e::tiny_pack();
    let args =
        ["generate", "--model", pack.to_str().unwrap(), "--prompt", "KING.", "--max-tokens", "2"];
    let free = hugepages_free();

    let out = kore(&rt, &args)
        .env("KORE_GUEST_KERNEL", &images.kernel)
        .env("KORE_GUEST_IMAGE", &images.test_image)
        .env("KORE_GUEST_CMDLINE_APPEND", "fault=panic")
        .output()
        .unwrap();
    let err = one_error_line(&out);
    assert!(err.contains("the Kore guest exited with status 101"), "{err}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("requested by the command line"), "the console tail: {said}");
    assert!(empty(&rt), "runtime files left behind after the crash");
    // The VMM process is gone, so its hugepages are free again (this counts the
    // whole host: run it without other VMs starting meanwhile, as CI does).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while hugepages_free() < free && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(hugepages_free() >= free, "hugepages not released: {free} -> {}", hugepages_free());

    let ok = kore(&rt, &args).output().unwrap();
    assert!(ok.status.success(), "the next boot: {}", String::from_utf8_lossy(&ok.stderr));
}

#[test]
fn a_guest_that_hangs_while_booting_times_out_and_is_stopped() {
    kore_e2e::require_kvm();
    let images = kore_e2e::guest_images();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let pack = kore_e2e::tiny_pack();
    let args =
        ["generate", "--model", pack.to_str().unwrap(), "--prompt", "KING.", "--max-tokens", "2"];
    let started = std::time::Instant::now();
    let out = kore(&rt, &args)
        .env("KORE_GUEST_KERNEL", &images.kernel)
        .env("KORE_GUEST_IMAGE", &images.test_image)
        .env("KORE_GUEST_CMDLINE_APPEND", "fault=hang")
        .env("KORE_BOOT_TIMEOUT_S", "3")
        .output()
        .unwrap();
    let err = one_error_line(&out);
    assert!(err.contains("did not accept") && err.contains("hangs"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(empty(&rt), "runtime files left behind after the hang");
    let left = Command::new("pgrep").args(["-f", "kore-launch vmm-process"]).output().unwrap();
    let pids = String::from_utf8_lossy(&left.stdout).to_string();
    for pid in pids.split_whitespace() {
        let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!ppid.is_empty() && !ppid.contains(") Z"), "VMM {pid} left running");
    }
}

#[test]
fn a_full_disk_under_batch_output_is_one_error_and_loses_no_rows() {
    kore_e2e::require_kvm();
    kore_e2e::guest_images();
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts a tmpfs: run it as root");
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "kore-test", small.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(mounted.success(), "mount tmpfs");
    struct Umount<'a>(&'a Path);
    impl Drop for Umount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _umount = Umount(&small);

    let input = dir.path().join("in.jsonl");
    let mut f = std::fs::File::create(&input).unwrap();
    for i in 0..400 {
        writeln!(f, r#"{{"id":"p{i}","prompt":"KING {i}.","max_tokens":12}}"#).unwrap();
    }
    let pack = kore_e2e::tiny_pack();
    let run = |out: &Path| {
        kore(&rt, &["batch", input.to_str().unwrap(), "-o", out.to_str().unwrap()])
            .args(["--model", pack.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let full = small.join("out.jsonl");
    let err = one_error_line(&run(&full));
    assert!(err.contains("No space left on device"), "{err}");
    let partial = small.join("out.jsonl.partial");
    let kept = std::fs::read_to_string(&partial).unwrap_or_default();
    let whole_rows = kept.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok());
    assert!(whole_rows.count() > 0, "the rows that fit were lost");
    assert!(empty(&rt), "runtime files left behind");

    // Moved to a disk with room, the batch resumes from what was kept.
    let roomy = dir.path().join("out.jsonl");
    std::fs::copy(&partial, dir.path().join("out.jsonl.partial")).unwrap();
    let ok = run(&roomy);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(std::fs::read_to_string(&roomy).unwrap().lines().count(), 400);
}
