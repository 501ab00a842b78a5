//! `kore-launch doctor` on the real host (not a fake sysfs tree): the
//! development and CI machines have KVM and AVX-512, so every check that can
//! stop a boot must pass. (launcher/tests/host_*.rs cover doctor on fake trees.)

use std::path::Path;
use std::process::{Command, Output};

fn kore(args: &[&str], config_home: &Path) -> Output {
    let mut cmd = Command::new(kore_e2e::kore_launch());
    cmd.args(args).env("XDG_CONFIG_HOME", config_home).env("HOME", config_home);
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.output().expect("run kore-launch")
}

#[test]
fn doctor_on_this_machine() {
    kore_e2e::require_kvm();
    let home = tempfile::tempdir().unwrap();
    let o = kore(&["doctor", "--json"], home.path());
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).expect(&out);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json["ok"], true);
    let names: Vec<&str> =
        json["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    let all =
        ["config", "kvm", "kvm-group", "cpu", "hugepages", "memory", "iommu", "vfio", "vsock"];
    assert_eq!(names, all);
    let kvm = &json["checks"][1]["detail"];
    assert!(kvm.as_str().unwrap().contains("KVM API version 12"), "{kvm}");
    let o = kore(&["doctor"], home.path());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("[ok  ] kvm"), "{text}");
}
