//! Faults end with one clear error and leave the host clean, and the next
//! boot works:
//! - the guest panics during boot (the ring-3 test image, told to panic with
//!   `KORE_GUEST_CMDLINE_APPEND=fault=panic`, in place of the appliance);
//! - the guest hangs during boot (`fault=hang`): the boot ends after
//!   `KORE_BOOT_TIMEOUT_S`, naming the hang, and the VMM process is gone;
//! - the guest hangs in the middle of an answer (`fault=hang-answer`): the
//!   launcher's watchdog probes it, names the hang after `KORE_HANG_TIMEOUT_S`
//!   and the VMM is stopped;
//! - the disk fills up under `batch`'s output (a 64 KiB tmpfs): the rows
//!   written so far stay in OUT.partial and a rerun elsewhere completes.
//!
//! Needs root (for the tmpfs), /dev/kvm, hugepages and the guest images.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

/// The tests here boot VMs, and the first counts the host's free hugepages before and after
/// its crashed guest: another test's VM starting in between (the harness runs tests on
/// several threads) would look like a leak. So they run one at a time.
fn one_vm_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn kore<S: AsRef<std::ffi::OsStr>>(rt: &Path, args: &[S]) -> Command {
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

/// `generate` on the default pack with the test image in place of the
/// appliance, told `fault` on its command line (plus `env`). Bounded: a
/// `generate` still running after 120 s (a hang nobody noticed) is killed and
/// the test fails.
fn generate_with_fault(rt: &Path, fault: &str, env: &[(&str, &str)]) -> Output {
    let images = kore_e2e::guest_images();
    let pack = kore_e2e::tiny_pack();
    let mut child = kore(rt, &generate_args(&pack))
        .env("KORE_GUEST_KERNEL", &images.kernel)
        .env("KORE_GUEST_IMAGE", &images.test_image)
        .env("KORE_GUEST_CMDLINE_APPEND", fault)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("generate with {fault} still runs after 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

fn generate_args(pack: &Path) -> Vec<String> {
    let p = pack.to_str().unwrap().to_string();
    ["generate", "--model", &p, "--prompt", "KING.", "--max-tokens", "2"].map(String::from).to_vec()
}

#[test]
fn a_guest_that_panics_while_booting_is_reported_and_cleaned_up() {
    kore_e2e::require_kvm();
    let _one = one_vm_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let free = hugepages_free();

    let out = generate_with_fault(&rt, "fault=panic", &[]);
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

    let ok = kore(&rt, &generate_args(&kore_e2e::tiny_pack())).output().unwrap();
    assert!(ok.status.success(), "the next boot: {}", String::from_utf8_lossy(&ok.stderr));
}

#[test]
fn a_guest_that_hangs_while_booting_times_out_and_is_stopped() {
    kore_e2e::require_kvm();
    let _one = one_vm_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let started = std::time::Instant::now();
    let out = generate_with_fault(&rt, "fault=hang", &[("KORE_BOOT_TIMEOUT_S", "3")]);
    let err = one_error_line(&out);
    assert!(err.contains("did not accept") && err.contains("hangs"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(empty(&rt), "runtime files left behind after the hang");
    let ours = vmm_processes_of(&rt);
    assert!(ours.is_empty(), "VMM processes left running: {ours:?}");
}

#[test]
fn a_guest_that_hangs_in_the_middle_of_an_answer_is_noticed_and_stopped() {
    kore_e2e::require_kvm();
    let _one = one_vm_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let started = std::time::Instant::now();
    // Without the watchdog `generate` would wait forever (generate_with_fault bounds it).
    let out = generate_with_fault(&rt, "fault=hang-answer", &[("KORE_HANG_TIMEOUT_S", "3")]);
    let err = one_error_line(&out);
    assert!(err.contains("the appliance stopped answering") && err.contains("hung"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(empty(&rt), "runtime files left behind after the hang");
    let ours = vmm_processes_of(&rt);
    assert!(ours.is_empty(), "VMM processes left running: {ours:?}");
    let ok = kore(&rt, &generate_args(&kore_e2e::tiny_pack())).output().unwrap();
    assert!(ok.status.success(), "the next boot: {}", String::from_utf8_lossy(&ok.stderr));
}

/// Live `kore-vmm` processes started with runtime directory `rt`.
fn vmm_processes_of(rt: &Path) -> Vec<String> {
    let want = format!("KORE_RUNTIME_DIR={}", rt.display());
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter(|e| {
            let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
            kore_e2e::is_vmm_process(&e.path())
                && env.split(|&b| b == 0).any(|v| v == want.as_bytes())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_full_disk_under_batch_output_is_one_error_and_loses_no_rows() {
    kore_e2e::require_kvm();
    let _one = one_vm_at_a_time();
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
