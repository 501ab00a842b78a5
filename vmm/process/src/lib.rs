//! kore-vmm-process: the VMM's own process, the binary `kore-vmm`, as Firecracker
//! keeps its VMM apart from everything else. `kore-launch` starts it, writes a
//! [`VmmSpec`] (one JSON object) to its stdin and reads [`VmmEvent`]s (JSON lines)
//! from its stdout; the process boots the VM and then confines itself ([`run`]).
//!
//! It links the VMM, its sandbox and the JSON of the spec and events, nothing else:
//! no HTTP server, no async runtime, no engine (scripts/check_vmm_deps.sh checks
//! `cargo tree`), so a guest that took over the VMM finds little code to reuse.
//! The launcher uses this library only for the [`spec`] types.

mod run;
pub mod spec;

pub use run::{run, ProcessError};
pub use spec::{Confinement, VmmEvent, VmmSpec};

/// The binary's file name (what `kore-launch` starts).
pub const BINARY: &str = "kore-vmm";
