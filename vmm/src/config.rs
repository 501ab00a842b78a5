//! [`VmConfig`]: what to boot and with what resources.

use std::path::{Path, PathBuf};

/// The hugepage size backing guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePageSize {
    /// 2 MiB pages (the default).
    Size2M,
    /// 1 GiB pages (reserve them with `hugepages-1048576kB`).
    Size1G,
    /// Ordinary 4 KiB pages (a warning is logged: slower, not reserved up front).
    Off,
}

impl HugePageSize {
    /// Page size in bytes (4096 for [`HugePageSize::Off`]).
    pub fn bytes(self) -> u64 {
        match self {
            Self::Size2M => 2 << 20,
            Self::Size1G => 1 << 30,
            Self::Off => 4096,
        }
    }

    /// The sysfs directory name of this pool, e.g. `hugepages-2048kB`.
    pub fn sysfs_name(self) -> &'static str {
        match self {
            Self::Size2M => "hugepages-2048kB",
            Self::Size1G => "hugepages-1048576kB",
            Self::Off => "none",
        }
    }
}

/// Configuration of one VM. Build it with the chained setters.
///
/// ```
/// use kore_vmm::{HugePageSize, VmConfig};
/// let cfg = VmConfig::new("guest.elf")
///     .vcpus(2)
///     .memory_mib(512)
///     .hugepages(HugePageSize::Size2M)
///     .preload("pack/weights.safetensors")
///     .vsock_uds("/tmp/kore.vsock")
///     .cmdline("log=info");
/// assert_eq!(cfg.vcpus, 2);
/// assert_eq!(cfg.memory_bytes, 512 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Number of vCPUs (1..=64).
    pub vcpus: u32,
    /// Guest RAM for the guest's own use (kernel, heap), in bytes. Preloaded
    /// files get their own RAM on top of this.
    pub memory_bytes: u64,
    /// Hugepage size backing guest RAM.
    pub hugepages: HugePageSize,
    /// The kernel ELF (static, `ET_EXEC`, loaded by physical address).
    pub kernel: PathBuf,
    /// An optional ring-3 user image ELF, loaded into the user-image region.
    pub user_image: Option<PathBuf>,
    /// Files preloaded into guest RAM at [`kore_boot_abi::layout::PACK_BASE`].
    pub preload: Vec<PathBuf>,
    /// Whether the preloaded files' pages stay in the host's page cache.
    pub preload_cache: crate::preload::CacheAfterRead,
    /// Host Unix socket path of the vsock device (Firecracker's hybrid
    /// vsock); `None` attaches no vsock device.
    pub vsock_uds: Option<PathBuf>,
    /// The guest's vsock CID (default 3).
    pub guest_cid: u64,
    /// The guest command line.
    pub cmdline: String,
    /// Lines of console output kept for error reports and [`crate::RunningVm::console_lines`].
    pub console_lines: usize,
    /// The CPU the guest sees (CPUID bits and XCR0).
    pub guest_cpu: crate::GuestCpu,
    /// Seccomp filters each VMM thread installs when it starts (none: the
    /// threads run unfiltered, as in tests that boot VMs in-process).
    pub thread_filters: Option<crate::sandbox::ThreadFilters>,
    /// Attach the emulated kore-dma PCI test device (feature `test-devices`).
    #[cfg(feature = "test-devices")]
    pub pci_test_device: bool,
    /// A host PCI function (`DDDD:BB:DD.F`, bound to vfio-pci) to pass
    /// through with VFIO.
    pub vf: Option<String>,
}

impl VmConfig {
    /// A 1-vCPU, 256 MiB, 2 MiB-hugepage VM booting `kernel`.
    pub fn new(kernel: impl AsRef<Path>) -> Self {
        Self {
            vcpus: 1,
            memory_bytes: 256 << 20,
            hugepages: HugePageSize::Size2M,
            kernel: kernel.as_ref().to_path_buf(),
            user_image: None,
            preload: Vec::new(),
            preload_cache: crate::preload::CacheAfterRead::Keep,
            vsock_uds: None,
            guest_cid: 3,
            cmdline: String::new(),
            console_lines: 200,
            guest_cpu: crate::GuestCpu::Host,
            thread_filters: None,
            #[cfg(feature = "test-devices")]
            pci_test_device: false,
            vf: None,
        }
    }

    /// Sets the vCPU count.
    pub fn vcpus(mut self, n: u32) -> Self {
        self.vcpus = n;
        self
    }

    /// Sets the guest's own RAM in MiB.
    pub fn memory_mib(mut self, mib: u64) -> Self {
        self.memory_bytes = mib << 20;
        self
    }

    /// Sets the CPU level the guest sees.
    pub fn guest_cpu(mut self, level: crate::GuestCpu) -> Self {
        self.guest_cpu = level;
        self
    }

    /// Has every vCPU and device thread install its seccomp filter
    /// ([`crate::sandbox`]) before it runs.
    pub fn thread_filters(mut self, filters: crate::sandbox::ThreadFilters) -> Self {
        self.thread_filters = Some(filters);
        self
    }

    /// Sets the hugepage size.
    pub fn hugepages(mut self, size: HugePageSize) -> Self {
        self.hugepages = size;
        self
    }

    /// Loads a ring-3 user image ELF as well.
    pub fn user_image(mut self, path: impl AsRef<Path>) -> Self {
        self.user_image = Some(path.as_ref().to_path_buf());
        self
    }

    /// Adds a file to preload (in order).
    pub fn preload(mut self, path: impl AsRef<Path>) -> Self {
        self.preload.push(path.as_ref().to_path_buf());
        self
    }

    /// Sets what happens to the preloaded files' pages in the host's page cache.
    pub fn preload_cache(mut self, cache: crate::preload::CacheAfterRead) -> Self {
        self.preload_cache = cache;
        self
    }

    /// Attaches a vsock device whose host side is the Unix socket `path`.
    pub fn vsock_uds(mut self, path: impl AsRef<Path>) -> Self {
        self.vsock_uds = Some(path.as_ref().to_path_buf());
        self
    }

    /// Attaches the emulated kore-dma PCI test device (feature `test-devices`).
    #[cfg(feature = "test-devices")]
    pub fn pci_test_device(mut self, on: bool) -> Self {
        self.pci_test_device = on;
        self
    }

    /// Passes the host PCI function `addr` (e.g. `0000:3b:00.2`, bound to
    /// vfio-pci) through to the guest.
    pub fn vf(mut self, addr: impl Into<String>) -> Self {
        self.vf = Some(addr.into());
        self
    }

    /// Sets the guest command line.
    pub fn cmdline(mut self, cmdline: impl Into<String>) -> Self {
        self.cmdline = cmdline.into();
        self
    }
}
