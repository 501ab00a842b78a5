//! The first minutes on a host whose `/dev/kvm` is `root:root 0600` (no udev rule gives it to
//! group kvm, as on minimal servers and this project's own machines): an ordinary user's
//! `generate` fails to open it; `sudo kore-launch setup` (`--dry-run` first, which changes
//! nothing) creates group kvm if missing, gives the node to it with mode 0660, writes a udev
//! rule so that survives a reboot, and adds the user; then the same `generate` answers in the
//! guest, `doctor` reports the node as usable, and a second `setup` changes nothing there.
//!
//! The host is not touched: the scenario runs in a private mount namespace with a copy of
//! /etc (users, groups, udev rules), the distribution's udev rule folders emptied (udev's own
//! 50-udev-default.rules would already keep /dev/kvm with group kvm) and a fresh device node for
//! the same KVM device bound over /dev/kvm; hugepages that `setup` reserves are given back at the end. The user runs the
//! binary alone (it carries its VMM, guest images and pack, written under its own HOME).
//!
//! Needs root, /dev/kvm, `unshare`, `mknod`, `setpriv`, `useradd`.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use serde_json::Value;

const USER: &str = "kore-setup-user";

/// The scenario; prints `=== NAME` before each step's output.
const SCRIPT: &str = r#"
work=$1 exe=$2 user=$3
pool=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
pages=$(cat $pool)
trap 'echo "$pages" > $pool' EXIT
cp -a /etc "$work/etc" && mount --bind "$work/etc" /etc
# no udev rule may give /dev/kvm to group kvm already (distros' 50-udev-default.rules does)
rm -f "$work"/etc/udev/rules.d/*.rules
for d in /usr/lib/udev/rules.d /run/udev/rules.d; do
  if [ -d "$d" ]; then mount -t tmpfs -o mode=755 norules "$d"; fi
done
mkdir "$work/node" && mount -t tmpfs -o mode=755 kvmnode "$work/node"
mknod -m 0600 "$work/node/kvm" c 10 232 && chown root:root "$work/node/kvm"
mount --bind "$work/node/kvm" /dev/kvm
useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
mkdir -m 0700 "$work/home" "$work/run" "$work/root" && chown "$user:" "$work/home" "$work/run"
cd "$work"
as_user() {
  setpriv --reuid "$user" --regid "$user" --init-groups -- env -i PATH=/usr/bin:/bin \
    HOME="$work/home" XDG_RUNTIME_DIR="$work/run" "$exe" "$@" 2>&1 && echo "exit 0" || echo "exit $?"
}
as_root() { env HOME="$work/root" SUDO_USER="$user" "$exe" "$@" 2>&1; }
gen="generate --prompt ROMEO: --max-tokens 8 --json"
echo "=== node before"; stat -c '%U:%G %a' /dev/kvm
echo "=== generate before"; as_user $gen
echo "=== doctor before"; as_root doctor --json || true
echo "=== dry-run"; as_root setup --dry-run
echo "=== node after dry-run"; stat -c '%U:%G %a' /dev/kvm
echo "=== setup"; as_root setup
echo "=== node after"; stat -c '%U:%G %a' /dev/kvm
echo "=== rule"; cat /etc/udev/rules.d/65-kore-kvm.rules
echo "=== groups"; id -nG "$user"
echo "=== doctor after"; as_root doctor --json || true
echo "=== generate after"; as_user $gen
echo "=== setup again"; as_root setup
"#;

/// The output of step `name`.
fn step<'a>(out: &'a str, name: &str) -> &'a str {
    let marker = format!("=== {name}\n");
    let start = out.find(&marker).unwrap_or_else(|| panic!("no step {name} in:\n{out}"));
    let rest = &out[start + marker.len()..];
    &rest[..rest.find("=== ").unwrap_or(rest.len())]
}

/// The doctor's `kvm-group` check from a step's JSON line.
fn kvm_group(doctor: &str) -> Value {
    let line = doctor.lines().rfind(|l| l.starts_with('{')).expect("doctor --json line");
    let report: Value = serde_json::from_str(line).unwrap();
    let checks = report["checks"].as_array().unwrap();
    checks.iter().find(|c| c["name"] == "kvm-group").expect("a kvm-group check").clone()
}

#[test]
fn sudo_setup_lets_an_ordinary_user_boot_on_a_root_only_dev_kvm() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes host changes: run it as root");
    kore_e2e::require_kvm();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("kore-launch");
    std::fs::copy(kore_e2e::kore_launch(), &exe).unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", "-euo", "pipefail", "-c", SCRIPT])
        .arg("bash")
        .args([dir.path(), exe.as_path()])
        .arg(USER)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));

    assert_eq!(step(&text, "node before").trim(), "root:root 600");
    let before = step(&text, "generate before");
    assert!(!before.contains("exit 0") && before.contains("/dev/kvm"), "{before}");
    assert!(before.contains("`sudo kore-launch setup` lets group kvm open"), "no fix: {before}");
    assert_eq!(kvm_group(step(&text, "doctor before"))["status"], "warn");

    let dry = step(&text, "dry-run");
    let usermod = format!("usermod -aG kvm {USER}");
    let rule = "write /etc/udev/rules.d/65-kore-kvm.rules";
    for planned in ["chgrp kvm /dev/kvm", "chmod 0660 /dev/kvm", rule, &usermod] {
        assert!(dry.contains(&format!("[dry-run] {planned}")), "{planned}: {dry}");
    }
    assert!(!dry.contains("[change]"), "{dry}");
    assert_eq!(step(&text, "node after dry-run").trim(), "root:root 600", "a dry run changed it");

    let setup = step(&text, "setup");
    assert!(setup.contains("[change] chgrp kvm /dev/kvm"), "{setup}");
    assert!(setup.contains("[change] chmod 0660 /dev/kvm"), "{setup}");
    assert!(setup.contains("[change] write /etc/udev/rules.d/65-kore-kvm.rules"), "{setup}");
    assert!(setup.contains(&format!("[change] usermod -aG kvm {USER}")), "{setup}");
    assert_eq!(step(&text, "node after").trim(), "root:kvm 660");
    assert!(step(&text, "rule").contains(r#"KERNEL=="kvm", GROUP="kvm", MODE="0660""#));
    assert!(step(&text, "groups").split_whitespace().any(|g| g == "kvm"));
    assert_eq!(kvm_group(step(&text, "doctor after"))["status"], "ok");

    let after = step(&text, "generate after");
    assert!(after.contains("exit 0"), "{after}");
    let line = after.lines().rfind(|l| l.starts_with('{')).expect("generate --json line");
    let answer: Value = serde_json::from_str(line).unwrap();
    assert_eq!(answer["token_ids"].as_array().map(Vec::len), Some(8), "{answer}");

    let again = step(&text, "setup again");
    assert!(!again.contains("chgrp") && !again.contains("usermod"), "{again}");
    assert!(!again.contains("65-kore-kvm.rules:"), "the rule written twice: {again}");
}
