//! [`HostError`]: what went wrong while checking or preparing the host, and
//! what to do about it. Every message ends with the fix.

use std::path::PathBuf;

/// A failure while reading or changing the host's configuration.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A sysfs/procfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file, as seen on the host.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file could not be written.
    #[error("cannot write `{value}` to {path}: {source}{}", write_hint(source))]
    Write {
        /// The file, as seen on the host.
        path: String,
        /// What we tried to write.
        value: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file held something we could not parse.
    #[error("unexpected contents in {path}: {contents:?} (expected {expected})")]
    Parse {
        /// The file, as seen on the host.
        path: String,
        /// What it held (trimmed).
        contents: String,
        /// What we expected.
        expected: &'static str,
    },
    /// A change is needed but we are not root.
    #[error("{what} needs root: run `sudo kore-launch setup` (or `kore-launch setup --dry-run` to see the changes first)")]
    NotRoot {
        /// The change that needs privileges.
        what: String,
    },
    /// The kernel granted fewer hugepages than asked.
    #[error(
        "the kernel reserved only {granted} of {wanted} hugepages of {size} ({needed_mib} MiB needed); \
         memory is too fragmented or too small: free memory and retry \
         (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches; echo 1 | sudo tee /proc/sys/vm/compact_memory`), \
         or reserve them at boot with the kernel parameters `{boot_param}`, or lower `context`"
    )]
    PoolShort {
        /// The page size, e.g. "2 MiB".
        size: String,
        /// Pool size we asked for.
        wanted: u64,
        /// Pool size the kernel gave.
        granted: u64,
        /// MiB the appliance needs.
        needed_mib: u64,
        /// The kernel command-line parameters that reserve the pool at boot.
        boot_param: String,
    },
    /// The kernel has no pool for this page size.
    #[error("no {size} hugepage pool ({path} is missing): {fix}")]
    NoPool {
        /// The page size, e.g. "1 GiB".
        size: String,
        /// The missing directory.
        path: String,
        /// What to do.
        fix: &'static str,
    },
    /// A PCI device is not there.
    #[error("no PCI device {addr} ({path} is missing): check the address with `lspci -D`")]
    NoDevice {
        /// The PCI address.
        addr: String,
        /// The missing sysfs directory.
        path: String,
    },
    /// The device cannot create SR-IOV virtual functions.
    #[error("{addr} does not support SR-IOV (no sriov_totalvfs): use a GPU and driver with SR-IOV (Intel Arc Pro B-series / Data Center Flex with the xe or i915 driver) and enable SR-IOV in the firmware setup")]
    NoSriov {
        /// The PCI address.
        addr: String,
    },
    /// More VFs asked than the device supports.
    #[error(
        "{addr} supports at most {total} VFs, {wanted} were asked: use `--vfs {total}` or fewer"
    )]
    TooManyVfs {
        /// The PCI address.
        addr: String,
        /// sriov_totalvfs.
        total: u64,
        /// What was asked.
        wanted: u64,
    },
    /// VFs are already enabled with a different count.
    #[error("{addr} already has {current} VFs enabled; changing to {wanted} removes the existing ones: \
             if none is in use, run `echo 0 | sudo tee {path}` and retry, or use `--vfs {current}`")]
    VfsInUse {
        /// The PCI address.
        addr: String,
        /// Current sriov_numvfs.
        current: u64,
        /// What was asked.
        wanted: u64,
        /// The sriov_numvfs path.
        path: String,
    },
    /// The VF did not appear after enabling SR-IOV.
    #[error("virtual function {index} of {addr} is not there after enabling SR-IOV ({path} missing): check `dmesg` for the driver's error")]
    NoVf {
        /// The PF's PCI address.
        addr: String,
        /// VF index.
        index: u64,
        /// The missing virtfnN link.
        path: String,
    },
    /// vfio-pci is not loaded.
    #[error("the vfio-pci driver is not loaded ({path} is missing): run `sudo modprobe vfio-pci` (and add `vfio-pci` to /etc/modules-load.d/vfio-pci.conf to keep it)")]
    NoVfioPci {
        /// /sys/bus/pci/drivers/vfio-pci.
        path: String,
    },
    /// Binding to vfio-pci did not take.
    #[error("{addr} is bound to {driver} instead of vfio-pci after probing: check `dmesg`; make sure the IOMMU is on (`intel_iommu=on iommu=pt` on the kernel command line) and vfio-pci is loaded")]
    BindFailed {
        /// The PCI address.
        addr: String,
        /// The driver it ended up with ("no driver" if none).
        driver: String,
    },
    /// The device has no IOMMU group.
    #[error("{addr} has no IOMMU group: turn the IOMMU on (kernel parameters `intel_iommu=on iommu=pt`, or `amd_iommu=on` on AMD; VT-d/AMD-Vi in the firmware setup) and reboot")]
    NoIommuGroup {
        /// The PCI address.
        addr: String,
    },
    /// Other devices in the IOMMU group are bound to host drivers.
    #[error("IOMMU group {group} of {addr} is not viable: {others} bound to host drivers; bind every device of the group to vfio-pci (`kore-launch setup --vf ADDR` for each) or move the card to a slot with its own group")]
    GroupNotViable {
        /// The device we want to pass through.
        addr: String,
        /// The group number.
        group: String,
        /// The offending devices with their drivers, e.g. "0000:03:00.1 (snd_hda_intel)".
        others: String,
    },
    /// A PCI address was malformed.
    #[error(
        "`{0}` is not a PCI address: write it as DDDD:BB:DD.F, e.g. 0000:03:00.0 (see `lspci -D`)"
    )]
    BadAddress(String),
    /// The model pack could not be sized.
    #[error("cannot size the model at {path}: {reason}; pass `--model PATH` with a pack or Hugging Face directory")]
    Pack {
        /// The pack directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A host command `setup` runs failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status or why it could not start.
        detail: String,
    },
    /// Writing the report failed.
    #[error("cannot write the report: {0}")]
    Output(#[from] std::io::Error),
}

fn write_hint(err: &std::io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => " (needs root: run with sudo)",
        Some(libc::EBUSY) => " (the device is busy: stop what uses it)",
        Some(libc::ENOMEM) => " (not enough contiguous free memory)",
        Some(libc::EINVAL) => " (the kernel rejected the value; see `dmesg`)",
        _ => "",
    }
}
