//! Emulated devices and the buses they sit on: the serial console on the
//! port-I/O bus, the virtio-mmio transport and the virtio-vsock device on the
//! MMIO bus, and the PCI host bridge ([`pci`]). [`attach`] builds them for a VM and returns typed handles
//! ([`Devices`]); the VM core keeps only the lifecycle ports of
//! [`kore_boot_abi::ports`] (debug exit, markers, AP release) for itself.

pub mod bus;
pub mod pci;
pub mod serial;
pub mod virtio;

use std::sync::{Arc, Mutex};

use kore_boot_abi::{layout, ports, Device, DeviceKind};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use self::bus::{Bus, BusError};
use self::serial::{ConsoleLog, IrqTrigger, SerialDevice, Sink};
use self::virtio::mmio::{self, MmioTransport};
use self::virtio::vsock::{self, VsockError, VsockHandle};
use crate::config::VmConfig;
use crate::memory::RamPlan;

/// Errors creating a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// An eventfd could not be created.
    #[error("{what} eventfd: {source}")]
    EventFd {
        /// Which one.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Registering an irqfd or ioeventfd with KVM failed.
    #[error("KVM {what} failed: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// The device could not be placed on its bus.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The vsock device.
    #[error(transparent)]
    Vsock(#[from] VsockError),
    /// A PCI function's config space.
    #[error("PCI: {0}")]
    PciConfig(#[from] crate::pci::config::ConfigError),
    /// The PCI bus or its BAR windows.
    #[error("PCI: {0}")]
    PciHost(#[from] crate::pci::host::HostError),
    /// MSI-X delivery.
    #[error("PCI MSI-X: {0}")]
    PciIrq(#[from] crate::pci::irq::IrqError),
    /// VFIO passthrough (the message names what is missing).
    #[error(transparent)]
    Vfio(#[from] crate::pci::vfio::VfioError),
}

/// The devices of one VM, by kind.
pub struct Devices {
    /// Port-I/O bus (the serial console).
    pub pio: Bus,
    /// MMIO bus (virtio-mmio windows).
    pub mmio: Bus,
    /// What the boot info lists for the guest.
    pub boot: Vec<Device>,
    /// The vsock device's backend (event loop, Unix socket), if configured.
    pub vsock: Option<VsockHandle>,
}

fn eventfd(what: &'static str) -> Result<EventFd, DeviceError> {
    EventFd::new(libc::EFD_NONBLOCK).map_err(|source| DeviceError::EventFd { what, source })
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> DeviceError {
    move |source| DeviceError::Kvm { what, source }
}

/// Creates the serial console (COM1, its GSI driven through an irqfd),
/// the vsock device at virtio-mmio slot 0 if [`VmConfig::vsock_uds`] is set,
/// and the PCI host bridge if any PCI function is configured.
pub fn attach(
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    plan: &RamPlan,
    config: &VmConfig,
    console: Arc<Mutex<ConsoleLog>>,
) -> Result<Devices, DeviceError> {
    let mut devices = Devices { pio: Bus::new(), mmio: Bus::new(), boot: Vec::new(), vsock: None };
    let serial_irq = eventfd("serial irq")?;
    vm.register_irqfd(&serial_irq, ports::SERIAL_GSI).map_err(kvm("IRQFD (serial)"))?;
    let serial: SerialDevice = SerialDevice::new(IrqTrigger(serial_irq), Sink(console));
    let serial = Arc::new(Mutex::new(serial));
    devices.pio.insert(serial, ports::SERIAL_COM1.into(), ports::SERIAL_PORTS.into())?;
    if config.vsock_uds.is_some() {
        attach_vsock(vm, mem, config, &mut devices)?;
    }
    pci::attach_pci(vm, mem, plan, config, &mut devices)?;
    Ok(devices)
}

/// The vsock device: its GSI driven through an irqfd and its `QueueNotify`
/// register backed by an ioeventfd. The IOAPIC pin is left masked (`vector`
/// 0 in the boot info): the guest driver programs the redirection entry.
fn attach_vsock(
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    config: &VmConfig,
    devices: &mut Devices,
) -> Result<(), DeviceError> {
    let Some(uds) = &config.vsock_uds else { return Ok(()) };
    let (base, size, gsi) =
        (layout::VIRTIO_MMIO_BASE, layout::VIRTIO_MMIO_SIZE, layout::VIRTIO_GSI_BASE);
    let irq = eventfd("vsock irq")?;
    vm.register_irqfd(&irq, gsi).map_err(kvm("IRQFD (vsock)"))?;
    let notify = eventfd("vsock notify")?;
    let doorbell = IoEventAddress::Mmio(base + mmio::reg::QUEUE_NOTIFY);
    vm.register_ioevent(&notify, &doorbell, NoDatamatch).map_err(kvm("IOEVENTFD (vsock)"))?;
    let wake = eventfd("vsock wake")?;
    let wake_dev =
        wake.try_clone().map_err(|source| DeviceError::EventFd { what: "vsock wake", source })?;
    let transport = MmioTransport::new(
        vsock::DEVICE_ID,
        vsock::F_STREAM,
        &[vsock::QUEUE_MAX; 3],
        config.guest_cid.to_le_bytes().to_vec(),
        mem.clone(),
        irq,
        wake_dev,
    )
    .map_err(VsockError::Queue)?;
    let transport = Arc::new(Mutex::new(transport));
    devices.vsock = Some(vsock::spawn(transport.clone(), config.guest_cid, uds, notify, wake)?);
    devices.mmio.insert(transport, base, size)?;
    devices.boot.push(Device {
        kind: DeviceKind::VirtioVsock as u32,
        gsi,
        mmio_base: base,
        mmio_size: size,
        vector: 0,
        reserved: 0,
        arg0: config.guest_cid,
    });
    Ok(())
}
