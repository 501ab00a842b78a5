//! What `kore-launch` and the VMM process say to each other: the [`VmmSpec`]
//! on the child's stdin, [`VmmEvent`] lines on its stdout.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything the VMM process needs to boot the VM.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmmSpec {
    /// The Kore kernel ELF.
    pub kernel: PathBuf,
    /// The ring-3 appliance image ELF.
    pub image: PathBuf,
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM besides the pack, MiB.
    pub memory_mib: u64,
    /// `2M`, `1G` or `off`.
    pub hugepages: String,
    /// The guest CPU level (`host`, `x86-64-v3`, `x86-64-v2`).
    pub guest_cpu: String,
    /// The vsock device's host socket.
    pub socket: PathBuf,
    /// Guest command line.
    pub cmdline: String,
    /// Files preloaded into guest RAM (the pack).
    pub preload: Vec<PathBuf>,
    /// Drop the preloaded files from the host's page cache behind the read
    /// (a pack large against the host's memory: guest RAM holds the only copy).
    #[serde(default)]
    pub drop_preload_cache: bool,
    /// A host PCI function to pass through with VFIO.
    pub vf: Option<String>,
    /// Confine the VMM after boot (seccomp, namespaces, no root).
    pub confine: bool,
}

/// What the VMM process confined (reported once the VM runs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// The process's pid.
    pub pid: u32,
    /// uid and gid it runs as.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Every VMM thread runs under its seccomp filter.
    pub seccomp: bool,
    /// It has its own network and mount namespaces.
    pub namespaces: bool,
    /// Its root is an empty, read-only tmpfs (no host file is reachable by path).
    #[serde(default)]
    pub empty_root: bool,
}

/// One line from the VMM process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum VmmEvent {
    /// Preload progress, bytes.
    Progress {
        /// Bytes loaded.
        done: u64,
        /// Bytes to load.
        total: u64,
    },
    /// A confinement step the host did not allow, or a fallback.
    Warning {
        /// One line for the user.
        message: String,
    },
    /// The vCPUs run and the VMM is confined.
    Started(Confinement),
    /// The last event: the guest exited (`status`), or the VM failed or was
    /// stopped (`error`); with the console's last lines.
    Exit {
        /// The guest's exit status.
        status: Option<u32>,
        /// Why the VM ended otherwise.
        error: Option<String>,
        /// The console's last lines.
        console: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_one_json_object_each_tagged_by_kind() {
        let started =
            VmmEvent::Started(Confinement { pid: 7, seccomp: true, ..Default::default() });
        let line = serde_json::to_string(&started).unwrap();
        assert!(line.starts_with(r#"{"event":"started","pid":7"#), "{line}");
        assert_eq!(serde_json::from_str::<VmmEvent>(&line).unwrap(), started);
        let exit = r#"{"event":"exit","status":0,"error":null,"console":["bye"]}"#;
        let want = VmmEvent::Exit { status: Some(0), error: None, console: vec!["bye".into()] };
        assert_eq!(serde_json::from_str::<VmmEvent>(exit).unwrap(), want);
    }

    #[test]
    fn a_spec_with_an_unknown_key_is_refused() {
        let spec = r#"{"kernel":"k","image":"i","vcpus":1,"memory_mib":64,"hugepages":"off",
            "guest_cpu":"host","socket":"s","cmdline":"","preload":[],"vf":null,"confine":true}"#;
        assert!(serde_json::from_str::<VmmSpec>(spec).is_ok());
        let extra = spec.replace("\"confine\"", "\"confined\":1,\"confine\"");
        assert!(serde_json::from_str::<VmmSpec>(&extra).is_err());
    }
}
