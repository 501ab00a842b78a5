//! The VM: creation, boot, vCPU threads, exits and teardown.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use kore_boot_abi::{layout, ImageInfo};
use kvm_ioctls::Kvm;

use crate::boot::{self, BootError, BootParams};
use crate::config::VmConfig;
use crate::cpu::{self, CpuError};
use crate::devices::{self, serial::ConsoleLog, DeviceError};
use crate::loader::{self, LoaderError};
use crate::memory::{GuestRam, MemoryError, RamPlan};
use crate::preload::{self, PreloadError, Progress};
use crate::running::{CrashReport, RunningVm, Shared};
use crate::vcpu;

/// Errors starting or running a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The configuration is invalid.
    #[error("invalid VM configuration: {0}")]
    Config(String),
    /// `/dev/kvm` or a KVM call failed.
    #[error("KVM {what} failed: {source} (check that /dev/kvm exists and is accessible)")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// Preloading a file.
    #[error(transparent)]
    Preload(#[from] PreloadError),
    /// Loading the kernel or user image.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// Writing boot structures.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// Setting up a vCPU.
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// A device failed to start.
    #[error("device setup failed: {0}")]
    Device(#[from] DeviceError),
    /// The VM has no such device.
    #[error("this VM has no {0} device")]
    NoSuchDevice(&'static str),
    /// Resetting the vsock transport failed.
    #[error("vsock reset: {0}")]
    VsockReset(std::io::Error),
    /// The guest crashed (triple fault, internal error, failed entry...).
    #[error("{0}")]
    GuestCrashed(Box<CrashReport>),
    /// The VM was stopped (by [`RunningVm::stop`] or a signal) before the guest exited.
    #[error("the VM was stopped before the guest exited")]
    Stopped,
    /// Spawning a thread failed.
    #[error("spawning a VMM thread failed: {0}")]
    Thread(std::io::Error),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// Starts VMs.
pub struct Vm;

impl Vm {
    /// Creates, loads and starts a VM. `progress` sees preload progress.
    ///
    /// ```no_run
    /// use kore_vmm::{Vm, VmConfig};
    /// let vm = Vm::start(VmConfig::new("kernel.elf").memory_mib(512), &mut |_p| {})?;
    /// let status = vm.wait()?; // the guest's debug-exit status
    /// # Ok::<(), kore_vmm::VmError>(())
    /// ```
    pub fn start(
        config: VmConfig,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<RunningVm, VmError> {
        let started = Instant::now();
        if config.vcpus == 0 || config.vcpus > layout::MAX_VCPUS {
            return Err(VmError::Config(format!(
                "vcpus must be 1..={}, got {}",
                layout::MAX_VCPUS,
                config.vcpus
            )));
        }
        if let Some(vf) = &config.vf {
            // Before any memory is reserved: a missing piece fails fast, leaving nothing behind.
            crate::pci::vfio::preflight(std::path::Path::new("/"), vf)
                .map_err(|e| VmError::Device(e.into()))?;
        }
        let (slots, pack_bytes) = preload::plan(&config.preload)?;
        let plan = RamPlan::new(config.memory_bytes, pack_bytes, config.hugepages.bytes())?;
        let ram = GuestRam::new(plan.clone(), config.hugepages)?;
        let mem = ram.mem.clone();

        let kvm = Kvm::new().map_err(kvm_err("open /dev/kvm"))?;
        let vm = Arc::new(kvm.create_vm().map_err(kvm_err("CREATE_VM"))?);
        vm.set_tss_address(0xfffb_d000).map_err(kvm_err("SET_TSS_ADDR"))?;
        vm.create_irq_chip().map_err(kvm_err("CREATE_IRQCHIP"))?;
        for (slot, (r, host)) in plan.ranges.iter().zip(&ram.host_addrs).enumerate() {
            let region = kvm_bindings::kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: r.base,
                memory_size: r.size,
                userspace_addr: *host,
            };
            // SAFETY: the host range is a live mapping owned by `mem`, which
            // RunningVm keeps alive for as long as the VM fd exists.
            unsafe { vm.set_user_memory_region(region) }
                .map_err(kvm_err("SET_USER_MEMORY_REGION"))?;
        }

        let kernel =
            loader::load(&mem, &config.kernel, layout::KERNEL_BASE, layout::USER_IMAGE_LIMIT)?;
        let user_image = match &config.user_image {
            Some(p) => loader::load(&mem, p, layout::USER_IMAGE_BASE, layout::USER_IMAGE_LIMIT)?,
            None => ImageInfo::default(),
        };
        let pack_end = layout::PACK_BASE + plan.pack_bytes;
        boot::write_page_tables(&mem, &plan, pack_end)?;
        for cpu in 0..config.vcpus {
            boot::write_cpu_tables(&mem, cpu)?;
        }

        let console = Arc::new(Mutex::new(ConsoleLog::new(config.console_lines)));
        let devices = devices::attach(&vm, &mem, &plan, &config, console.clone())?;

        let vcpu0 = vm.create_vcpu(0).map_err(kvm_err("CREATE_VCPU"))?;
        let tsc_khz = vcpu0.get_tsc_khz().unwrap_or(0) as u64;
        let files = slots.iter().map(|s| (s.name.clone(), s.gpa, s.size)).collect();
        let params = BootParams {
            plan: &plan,
            vcpus: config.vcpus,
            tsc_khz,
            xcr0: cpu::guest_xcr0(config.guest_cpu),
            kernel,
            user_image,
            files,
            devices: devices.boot,
            cmdline: &config.cmdline,
        };
        let info = boot::boot_info(&params)?;
        boot::write_boot_info(&mem, &info)?;
        if !slots.is_empty() {
            let t = Instant::now();
            let n = preload::load(&mem, &slots, config.preload_cache, progress)?;
            let s = t.elapsed().as_secs_f64();
            tracing::info!("preloaded {n} bytes in {s:.3} s ({:.2} GB/s)", n as f64 / s / 1e9);
        }

        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("GET_SUPPORTED_CPUID"))?;
        let mut vcpus = vec![vcpu0];
        for i in 1..config.vcpus {
            vcpus.push(vm.create_vcpu(i as u64).map_err(kvm_err("CREATE_VCPU"))?);
        }
        for (i, v) in vcpus.iter().enumerate() {
            cpu::setup_vcpu(v, &cpuid, config.guest_cpu, i as u32, config.vcpus, kernel.entry)?;
        }

        let shared = Arc::new(Shared::new(console, devices.pio, devices.mmio));
        vcpu::install_kick_handler();
        let mut threads = Vec::new();
        let ncpus = config.vcpus;
        let entered = Instant::now();
        let filters = config.thread_filters;
        for (i, fd) in vcpus.into_iter().enumerate() {
            let (sh, m, entry) = (shared.clone(), mem.clone(), kernel.entry);
            let t = std::thread::Builder::new()
                .name(format!("kore-vcpu{i}"))
                .spawn(move || vcpu::run(fd, i as u32, ncpus, entry, sh, m, filters))
                .map_err(VmError::Thread)?;
            threads.push(t);
        }
        let vsock = devices.vsock;
        Ok(RunningVm { shared, threads, started, entered, vsock, _vm: vm, mem })
    }
}
