//! Kore VMM: runs the Kore guest on KVM with guest RAM in preallocated
//! hugepages, the model pack preloaded, a serial console, a debug-exit port
//! and virtio-vsock over a Unix socket (Firecracker's hybrid protocol).
//!
//! The guest-facing contract (memory layout, boot info, CPU state at entry)
//! lives in [`kore_boot_abi`]. The launcher uses three things:
//!
//! ```no_run
//! use kore_vmm::{HugePageSize, Vm, VmConfig};
//!
//! let config = VmConfig::new("target/kore-kernel.elf")
//!     .vcpus(2)
//!     .memory_mib(1024)
//!     .hugepages(HugePageSize::Size2M)
//!     .preload("model-packs/tiny/weights.safetensors")
//!     .vsock_uds("/run/kore/vsock.sock");
//! let vm = Vm::start(config, &mut |p| eprintln!("preload {}/{}", p.done, p.total))?;
//! let stopper = vm.stopper(); // e.g. for a Ctrl-C handler
//! # drop(stopper);
//! let status = vm.wait()?; // guest's debug-exit status
//! println!("guest exited with {status}");
//! # Ok::<(), kore_vmm::VmError>(())
//! ```

pub mod boot;
pub mod config;
pub mod cpu;
pub mod cpu_level;
pub mod devices;
pub mod loader;
pub mod memory;
pub mod preload;
pub mod signals;
pub mod vm;
pub mod vsock;

use std::sync::{Arc, Mutex};

pub use config::{HugePageSize, VmConfig};
pub use cpu_level::GuestCpu;
pub use preload::Progress;
pub use vm::{CrashReport, MmioDevice, RunningVm, Stopper, Vm, VmError};

type Attached = (Vec<kore_boot_abi::Device>, Vec<vm::MmioSlot>, Vec<Box<dyn std::any::Any + Send>>);

/// Creates the configured virtio devices: for now the vsock device (if
/// [`VmConfig::vsock_uds`] is set) at virtio-mmio slot 0, with its GSI
/// driven through an irqfd and its `QueueNotify` register backed by an
/// ioeventfd. The IOAPIC pin is left masked (`vector` 0 in the boot info):
/// the guest driver programs the redirection entry.
pub(crate) fn attach_devices(setup: &vm::Setup, config: &VmConfig) -> Result<Attached, VmError> {
    use devices::virtio::{mmio, vsock as dev};
    use kore_boot_abi::{layout, Device, DeviceKind};
    use vmm_sys_util::eventfd::EventFd;

    let Some(uds) = &config.vsock_uds else { return Ok((Vec::new(), Vec::new(), Vec::new())) };
    let err = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| VmError::Device(format!("vsock {what}: {e}"))
    };
    let base = layout::VIRTIO_MMIO_BASE;
    let gsi = layout::VIRTIO_GSI_BASE;
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(err("irq eventfd"))?;
    setup
        .vm
        .register_irqfd(&irq, gsi)
        .map_err(|source| VmError::Kvm { what: "IRQFD (vsock)", source })?;
    let notify = EventFd::new(libc::EFD_NONBLOCK).map_err(err("notify eventfd"))?;
    setup
        .vm
        .register_ioevent(
            &notify,
            &kvm_ioctls::IoEventAddress::Mmio(base + mmio::reg::QUEUE_NOTIFY),
            kvm_ioctls::NoDatamatch,
        )
        .map_err(|source| VmError::Kvm { what: "IOEVENTFD (vsock)", source })?;
    let wake = EventFd::new(libc::EFD_NONBLOCK).map_err(err("wake eventfd"))?;
    let transport = mmio::MmioTransport::new(
        dev::DEVICE_ID,
        dev::F_STREAM,
        &[dev::QUEUE_MAX; 3],
        config.guest_cid.to_le_bytes().to_vec(),
        setup.mem.clone(),
        irq,
        wake.try_clone().map_err(err("wake eventfd"))?,
    )
    .map_err(|e| VmError::Device(format!("vsock queues: {e}")))?;
    let transport = Arc::new(Mutex::new(transport));
    let handle = dev::spawn(transport.clone(), config.guest_cid, uds, notify, wake)
        .map_err(|e| VmError::Device(e.to_string()))?;
    let device = Device {
        kind: DeviceKind::VirtioVsock as u32,
        gsi,
        mmio_base: base,
        mmio_size: layout::VIRTIO_MMIO_SIZE,
        vector: 0,
        reserved: 0,
        arg0: config.guest_cid,
    };
    let mmio_dev: Arc<Mutex<dyn MmioDevice>> = transport;
    Ok((vec![device], vec![(base, layout::VIRTIO_MMIO_SIZE, mmio_dev)], vec![Box::new(handle)]))
}
