//! [`VfioPci`]: a host PCI function presented to the guest through a
//! [`VfioLayer`]. Config space is passed through except the BARs (a shadow
//! [`ConfigSpace`] holds the VMM-placed addresses and answers sizing), the
//! expansion ROM (reads 0) and the MSI-X Message Control (emulated by
//! [`Msix`], the device's vectors enabled through VFIO with one KVM irqfd
//! each). BAR pages outside the MSI-X table and PBA are KVM memory slots
//! onto the device's mmapped BARs ([`GuestSlots`]); the rest is trapped and
//! served here. The function is reset when it is opened and when dropped,
//! and every mapping is undone on drop, so the VF is usable again.

use vmm_sys_util::eventfd::EventFd;

use super::plan::{self, DmaMapping, MsixLayout, PlacedBar};
use super::{VfioError, VfioLayer, CONFIG_REGION};
use crate::pci::config::{reg, BarSpec, ConfigSpace};
use crate::pci::host::BarAllocator;
use crate::pci::msix::Msix;
use crate::pci::PciDevice;

/// Maps host memory into guest-physical space (KVM memory slots in a VM).
pub trait GuestSlots: Send {
    /// Maps `size` bytes of host memory at `host` to guest-physical `gpa`;
    /// returns a handle for [`GuestSlots::unmap`].
    fn map(&mut self, gpa: u64, size: u64, host: u64) -> Result<u32, String>;
    /// Removes a mapping.
    fn unmap(&mut self, handle: u32);
}

/// The irqfds of the device's MSI-X vectors (owned by its [`Msix`] sink).
pub type IrqFds = Vec<EventFd>;

/// A passed-through function.
pub struct VfioPci {
    addr: String,
    layer: Box<dyn VfioLayer>,
    slots: Box<dyn GuestSlots>,
    shadow: ConfigSpace,
    bars: Vec<PlacedBar>,
    msix: Option<(MsixLayout, Msix, IrqFds)>,
    msix_on: bool,
    dma: Vec<DmaMapping>,
    maps: Vec<(u32, u64, u64)>,
}

/// What [`VfioPci::open`] needs besides the device.
pub struct Wiring<'a> {
    /// Guest RAM as `(gpa, size, host)`.
    pub ram: &'a [(u64, u64, u64)],
    /// 32-bit BAR window.
    pub bars32: &'a mut BarAllocator,
    /// 64-bit BAR window.
    pub bars64: &'a mut BarAllocator,
    /// Builds the MSI-X state for `n` vectors: the [`Msix`] and the irqfds
    /// VFIO signals (vector i -> fd i).
    pub msix: &'a mut dyn FnMut(u16) -> Result<(Msix, IrqFds), String>,
}

impl VfioPci {
    /// Resets the function, DMA-maps guest RAM, places and maps its BARs.
    /// On error everything done so far is undone (by drop).
    pub fn open(
        addr: &str,
        layer: Box<dyn VfioLayer>,
        slots: Box<dyn GuestSlots>,
        w: Wiring<'_>,
    ) -> Result<Self, VfioError> {
        let e = plan::unsupported(addr);
        let shadow = ConfigSpace::new(0, 0, 0, 0);
        let mut dev = Self {
            addr: addr.to_string(),
            layer,
            slots,
            shadow,
            bars: Vec::new(),
            msix: None,
            msix_on: false,
            dma: Vec::new(),
            maps: Vec::new(),
        };
        dev.layer.reset();
        for m in plan::dma_plan(w.ram).map_err(plan::unsupported(addr))? {
            dev.layer.dma_map(m.iova, m.size, m.host)?;
            dev.dma.push(m);
        }
        let layout = plan::find_msix(dev.layer.as_ref());
        dev.bars = plan::place_bars(dev.layer.as_ref(), layout.as_ref(), w.bars32, w.bars64)
            .map_err(plan::unsupported(addr))?;
        if dev.bars.is_empty() {
            return Err(e("the function has no memory BAR to pass through".into()));
        }
        for b in dev.bars.clone() {
            let spec = BarSpec {
                addr: b.addr,
                size: b.size,
                is_64: b.is_64,
                prefetchable: b.prefetchable,
            };
            dev.shadow.add_bar(b.index, spec).map_err(|x| VfioError::Unsupported {
                addr: addr.to_string(),
                reason: x.to_string(),
            })?;
            dev.map_direct(&b)?;
        }
        if let Some(l) = layout {
            let (m, fds) = (w.msix)(l.vectors).map_err(plan::unsupported(addr))?;
            dev.msix = Some((l, m, fds));
        }
        Ok(dev)
    }

    fn map_direct(&mut self, b: &PlacedBar) -> Result<(), VfioError> {
        for r in &b.direct {
            let size = r.end - r.start;
            let host = self.layer.mmap(b.index as u32, r.start, size)?;
            match self.slots.map(b.addr + r.start, size, host) {
                Ok(h) => self.maps.push((h, host, size)),
                Err(detail) => {
                    self.layer.munmap(host, size);
                    let addr = self.addr.clone();
                    return Err(VfioError::Vfio { addr, what: "BAR memory slot", detail });
                }
            }
        }
        Ok(())
    }

    /// The BARs as placed.
    pub fn bars(&self) -> &[PlacedBar] {
        &self.bars
    }

    /// The DMA mappings made.
    pub fn dma(&self) -> &[DmaMapping] {
        &self.dma
    }

    fn device_dword(&self, at: u16) -> u32 {
        let mut d = [0u8; 4];
        self.layer.read(CONFIG_REGION, at.into(), &mut d);
        u32::from_le_bytes(d)
    }

    /// The dword at `at` as the guest sees it.
    fn virtual_dword(&self, at: u16) -> u32 {
        match at {
            a if (reg::BAR0..reg::BAR0 + 24).contains(&a) => self.shadow.dword(a),
            0x30 => 0, // no expansion ROM
            a if self.msix.as_ref().is_some_and(|(l, ..)| l.cap == a) => {
                let on = self.msix.as_ref().map_or(0, |(_, m, _)| u32::from(m.control()));
                self.device_dword(a) & !(0xc000 << 16) | on << 16
            }
            a => self.device_dword(a),
        }
    }

    fn msix_control_write(&mut self, offset: u16, data: &[u8]) {
        let Some((l, m, fds)) = self.msix.as_mut() else { return };
        let mut cur = (u32::from(m.control()) << 16).to_le_bytes();
        let at = usize::from(offset - l.cap);
        cur[at..at + data.len()].copy_from_slice(data);
        m.set_control((u32::from_le_bytes(cur) >> 16) as u16);
        let want = m.enabled();
        if want != self.msix_on {
            let r = if want {
                let refs: Vec<&EventFd> = fds.iter().collect();
                self.layer.enable_msix(&refs)
            } else {
                self.layer.disable_msix();
                Ok(())
            };
            match r {
                Ok(()) => self.msix_on = want,
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }

    fn msix_bar(&self, bar: usize, offset: u64) -> Option<(bool, u64)> {
        let (l, ..) = self.msix.as_ref()?;
        if l.table.0 == bar && l.table_range().contains(&offset) {
            return Some((true, offset - l.table.1));
        }
        (l.pba.0 == bar && l.pba_range().contains(&offset)).then(|| (false, offset - l.pba.1))
    }
}

impl PciDevice for VfioPci {
    fn config_read(&mut self, offset: u16, data: &mut [u8]) {
        if !crate::pci::config::access_ok(offset, data.len()) {
            data.fill(0xff);
            return;
        }
        let v = self.virtual_dword(offset & !3).to_le_bytes();
        let at = usize::from(offset % 4);
        data.copy_from_slice(&v[at..at + data.len()]);
    }

    fn config_write(&mut self, offset: u16, data: &[u8]) {
        if !crate::pci::config::access_ok(offset, data.len()) {
            return;
        }
        let at = offset & !3;
        let cap = self.msix.as_ref().map(|(l, ..)| l.cap);
        match at {
            a if (reg::BAR0..reg::BAR0 + 24).contains(&a) => {
                self.shadow.write(offset, data);
            }
            0x30 => {}
            a if Some(a) == cap => {
                if offset % 4 >= 2 || data.len() == 4 {
                    let (o, d) =
                        if data.len() == 4 { (offset + 2, &data[2..]) } else { (offset, data) };
                    self.msix_control_write(o, d);
                }
            }
            a => {
                if a == reg::COMMAND {
                    self.shadow.write(offset, data);
                }
                self.layer.write(CONFIG_REGION, offset.into(), data);
            }
        }
    }

    fn decoded_bars(&self) -> Vec<(usize, u64, u64)> {
        self.shadow.decoded_bars()
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        match self.msix_bar(bar, offset) {
            Some((true, off)) => self.msix.as_ref().map_or((), |(_, m, _)| m.table_read(off, data)),
            // The PBA is the device's own.
            _ => self.layer.read(bar as u32, offset, data),
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        match self.msix_bar(bar, offset) {
            Some((true, off)) => {
                if let Some((_, m, _)) = self.msix.as_mut() {
                    m.table_write(off, data);
                }
            }
            Some((false, _)) => {} // PBA: read-only
            None => self.layer.write(bar as u32, offset, data),
        }
    }
}

impl Drop for VfioPci {
    fn drop(&mut self) {
        if self.msix_on {
            self.layer.disable_msix();
        }
        for (h, host, size) in self.maps.drain(..) {
            self.slots.unmap(h);
            self.layer.munmap(host, size);
        }
        for m in self.dma.drain(..) {
            self.layer.dma_unmap(m.iova, m.size);
        }
        self.layer.reset();
        tracing::info!("VF {} released", self.addr);
    }
}
