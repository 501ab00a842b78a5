//! `kore-launch generate` in the Kore VM: boots the appliance (guest kernel +
//! ring-3 appliance image from `target/guest`, the tiny pack preloaded),
//! sends the request over vsock port 1025, and checks the greedy ids and text
//! equal `generate --native` on the same pack.
//!
//! Needs /dev/kvm, 2 MiB hugepages and the guest images
//! (`cd guest-kernel && CARGO_TARGET_DIR=$PWD/../target/guest ./build.sh`);
//! without the images or KVM the test says so on stderr and passes (CI builds
//! the images first, so there it always runs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn images_present() -> bool {
    let g = root().join("target/guest");
    let kernel = std::env::var_os("KORE_GUEST_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| g.join("x86_64-unknown-none/release/kore-kernel"));
    let image = std::env::var_os("KORE_GUEST_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| g.join("x86_64-unknown-linux-gnu/release/kore-appliance"));
    kernel.is_file() && image.is_file() && Path::new("/dev/kvm").exists()
}

/// The tiny pack: model-packs/tiny once committed, else imported from tiny-hf.
fn tiny_pack() -> &'static Path {
    static PACK: OnceLock<PathBuf> = OnceLock::new();
    PACK.get_or_init(|| {
        let committed = root().join("model-packs/tiny");
        if committed.join("pack.toml").is_file() {
            return committed;
        }
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let out = deps.join(format!("appliance-vm-tiny-pack.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        kore_pack::import::import(
            &root().join("model-packs/tiny-hf"),
            &out,
            &kore_pack::import::ImportOptions::default(),
            &kore_pack::progress::NoProgress,
        )
        .expect("import model-packs/tiny-hf");
        out
    })
}

fn kore(args: &[&str], runtime: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kore-launch"))
        .args(args)
        .env_remove("KORE_APPLIANCE")
        .env("KORE_RUNTIME_DIR", runtime)
        .output()
        .expect("run kore-launch")
}

fn last_json(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kore-launch failed: {stderr}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

#[test]
fn generate_in_the_vm_equals_native() {
    if !images_present() {
        eprintln!("SKIPPED: no guest images in target/guest or no /dev/kvm");
        return;
    }
    let pack = tiny_pack().to_str().unwrap().to_string();
    let runtime = std::env::temp_dir().join(format!("kore-vm-test-{}", std::process::id()));
    for extra in [
        &["--prompt", "ROMEO:\nBut soft, what light"][..],
        &["--prompt-ids", "4071,882,198,11,4072"][..],
    ] {
        let mut args =
            vec!["generate", "--model", &pack, "--max-tokens", "24", "--mtp", "0", "--json"];
        args.extend_from_slice(extra);
        let vm = last_json(&kore(&args, &runtime));
        args.push("--native");
        let native = last_json(&kore(&args, &runtime));
        assert!(!native["token_ids"].as_array().unwrap().is_empty());
        assert_eq!(vm["token_ids"], native["token_ids"], "vm {vm}\nnative {native}");
        assert_eq!(vm["text"], native["text"]);
        assert_eq!(vm["stop_reason"], native["stop_reason"]);
    }
    // The per-boot runtime directory is cleaned up.
    let left: Vec<_> = std::fs::read_dir(&runtime)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind in {}: {left:?}", runtime.display());
    let _ = std::fs::remove_dir_all(&runtime);
}
