//! Who may open `/dev/kvm`: group `kvm` with mode 0660, kept across reboots by a udev
//! rule. Many distributions ship that rule; hosts without it (a minimal server, a
//! container-style VM) leave the node `root:root 0600`, where adding a user to group
//! `kvm` achieves nothing. `setup` makes the node usable by the group ([`grant`]) and
//! `doctor` says whether it is ([`inspect`], checked in `checks`).

use std::os::unix::fs::MetadataExt;

use super::{Changes, HostError, Sys};

/// The device node.
pub const NODE: &str = "/dev/kvm";
/// The rule `setup` writes.
pub const RULE_PATH: &str = "/etc/udev/rules.d/65-kore-kvm.rules";
/// Its contents: group `kvm`, read-write for the group, at every boot and module load.
pub const RULE: &str = "# Written by `kore-launch setup`: members of group kvm may run VMs.\n\
                        KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\"\n";
/// Where udev reads rules from (an admin's, runtime, and the distribution's).
const RULE_DIRS: &[&str] =
    &["/etc/udev/rules.d", "/run/udev/rules.d", "/lib/udev/rules.d", "/usr/lib/udev/rules.d"];

/// What the host grants today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmAccess {
    /// The node's group id and permission bits; `None` when there is no node.
    pub node: Option<(u32, u32)>,
    /// The gid of group `kvm` in `/etc/group`, if the group exists.
    pub kvm_gid: Option<u32>,
    /// A udev rule file that gives the node to group `kvm`, if any.
    pub rule: Option<String>,
}

impl KvmAccess {
    /// Members of group `kvm` (or everyone) may open the node.
    pub fn group_can_open(&self) -> bool {
        match (self.node, self.kvm_gid) {
            (Some((_, mode)), _) if mode & 0o006 == 0o006 => true,
            (Some((gid, mode)), Some(kvm)) => gid == kvm && mode & 0o060 == 0o060,
            _ => false,
        }
    }
}

/// Reads the node's owner group and mode, group `kvm` and the udev rules.
pub fn inspect(sys: &dyn Sys) -> KvmAccess {
    let node = std::fs::metadata(sys.locate(NODE)).ok().map(|m| (m.gid(), m.mode() & 0o7777));
    let kvm_gid = sys.read("/etc/group").ok().and_then(|g| group_gid(&g, "kvm"));
    let rule = RULE_DIRS.iter().find_map(|dir| {
        sys.list(dir)
            .into_iter()
            .map(|f| format!("{dir}/{f}"))
            .find(|path| sys.read(path).map(|text| grants_group(&text)).unwrap_or(false))
    });
    KvmAccess { node, kvm_gid, rule }
}

/// The gid of `name` in an `/etc/group` text.
fn group_gid(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.trim().parse().ok()
    })
}

/// Whether a udev rules text gives the kvm node to group kvm.
fn grants_group(text: &str) -> bool {
    text.lines().map(str::trim).filter(|l| !l.starts_with('#')).any(|l| {
        let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        l.contains("KERNEL==\"kvm\"") && l.contains("GROUP=\"kvm\"")
    })
}

/// Makes `/dev/kvm` usable by group `kvm` now and after a reboot: the group, the node's
/// group and mode, and the udev rule, each only when missing, each through `changes`.
pub fn grant(changes: &mut Changes<'_>) -> Result<(), HostError> {
    let now = inspect(changes.sys());
    if now.kvm_gid.is_none() {
        // Under a sysroot (tests, chroots) the group goes into its /etc/group.
        let shown = changes.sys().shown("/");
        let root = match shown.trim_end_matches('/') {
            "" => "/".to_string(),
            trimmed => trimmed.to_string(),
        };
        let mut args = vec!["--system", "kvm"];
        if root != "/" {
            args.splice(0..0, ["--prefix", root.as_str()]);
        }
        changes.command("groupadd", &args, "the group that may open /dev/kvm")?;
    }
    let shown = changes.sys().shown(NODE);
    match now.node {
        None => changes.note(&format!(
            "[skip] {shown} is missing (`kore-launch doctor` says how to load KVM); \
             the udev rule below applies once it appears"
        ))?,
        Some(_) if now.group_can_open() => {
            changes.note(&format!("[ok] {shown} may be opened by group kvm"))?
        }
        Some((gid, mode)) => {
            if now.kvm_gid != Some(gid) {
                changes.command("chgrp", &["kvm", &shown], "group kvm owns /dev/kvm")?;
            }
            if mode & 0o060 != 0o060 {
                let mode = format!("{:04o}", (mode | 0o060) & 0o7777);
                changes.command("chmod", &[&mode, &shown], "group kvm may open /dev/kvm")?;
            }
        }
    }
    match now.rule {
        Some(rule) => changes.note(&format!(
            "[ok] {} keeps /dev/kvm with group kvm across reboots",
            changes.sys().shown(&rule)
        )),
        None => changes.create_file(
            RULE_PATH,
            RULE,
            "udev gives /dev/kvm to group kvm at every boot (mode 0660)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::SysRoot;
    use std::os::unix::fs::PermissionsExt;

    /// A fake root with /etc/group, a regular file standing for /dev/kvm, and rule dirs.
    fn host(group: &str, mode: u32, rule: Option<&str>) -> (tempfile::TempDir, SysRoot) {
        let dir = tempfile::tempdir().unwrap();
        let root = SysRoot::new(dir.path());
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("etc/group"), group).unwrap();
        let node = dir.path().join("dev/kvm");
        std::fs::write(&node, b"").unwrap();
        std::fs::set_permissions(&node, std::fs::Permissions::from_mode(mode)).unwrap();
        if let Some(text) = rule {
            std::fs::create_dir_all(dir.path().join("lib/udev/rules.d")).unwrap();
            std::fs::write(dir.path().join("lib/udev/rules.d/50-udev-default.rules"), text)
                .unwrap();
        }
        (dir, root)
    }

    fn dry_run(root: &SysRoot) -> String {
        let mut out = Vec::new();
        let mut changes = Changes::new(root, true, false, &mut out);
        grant(&mut changes).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_root_only_node_without_group_or_rule_gets_all_four_changes() {
        let (dir, root) = host("root:x:0:\n", 0o600, None);
        let out = dry_run(&root);
        let node = dir.path().join("dev/kvm").display().to_string();
        let prefix = dir.path().display();
        assert!(
            out.contains(&format!("[dry-run] groupadd --prefix {prefix} --system kvm")),
            "{out}"
        );
        assert!(out.contains(&format!("[dry-run] chgrp kvm {node}")), "{out}");
        assert!(out.contains(&format!("[dry-run] chmod 0660 {node}")), "{out}");
        assert!(out.contains("65-kore-kvm.rules") && out.contains(r#"GROUP="kvm""#), "{out}");
        // A dry run changes nothing.
        let meta = std::fs::metadata(dir.path().join("dev/kvm")).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(!dir.path().join("etc/udev").exists());
        assert!(!inspect(&root).group_can_open());
    }

    #[test]
    fn a_host_that_already_grants_the_group_needs_nothing() {
        // The node's gid is the test process's own, named kvm in the fake /etc/group.
        // SAFETY: getgid has no preconditions.
        let gid = unsafe { libc::getgid() };
        let rule = "KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\", OPTIONS+=\"static_node=kvm\"\n";
        let (_dir, root) = host(&format!("root:x:0:\nkvm:x:{gid}:alice\n"), 0o660, Some(rule));
        let access = inspect(&root);
        assert_eq!(access.kvm_gid, Some(gid));
        assert!(access.group_can_open(), "{access:?}");
        assert!(access.rule.unwrap().ends_with("50-udev-default.rules"));
        let out = dry_run(&root);
        assert!(!out.contains("[dry-run]"), "{out}");
        assert!(out.contains("[ok]"), "{out}");
    }

    #[test]
    fn a_world_usable_node_counts_and_only_the_rule_is_missing() {
        let (_dir, root) = host("kvm:x:36:\n", 0o666, Some("# KERNEL==\"kvm\", GROUP=\"kvm\"\n"));
        let access = inspect(&root);
        assert!(access.group_can_open());
        assert_eq!(access.rule, None, "a commented-out rule does not count");
        let out = dry_run(&root);
        assert_eq!(out.matches("[dry-run]").count(), 1, "{out}");
        assert!(out.contains("65-kore-kvm.rules"), "{out}");
    }

    #[test]
    fn writing_the_rule_needs_root_and_creates_its_directory() {
        let (dir, root) = host("kvm:x:36:\n", 0o666, None);
        let mut out = Vec::new();
        let err = grant(&mut Changes::new(&root, false, false, &mut out)).unwrap_err();
        assert!(err.to_string().contains("needs root"), "{err}");
        // As root (the flag; a temp tree needs no privileges), the rule is written.
        grant(&mut Changes::new(&root, false, true, &mut out)).unwrap();
        let written =
            std::fs::read_to_string(dir.path().join("etc/udev/rules.d/65-kore-kvm.rules"));
        assert_eq!(written.unwrap(), RULE);
        assert!(inspect(&root).rule.is_some());
    }

    #[test]
    fn group_lines_are_parsed_by_name() {
        let text = "kvmx:x:1:\nkvm:x:992:a,b\n";
        assert_eq!(group_gid(text, "kvm"), Some(992));
        assert_eq!(group_gid(text, "libvirt"), None);
    }
}
