//! An ordinary user runs the appliance: a system user in group `kvm` (created here; the
//! test runs as root, as scripts/test.sh and CI do) runs `generate` in the Kore VM, then
//! `up`, `status`, `generate` (attached) and `down`, with its runtime directory under its
//! own `$XDG_RUNTIME_DIR`. Nothing of it needs root: /dev/kvm through the group, guest RAM
//! through a hugetlb memfd (or ordinary pages), sockets and pid files in its own directory.
//!
//! Needs root (to create the user), /dev/kvm and the guest images.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const USER: &str = "kore-test-user";

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Creates the test user (once) in group kvm and returns its uid.
fn test_user() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates a user: run it as root");
    assert!(Path::new("/dev/kvm").exists(), "this test boots VMs: /dev/kvm is missing");
    let exists = run(Command::new("id").arg("-u").arg(USER)).status.success();
    if !exists {
        let out = run(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "--groups",
            "kvm",
            USER,
        ]));
        assert!(out.status.success(), "useradd: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = run(Command::new("id").arg("-u").arg(USER));
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

/// What the user runs, copied into `dir` (world-readable): kore-launch, the guest images and
/// the default pack, so that the test does not depend on where the checkout lives (a clone
/// under a 0700 home directory would be out of the user's reach).
struct Copies {
    exe: PathBuf,
    kernel: PathBuf,
    image: PathBuf,
    pack: PathBuf,
}

fn copies(dir: &Path) -> Copies {
    let images = kore_e2e::guest_images();
    let (kernel, image) = (images.kernel, images.appliance);
    let c = Copies {
        exe: dir.join("kore-launch"),
        kernel: dir.join("kore-kernel"),
        image: dir.join("kore-appliance"),
        pack: dir.join("tiny"),
    };
    std::fs::copy(kore_e2e::kore_launch(), &c.exe).unwrap();
    std::fs::copy(kernel, &c.kernel).unwrap();
    std::fs::copy(image, &c.image).unwrap();
    std::fs::create_dir(&c.pack).unwrap();
    for f in ["pack.toml", "weights.safetensors", "tokenizer.json"] {
        std::fs::copy(kore_e2e::tiny_pack().join(f), c.pack.join(f)).unwrap();
    }
    for p in [&c.exe, &c.kernel, &c.image] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    c
}

/// `kore-launch ARGS` as the test user, with `xdg` as its XDG_RUNTIME_DIR.
fn kore_as_user(c: &Copies, args: &[&str], xdg: &Path) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", USER, "--regid", USER, "--init-groups", "--"])
        .arg(&c.exe)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", xdg)
        .env("XDG_RUNTIME_DIR", xdg)
        .env("XDG_CONFIG_HOME", xdg.join("config"))
        .env("KORE_GUEST_KERNEL", &c.kernel)
        .env("KORE_GUEST_IMAGE", &c.image)
        .current_dir(xdg);
    run(&mut cmd)
}

fn ok_json(out: &Output, what: &str) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} as {USER} failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or(Value::Null)
}

#[test]
fn a_user_in_group_kvm_runs_generate_and_up_status_down() {
    let uid = test_user();
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
    let status = run(Command::new("chown").arg(uid.to_string()).arg(&xdg)).status;
    assert!(status.success());
    let c = copies(dir.path());
    let pack = c.pack.to_str().unwrap().to_owned();
    let pack = pack.as_str();
    let gen = ["generate", "--model", pack, "--prompt", "ROMEO:", "--max-tokens", "8", "--json"];

    let first = ok_json(&kore_as_user(&c, &gen, &xdg), "generate");
    assert_eq!(first["token_ids"].as_array().map(Vec::len), Some(8), "{first}");

    ok_json(&kore_as_user(&c, &["up", "--model", pack], &xdg), "up");
    let status = ok_json(&kore_as_user(&c, &["status", "--json"], &xdg), "status");
    assert_eq!(status["running"], true, "{status}");
    let attached = ok_json(&kore_as_user(&c, &gen, &xdg), "generate (attached)");
    assert_eq!(attached["token_ids"], first["token_ids"]);
    ok_json(&kore_as_user(&c, &["down"], &xdg), "down");
    // Its runtime directory is its own, under XDG_RUNTIME_DIR, and left clean.
    let rt = xdg.join("kore");
    assert!(rt.is_dir(), "runtime directory {} not used", rt.display());
    let left: Vec<_> = std::fs::read_dir(&rt).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        left.iter().all(|n| n.to_string_lossy().ends_with(".log")),
        "left behind in {}: {left:?}",
        rt.display()
    );
}
