//! The `setup`, `doctor` and `completions` commands and the config file, run
//! as a user would run them (the binary), against fake trees (`KORE_SYSROOT`).

#[allow(dead_code, unused_imports)]
#[path = "../src/host/mod.rs"]
mod host;
#[allow(dead_code)]
mod host_support;

use host_support::Tree;
use std::path::Path;
use std::process::{Command, Output};

const NR_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const NR_1G: &str = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";

/// `kore-launch ARGS` with a clean environment: no user config, no KORE_* variables.
fn kore(args: &[&str], config_home: &Path, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kore-launch"));
    cmd.args(args).env("XDG_CONFIG_HOME", config_home).env("HOME", config_home);
    for (key, _) in std::env::vars() {
        if key.starts_with("KORE_") || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.envs(envs.iter().copied());
    cmd.output().expect("run kore-launch")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// A fake host with empty pools and a 1 MiB pack, whose /dev/kvm group kvm may open.
fn host() -> Tree {
    let tree = Tree::new();
    tree.pool(2048, 0, 0, 0).pool(1048576, 0, 0, 0);
    tree.file("/pack/weights.safetensors", &"w".repeat(1 << 20));
    // SAFETY: getgid has no preconditions.
    let gid = unsafe { libc::getgid() };
    tree.file("/etc/group", &format!("kvm:x:{gid}:\n"));
    tree.file("/etc/udev/rules.d/65-kore-kvm.rules", "KERNEL==\"kvm\", GROUP=\"kvm\"\n");
    tree.file("/dev/kvm", "");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::Permissions::from_mode(0o660);
    std::fs::set_permissions(tree.real("/dev/kvm"), mode).unwrap();
    tree
}

#[test]
fn setup_dry_run_gives_a_root_only_dev_kvm_to_group_kvm_in_the_tree() {
    let tree = host();
    let pack = tree.real("/pack");
    std::fs::remove_file(tree.real("/etc/udev/rules.d/65-kore-kvm.rules")).unwrap();
    std::fs::write(tree.real("/etc/group"), "root:x:0:\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tree.real("/dev/kvm"), std::fs::Permissions::from_mode(0o600))
        .unwrap();
    let root = tree.root().to_str().unwrap();
    let o = kore(
        &["setup", "--dry-run", "--model", pack.to_str().unwrap()],
        tree.root(),
        &[("KORE_SYSROOT", root)],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let node = tree.real("/dev/kvm").display().to_string();
    assert!(out.contains(&format!("[dry-run] groupadd --prefix {root} --system kvm")), "{out}");
    assert!(out.contains(&format!("[dry-run] chgrp kvm {node}")), "{out}");
    assert!(out.contains(&format!("[dry-run] chmod 0660 {node}")), "{out}");
    let rule = tree.real("/etc/udev/rules.d/65-kore-kvm.rules").display().to_string();
    assert!(out.contains(&format!("[dry-run] write {rule}: KERNEL==")), "{out}");
    assert!(out.contains("dry run: 5 change(s) would be made"), "{out}");
    assert!(!tree.real("/etc/udev/rules.d/65-kore-kvm.rules").exists(), "a dry run wrote it");
}

#[test]
fn setup_dry_run_prints_the_write_and_changes_nothing() {
    let tree = host();
    let pack = tree.real("/pack");
    let root = tree.root().to_str().unwrap();
    let o = kore(
        &["setup", "--dry-run", "--model", pack.to_str().unwrap()],
        tree.root(),
        &[("KORE_SYSROOT", root)],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let line = out.lines().find(|l| l.starts_with("[dry-run] echo ")).expect(&out);
    assert!(line.contains(&format!("> {}", tree.real(NR_2M).display())), "{line}");
    assert!(out.contains("dry run: 1 change(s) would be made"), "{out}");
    assert_eq!(tree.read(NR_2M), "0\n");
}

#[test]
fn setup_reserves_in_the_tree_or_asks_for_root() {
    let tree = host();
    let pack = tree.real("/pack");
    let root = tree.root().to_str().unwrap();
    let o = kore(
        &["setup", "--model", pack.to_str().unwrap(), "--context", "1024"],
        tree.root(),
        &[("KORE_SYSROOT", root)],
    );
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    if is_root {
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        let pages: u64 = tree.read(NR_2M).trim().parse().unwrap();
        // As the VMM lays it out: the guest's own memory (quarter-of-weights estimate + 256 MiB
        // heap + 64 MiB kernel + the prefix cache's default 512 MiB memory tier) and the 1 MiB
        // pack, each in whole 2 MiB pages.
        let own = ((1u64 << 18) + (320 << 20) + (512 << 20)).div_ceil(2 << 20);
        let expected = own + (1u64 << 20).div_ceil(2 << 20);
        assert_eq!(pages, expected);
        assert!(stdout(&o).contains("[change] echo"), "{}", stdout(&o));
    } else {
        assert_eq!(o.status.code(), Some(5));
        assert!(stderr(&o).contains("needs root"), "{}", stderr(&o));
        assert_eq!(tree.read(NR_2M), "0\n");
    }
}

#[test]
fn config_env_and_flags_choose_the_pool() {
    let tree = host();
    let pack = tree.real("/pack");
    let root = tree.root().to_str().unwrap();
    tree.file(
        "/kore/launch.toml",
        &format!("pack = \"{}\"\nhugepage_size = \"1G\"\n", pack.display()),
    );
    let sys = [("KORE_SYSROOT", root)];
    let o = kore(&["setup", "--dry-run"], tree.root(), &sys);
    // On 1 GiB pages the VMM gives the guest's own memory and the pack a page each.
    assert!(
        stdout(&o).contains(&format!("echo 2 > {}", tree.real(NR_1G).display())),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    let o = kore(&["setup", "--dry-run"], tree.root(), &[sys[0], ("KORE_HUGEPAGE_SIZE", "2M")]);
    assert!(stdout(&o).contains(&tree.real(NR_2M).display().to_string()), "{}", stdout(&o));
    let o = kore(
        &["setup", "--dry-run", "--hugepage-size", "off"],
        tree.root(),
        &[sys[0], ("KORE_HUGEPAGE_SIZE", "2M")],
    );
    assert!(stdout(&o).contains("hugepages off"), "{}", stdout(&o));
    // --config names another file.
    tree.file("/other.toml", &format!("pack = \"{}\"\nhugepage_size = \"off\"\n", pack.display()));
    let other = tree.real("/other.toml");
    let o = kore(&["--config", other.to_str().unwrap(), "setup", "--dry-run"], tree.root(), &sys);
    assert!(stdout(&o).contains("hugepages off"), "{}", stdout(&o));
}

#[test]
fn a_bad_config_is_a_one_line_usage_error() {
    let tree = host();
    tree.file("/kore/launch.toml", "vcpus = 2\ncolour = \"blue\"\n");
    let o = kore(&["doctor"], tree.root(), &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("launch.toml") && err.contains("line 2, key `colour`"), "{err}");
    let o = kore(&["--config", "/nonexistent/k.toml", "doctor"], tree.root(), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent/k.toml"));
}

#[test]
fn setup_rejects_bad_addresses_and_missing_packs() {
    let tree = host();
    let root = tree.root().to_str().unwrap();
    let pack = tree.real("/pack");
    let o = kore(
        &["setup", "--dry-run", "--model", pack.to_str().unwrap(), "--vf", "gpu0"],
        tree.root(),
        &[("KORE_SYSROOT", root)],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = kore(
        &["setup", "--dry-run", "--model", "/nonexistent"],
        tree.root(),
        &[("KORE_SYSROOT", root)],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("/nonexistent"));
    let o = kore(&["setup", "--vfs", "0"], tree.root(), &[]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn doctor_on_a_host_without_kvm_fails_with_json() {
    let tree = host();
    tree.file("/proc/meminfo", "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n");
    let root = tree.root().to_str().unwrap();
    let pack = tree.real("/pack");
    let o = kore(
        &["doctor", "--json"],
        tree.root(),
        &[("KORE_SYSROOT", root), ("KORE_MODEL", pack.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let out = stdout(&o);
    let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(json["ok"], false);
    let kvm = json["checks"].as_array().unwrap().iter().find(|c| c["name"] == "kvm").unwrap();
    assert_eq!(kvm["status"], "fail");
    assert!(kvm["fix"].as_str().unwrap().contains("modprobe"));
    assert!(stderr(&o).contains("kvm failed"), "{}", stderr(&o));
}

#[test]
fn completions_for_each_shell() {
    let tree = Tree::new();
    let bash = kore(&["completions", "bash"], tree.root(), &[]);
    assert!(bash.status.success());
    let script = stdout(&bash);
    for word in ["kore-launch", "generate", "doctor", "setup", "--dry-run", "completions"] {
        assert!(script.contains(word), "bash script lacks {word}");
    }
    let path = tree.real("/kore.bash");
    std::fs::write(&path, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&path).status().expect("bash");
    assert!(check.success(), "bash -n rejected the script");
    let zsh = stdout(&kore(&["completions", "zsh"], tree.root(), &[]));
    assert!(zsh.starts_with("#compdef kore-launch"), "{}", &zsh[..80.min(zsh.len())]);
    let fish = stdout(&kore(&["completions", "fish"], tree.root(), &[]));
    assert!(fish.contains("complete -c kore-launch"));
    let bad = kore(&["completions", "tcsh"], tree.root(), &[]);
    assert_eq!(bad.status.code(), Some(2));
}
