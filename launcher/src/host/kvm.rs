//! Probing `/dev/kvm`: present, openable, and answering `KVM_GET_API_VERSION`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use kvm_ioctls::Kvm;

use super::Sys;

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
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return KvmProbe::NotKvm("the path has a NUL byte".into());
    };
    let kvm = match Kvm::new_with_path(&path) {
        Ok(kvm) => kvm,
        Err(e) if e.errno() == libc::ENOENT => return KvmProbe::Missing,
        Err(e) if e.errno() == libc::EACCES || e.errno() == libc::EPERM => return KvmProbe::Denied,
        Err(e) => return KvmProbe::NotKvm(e.to_string()),
    };
    // `get_api_version` returns the raw ioctl result: negative with errno set.
    match kvm.get_api_version() {
        v if v < 0 => KvmProbe::NotKvm(std::io::Error::last_os_error().to_string()),
        v => KvmProbe::Api(v),
    }
}
