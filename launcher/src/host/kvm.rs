//! Probing `/dev/kvm`: present, openable, and answering `KVM_GET_API_VERSION`.

use super::Sys;
use std::os::fd::AsRawFd;

/// `KVM_GET_API_VERSION` = `_IO(KVMIO, 0x00)` with KVMIO = 0xAE.
const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
/// The only KVM API version Linux has ever reported.
pub const KVM_API_VERSION: i32 = 12;

/// What probing `/dev/kvm` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmProbe {
    /// No `/dev/kvm`.
    Missing,
    /// It exists but we may not open it.
    Denied,
    /// It opened but the ioctl failed (not a KVM device).
    NotKvm(String),
    /// The API version the kernel reported.
    Api(i32),
}

/// Opens `/dev/kvm` (under the root of `sys`) and asks its API version.
pub fn probe(sys: &dyn Sys) -> KvmProbe {
    let path = sys.locate("/dev/kvm");
    let file = match std::fs::OpenOptions::new().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return KvmProbe::Missing,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return KvmProbe::Denied,
        Err(e) => return KvmProbe::NotKvm(e.to_string()),
    };
    // SAFETY: KVM_GET_API_VERSION takes no argument and writes no memory; the
    // descriptor is valid for the duration of the call (owned by `file`).
    let version = unsafe { libc::ioctl(file.as_raw_fd(), KVM_GET_API_VERSION, 0) };
    if version < 0 {
        KvmProbe::NotKvm(std::io::Error::last_os_error().to_string())
    } else {
        KvmProbe::Api(version)
    }
}
