//! `--vf` (and the `vf` config key) on the real host. This machine has no
//! IOMMU and no VFIO: booting with a VF must end at once with a one-line
//! error naming what is missing, exit non-zero and leave nothing behind (no
//! boot directory, no socket). On a VFIO host the missing piece is another
//! one (0000:00:1f.7 is not a vfio-pci function), never "/dev/vfio".

use std::path::Path;
use std::process::{Command, Output};

const VF: &str = "0000:00:1f.7";

fn kore(args: &[&str], home: &Path, runtime: &Path) -> Output {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    cmd.args(args).env("XDG_CONFIG_HOME", home).env("HOME", home);
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.env("KORE_RUNTIME_DIR", runtime);
    cmd.output().expect("run kore-launch")
}

fn check_refused(o: &Output, runtime: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "booting with --vf {VF} succeeded?\n{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line:\n{err}");
    assert!(err.contains(VF), "{err}");
    if Path::new("/dev/vfio").exists() {
        assert!(!err.contains("/dev/vfio does not exist"), "{err}");
    } else {
        assert!(err.contains("/dev/vfio does not exist"), "{err}");
    }
    let left: Vec<_> = std::fs::read_dir(runtime)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind in {}: {left:?}", runtime.display());
}

#[test]
fn vf_flag_without_vfio_is_a_one_line_error() {
    kore_e2e::guest_images();
    let pack = kore_e2e::tiny_pack();
    let home = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let args =
        ["generate", "--vf", VF, "--model", pack.to_str().unwrap(), "--prompt", "hi", "--json"];
    let o = kore(&args, home.path(), runtime.path());
    check_refused(&o, runtime.path());
}

#[test]
fn vf_config_key_is_honoured_at_boot() {
    kore_e2e::guest_images();
    let pack = kore_e2e::tiny_pack();
    let home = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("kore")).unwrap();
    std::fs::write(home.path().join("kore/launch.toml"), format!("vf = \"{VF}\"\n")).unwrap();
    let args = ["generate", "--model", pack.to_str().unwrap(), "--prompt", "hi"];
    let o = kore(&args, home.path(), runtime.path());
    check_refused(&o, runtime.path());
}
