//! MSI delivery through KVM: one GSI per vector, a `KVM_IRQ_ROUTING_MSI`
//! entry per routed GSI and an irqfd (eventfd) per GSI.
//!
//! `KVM_SET_GSI_ROUTING` replaces the whole table, so [`GsiRouter`] keeps
//! it: the default IOAPIC/PIC pin routes (as KVM sets them up with the
//! in-kernel irqchip, which the serial and virtio irqfds rely on) plus every
//! MSI route. [`KvmMsiSink`] is the [`MsiSink`] of one function.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::EventFd;

use super::msix::{MsiMessage, MsiSink};

/// IOAPIC pins; MSI GSIs are allocated above them.
pub const IOAPIC_PINS: u32 = 24;
/// Most GSIs KVM routes (`KVM_MAX_IRQ_ROUTES`).
const MAX_GSI: u32 = 4096;

/// Errors setting up MSI delivery.
#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    /// Out of GSIs.
    #[error("out of KVM GSIs for MSI vectors")]
    NoGsi,
    /// An eventfd could not be created.
    #[error("MSI eventfd: {0}")]
    EventFd(std::io::Error),
    /// A KVM call failed.
    #[error("KVM {what} failed: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
}

/// The VM's GSI routing table.
pub struct GsiRouter {
    vm: Arc<VmFd>,
    state: Mutex<RouterState>,
}

struct RouterState {
    next: u32,
    msi: BTreeMap<u32, MsiMessage>,
}

impl GsiRouter {
    /// A router for `vm` (whose in-kernel irqchip exists).
    pub fn new(vm: Arc<VmFd>) -> Self {
        Self { vm, state: Mutex::new(RouterState { next: IOAPIC_PINS, msi: BTreeMap::new() }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RouterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh GSI for an MSI vector.
    pub fn alloc(&self) -> Result<u32, IrqError> {
        let mut s = self.state();
        if s.next >= MAX_GSI {
            return Err(IrqError::NoGsi);
        }
        s.next += 1;
        Ok(s.next - 1)
    }

    /// Routes `gsi` to `msg` (`None`: removes its route) and commits the table.
    pub fn set(&self, gsi: u32, msg: Option<MsiMessage>) -> Result<(), IrqError> {
        let mut s = self.state();
        match msg {
            Some(m) => s.msi.insert(gsi, m),
            None => s.msi.remove(&gsi),
        };
        let entries = routing_entries(&s.msi);
        let table = KvmIrqRouting::from_entries(&entries).map_err(|_| IrqError::NoGsi)?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(|source| IrqError::Kvm { what: "SET_GSI_ROUTING", source })
    }

    /// Registers `fd` as the irqfd of `gsi`.
    pub fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), IrqError> {
        self.vm.register_irqfd(fd, gsi).map_err(|source| IrqError::Kvm { what: "IRQFD", source })
    }

    /// Unregisters `fd` from `gsi` (teardown).
    pub fn unregister_irqfd(&self, fd: &EventFd, gsi: u32) {
        if let Err(e) = self.vm.unregister_irqfd(fd, gsi) {
            tracing::debug!("IRQFD deassign of GSI {gsi}: {e}");
        }
    }
}

fn irqchip(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry { gsi, type_: KVM_IRQ_ROUTING_IRQCHIP, ..Default::default() };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

/// The whole table: KVM's default pin routes, then the MSI routes.
pub fn routing_entries(msi: &BTreeMap<u32, MsiMessage>) -> Vec<kvm_irq_routing_entry> {
    let mut v = Vec::with_capacity(40 + msi.len());
    for gsi in 0..16 {
        let chip = if gsi < 8 { KVM_IRQCHIP_PIC_MASTER } else { KVM_IRQCHIP_PIC_SLAVE };
        v.push(irqchip(gsi, chip, gsi % 8));
    }
    for gsi in 0..IOAPIC_PINS {
        v.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
    }
    for (&gsi, m) in msi {
        let mut e = kvm_irq_routing_entry { gsi, type_: KVM_IRQ_ROUTING_MSI, ..Default::default() };
        e.u.msi.address_lo = m.addr as u32;
        e.u.msi.address_hi = (m.addr >> 32) as u32;
        e.u.msi.data = m.data;
        v.push(e);
    }
    v
}

/// One function's vectors: a GSI and an irqfd each.
pub struct KvmMsiSink {
    router: Arc<GsiRouter>,
    vectors: Vec<(u32, EventFd)>,
    passthrough: bool,
}

impl KvmMsiSink {
    /// Allocates `n` GSIs and registers an irqfd for each.
    pub fn new(router: Arc<GsiRouter>, n: u16) -> Result<Self, IrqError> {
        let mut sink = Self { router, vectors: Vec::new(), passthrough: false };
        for _ in 0..n {
            let gsi = sink.router.alloc()?;
            let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(IrqError::EventFd)?;
            sink.router.register_irqfd(&fd, gsi)?;
            sink.vectors.push((gsi, fd));
        }
        Ok(sink)
    }

    /// The irqfd of vector `v`.
    pub fn eventfd(&self, v: u16) -> Option<&EventFd> {
        self.vectors.get(usize::from(v)).map(|(_, fd)| fd)
    }

    /// For a passthrough function, whose device signals the irqfds itself:
    /// masking a vector detaches its irqfd (the eventfd keeps counting) and
    /// unmasking attaches it again, which delivers an interrupt that arrived
    /// meanwhile. Returns the sink and a duplicate of each vector's eventfd.
    pub fn into_passthrough(mut self) -> Result<(Self, Vec<EventFd>), IrqError> {
        self.passthrough = true;
        for v in 0..self.vectors.len() as u16 {
            self.hold(v, true); // every entry is masked after reset
        }
        let fds = self.vectors.iter().map(|(_, fd)| fd.try_clone()).collect::<Result<_, _>>();
        Ok((self, fds.map_err(IrqError::EventFd)?))
    }
}

impl MsiSink for KvmMsiSink {
    fn route(&mut self, vector: u16, msg: Option<MsiMessage>) {
        let Some((gsi, _)) = self.vectors.get(usize::from(vector)) else { return };
        if let Err(e) = self.router.set(*gsi, msg) {
            tracing::warn!("MSI-X vector {vector}: routing failed: {e}");
        }
    }

    fn mask(&mut self, vector: u16, masked: bool) {
        if self.passthrough {
            self.hold(vector, masked);
        }
    }

    fn fire(&mut self, vector: u16) {
        if let Some((_, fd)) = self.vectors.get(usize::from(vector)) {
            if let Err(e) = fd.write(1) {
                tracing::warn!("MSI-X vector {vector}: irqfd write failed: {e}");
            }
        }
    }
}

impl KvmMsiSink {
    fn hold(&mut self, vector: u16, masked: bool) {
        let Some((gsi, fd)) = self.vectors.get(usize::from(vector)) else { return };
        if masked {
            self.router.unregister_irqfd(fd, *gsi);
        } else if let Err(e) = self.router.register_irqfd(fd, *gsi) {
            tracing::warn!("MSI-X vector {vector}: irqfd re-attach failed: {e}");
        }
    }
}

impl Drop for KvmMsiSink {
    fn drop(&mut self) {
        for (gsi, fd) in &self.vectors {
            self.router.unregister_irqfd(fd, *gsi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_keeps_default_pins_and_adds_msi() {
        let mut msi = BTreeMap::new();
        msi.insert(24, MsiMessage { addr: 0xfee0_1000, data: 0x41 });
        let t = routing_entries(&msi);
        let pins = t.iter().filter(|e| e.type_ == KVM_IRQ_ROUTING_IRQCHIP).count();
        assert_eq!(pins, 16 + 24, "PIC and IOAPIC pins, as KVM's default table");
        let m = t.last().unwrap();
        assert_eq!((m.gsi, m.type_), (24, KVM_IRQ_ROUTING_MSI));
        // SAFETY: the entry was built as an MSI entry just above.
        let (lo, data) = unsafe { (m.u.msi.address_lo, m.u.msi.data) };
        assert_eq!((lo, data), (0xfee0_1000, 0x41));
        assert!(KvmIrqRouting::from_entries(&t).is_ok());
    }

    /// Real KVM: the table is accepted and a vector's irqfd can be signalled.
    #[cfg(feature = "kvm-tests")]
    #[test]
    fn kvm_accepts_routes_and_irqfds() {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = Arc::new(kvm.create_vm().unwrap());
        vm.create_irq_chip().unwrap();
        let router = Arc::new(GsiRouter::new(vm));
        let mut sink = KvmMsiSink::new(router.clone(), 2).unwrap();
        sink.route(0, Some(MsiMessage { addr: 0xfee0_0000, data: 0x40 }));
        sink.route(1, None);
        sink.fire(0);
        assert!(sink.eventfd(1).is_some() && sink.eventfd(2).is_none());
        assert_eq!(router.alloc().unwrap(), IOAPIC_PINS + 2);
    }
}
