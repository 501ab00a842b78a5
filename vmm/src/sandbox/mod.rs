//! Confinement of the VMM: what each VMM thread may still do once the VM is
//! set up, and the process-wide privileges it gives up.
//!
//! Layers, each applied where the host allows it and reported otherwise:
//! - [`seccomp`]: a seccomp-bpf allowlist per [`ThreadKind`] (built with
//!   `seccompiler`, as Firecracker does); any other system call kills the
//!   whole process with `SIGSYS`. Installing a filter sets `NO_NEW_PRIVS`.
//! - [`privileges`]: no core dumps and no `ptrace` attach by other users
//!   (`PR_SET_DUMPABLE` 0: a dump would hold guest memory), rlimits on open
//!   files and core size, new network and mount namespaces (no network at
//!   all), an empty read-only root instead of the host's file tree, and,
//!   when started as root, an unprivileged uid/gid.
//!
//! The filters assume everything is already open: `/dev/kvm` and the VM and
//! vCPU descriptors, guest memory, the pack, the vsock listener. docs/security.md
//! has the threat model and what each layer stops.

pub mod privileges;
pub mod seccomp;

pub use privileges::{drop_privileges, empty_root, enter_namespaces, Dropped, PrivilegeError};
pub use seccomp::{apply, filter, SeccompError, ThreadFilters, ThreadKind};

#[cfg(test)]
mod tests;
