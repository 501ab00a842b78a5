//! The virtio-mmio transport, version 2 (virtio 1.2 §4.2.2).
//!
//! [`MmioTransport`] holds the register file, the negotiated features, the
//! device status and the split virtqueues ([`virtio_queue::Queue`]). vCPU
//! threads drive it through [`BusDevice`] register reads and writes; the
//! device's event loop locks the same object to process the queues and raise
//! used-buffer interrupts through an irqfd.
//!
//! Every value the guest writes is checked before it is used: unknown
//! registers and wrong access widths are ignored, queue sizes must be powers
//! of two no larger than the maximum, queue addresses are validated against
//! guest memory when the driver sets `DRIVER_OK` (an invalid setup sets
//! `DEVICE_NEEDS_RESET` instead of activating), and features outside the
//! offered set make `FEATURES_OK` fail.

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;

pub use kore_boot_abi::virtio::mmio::{reg, status, F_VERSION_1, INT_USED_RING, MAGIC_VALUE};

/// Our vendor id (`"KORE"`).
pub const VENDOR: u32 = 0x4552_4f4b;

/// A virtio-mmio register window with its queues.
pub struct MmioTransport {
    device_id: u32,
    avail_features: u64,
    acked_features: u64,
    device_features_sel: u32,
    driver_features_sel: u32,
    queue_sel: u32,
    status: u32,
    interrupt_status: u32,
    config: Vec<u8>,
    /// The queues, indexed by queue number.
    pub queues: Vec<Queue>,
    mem: GuestMemoryMmap,
    irq: EventFd,
    /// Written when the driver sets `DRIVER_OK` (activation) or resets the
    /// device, so the event loop notices.
    wake: EventFd,
    /// Bumped on every reset: the backend drops its state when it changes.
    generation: u64,
    activated: bool,
}

impl MmioTransport {
    /// A transport for device `device_id` offering `features` with one queue
    /// per entry of `queue_max` (each a power of two), the read-only
    /// configuration space `config`, used-buffer interrupts through `irq`,
    /// and `wake` written on activation and reset.
    pub fn new(
        device_id: u32,
        features: u64,
        queue_max: &[u16],
        config: Vec<u8>,
        mem: GuestMemoryMmap,
        irq: EventFd,
        wake: EventFd,
    ) -> Result<Self, virtio_queue::Error> {
        let queues = queue_max.iter().map(|&m| Queue::new(m)).collect::<Result<_, _>>()?;
        Ok(Self {
            device_id,
            avail_features: features | F_VERSION_1,
            acked_features: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            status: 0,
            interrupt_status: 0,
            config,
            queues,
            mem,
            irq,
            wake,
            generation: 0,
            activated: false,
        })
    }

    /// Guest memory the queues live in.
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// True once the driver set `DRIVER_OK` on a valid setup (until reset).
    pub fn activated(&self) -> bool {
        self.activated
    }

    /// Reset counter: changes whenever the driver resets the device.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Features the driver accepted.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Raises the used-buffer interrupt (sets the status bit, kicks the irqfd).
    pub fn signal_used(&mut self) {
        self.interrupt_status |= INT_USED_RING;
        if let Err(e) = self.irq.write(1) {
            tracing::warn!("virtio-mmio: irqfd write failed: {e}");
        }
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn reset(&mut self) {
        self.acked_features = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.queue_sel = 0;
        self.status = 0;
        self.interrupt_status = 0;
        self.queues.iter_mut().for_each(Queue::reset);
        self.generation += 1;
        if std::mem::take(&mut self.activated) {
            let _ = self.wake.write(1);
        }
    }

    fn read_reg(&self, offset: u64) -> u32 {
        let q = self.queues.get(self.queue_sel as usize);
        match offset {
            reg::MAGIC => MAGIC_VALUE,
            reg::VERSION => 2,
            reg::DEVICE_ID => self.device_id,
            reg::VENDOR_ID => VENDOR,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.avail_features as u32,
                1 => (self.avail_features >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => q.map_or(0, |q| q.max_size() as u32),
            reg::QUEUE_READY => q.map_or(0, |q| q.ready() as u32),
            reg::INTERRUPT_STATUS => self.interrupt_status,
            reg::STATUS => self.status,
            reg::CONFIG_GENERATION => 0,
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            reg::DRIVER_FEATURES => self.write_driver_features(v),
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::INTERRUPT_ACK => self.interrupt_status &= !v,
            reg::STATUS => self.write_status(v),
            reg::QUEUE_NOTIFY => {
                // Normally an ioeventfd catches these; without one, wake the loop.
                let _ = self.wake.write(1);
            }
            reg::QUEUE_NUM
            | reg::QUEUE_READY
            | reg::QUEUE_DESC_LOW
            | reg::QUEUE_DESC_HIGH
            | reg::QUEUE_DRIVER_LOW
            | reg::QUEUE_DRIVER_HIGH
            | reg::QUEUE_DEVICE_LOW
            | reg::QUEUE_DEVICE_HIGH => self.write_queue_reg(offset, v),
            _ => tracing::debug!("virtio-mmio: ignored write {v:#x} to {offset:#x}"),
        }
    }

    fn write_driver_features(&mut self, v: u32) {
        // Only while negotiating (after DRIVER, before FEATURES_OK).
        if self.status & status::DRIVER == 0 || self.status & status::FEATURES_OK != 0 {
            return;
        }
        match self.driver_features_sel {
            0 => self.acked_features = (self.acked_features & !0xffff_ffff) | v as u64,
            1 => self.acked_features = (self.acked_features & 0xffff_ffff) | (v as u64) << 32,
            _ => {}
        }
    }

    fn write_queue_reg(&mut self, offset: u64, v: u32) {
        // Queue layout may change only before DRIVER_OK (virtio 1.2 §4.2.3.2).
        if self.status & status::DRIVER_OK != 0 {
            return;
        }
        let Some(q) = self.selected() else { return };
        match offset {
            reg::QUEUE_NUM => {
                // try_set_size rejects 0, > max and non-powers of two; the queue is
                // then left at its previous size.
                if let Ok(n) = u16::try_from(v) {
                    let _ = q.try_set_size(n);
                }
            }
            reg::QUEUE_READY => q.set_ready(v == 1),
            reg::QUEUE_DESC_LOW => q.set_desc_table_address(Some(v), None),
            reg::QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(v)),
            reg::QUEUE_DRIVER_LOW => q.set_avail_ring_address(Some(v), None),
            reg::QUEUE_DRIVER_HIGH => q.set_avail_ring_address(None, Some(v)),
            reg::QUEUE_DEVICE_LOW => q.set_used_ring_address(Some(v), None),
            reg::QUEUE_DEVICE_HIGH => q.set_used_ring_address(None, Some(v)),
            _ => {}
        }
    }

    fn write_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        let new = v & !self.status;
        if v & self.status != self.status {
            // Clearing bits other than by reset is not allowed.
            tracing::debug!(
                "virtio-mmio: driver cleared status bits ({:#x} -> {v:#x})",
                self.status
            );
            return;
        }
        let mut s = v;
        if new & status::FEATURES_OK != 0 {
            let ok = self.acked_features & !self.avail_features == 0
                && self.acked_features & F_VERSION_1 != 0;
            if !ok {
                tracing::warn!(
                    "virtio-mmio: driver features {:#x} not acceptable (offered {:#x})",
                    self.acked_features,
                    self.avail_features
                );
                s &= !status::FEATURES_OK;
            }
        }
        if new & status::DRIVER_OK != 0 {
            if self.status & status::FEATURES_OK == 0 && s & status::FEATURES_OK == 0 {
                s &= !status::DRIVER_OK;
            } else if !self.queues.iter().all(|q| q.is_valid(&self.mem)) {
                tracing::warn!("virtio-mmio: DRIVER_OK with invalid queues: device needs reset");
                s = (s & !status::DRIVER_OK) | status::DEVICE_NEEDS_RESET;
            } else {
                self.activated = true;
                let _ = self.wake.write(1);
            }
        }
        self.status = s;
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= reg::CONFIG {
            let start = (offset - reg::CONFIG) as usize;
            for (i, b) in data.iter_mut().enumerate() {
                *b = self.config.get(start + i).copied().unwrap_or(0);
            }
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            tracing::debug!("virtio-mmio: ignored {}-byte read at {offset:#x}", data.len());
            return;
        }
        data.copy_from_slice(&self.read_reg(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            return; // The vsock configuration space is read-only.
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            tracing::debug!("virtio-mmio: ignored {}-byte write at {offset:#x}", data.len());
            return;
        };
        if !offset.is_multiple_of(4) {
            return;
        }
        self.write_reg(offset, u32::from_le_bytes(bytes));
    }
}
