//! The vsock device from ring 3: find it in the boot info, drive it, sleep between interrupts.
//!
//! The device's interrupt is routed to CPU 0 (boot ABI), so the I/O loop runs on CPU 0.

use kore_guest_abi::DeviceKind;
pub use kore_vsock::mmio::{DriverError, VolatileMmio, VsockDevice};
pub use kore_vsock::{ConnId, Error, Vsock};

use crate::kcall;

/// The vsock device type the runtime drives.
pub type Device = VsockDevice<VolatileMmio>;

/// Brings up the first virtio-vsock device of the boot info.
pub fn open() -> Result<Device, DriverError> {
    let info = crate::boot_info();
    let d = info
        .devices()
        .iter()
        .find(|d| d.kind == DeviceKind::VirtioVsock as u32)
        .ok_or(DriverError::NotVirtio)?;
    if d.vector == 0 {
        // The VMM left the pin masked: route it to CPU 0 on the wake vector, which the kernel
        // always has a gate for.
        route_gsi(d.gsi, kore_guest_abi::WAKE_VECTOR);
    }
    // SAFETY: the boot info names this window as the device's registers; the device window is
    // mapped uncached for ring 3 (boot ABI).
    let mmio = unsafe { VolatileMmio::new(d.mmio_base as usize) };
    VsockDevice::new(mmio)
}

/// Programs IOAPIC pin `gsi`: edge-triggered, fixed delivery of `vector` to APIC id 0, unmasked.
fn route_gsi(gsi: u32, vector: u8) {
    let base = kore_guest_abi::layout::IOAPIC_BASE;
    let write = |reg: u32, v: u32| {
        // SAFETY: the IOAPIC page is in the device window, mapped for ring 3 (boot ABI);
        // IOREGSEL at +0 selects the register that IOWIN at +0x10 then writes.
        unsafe {
            (base as *mut u32).write_volatile(reg);
            ((base + 0x10) as *mut u32).write_volatile(v);
        }
    };
    write(0x11 + 2 * gsi, 0); // destination APIC id 0
    write(0x10 + 2 * gsi, vector as u32);
}

/// Runs the device until `done` returns true and everything written so far has reached the
/// device ([`Device::tx_idle`]): polls the rings, and when nothing moves halts this vCPU until
/// the next interrupt (an interrupt that came in meanwhile ends the halt at once). Returning
/// with packets still queued would lose them if the guest then exits, and would leave the
/// transmit ring too full for a following close's SHUTDOWN.
pub fn run_until(
    dev: &mut Device,
    mut done: impl FnMut(&mut Device) -> bool,
) -> Result<(), DriverError> {
    // `done` may have side effects (e.g. accept): once it said true, it is not asked again.
    let mut finished = false;
    loop {
        while dev.poll()? {}
        finished = finished || done(dev);
        // `done` may have queued packets (writes, closes, credit updates): hand them to the
        // device before halting, or nothing would send them until an unrelated interrupt.
        if dev.poll()? {
            continue;
        }
        if finished && dev.tx_idle() {
            return Ok(());
        }
        kcall::wait();
        dev.ack_interrupt();
    }
}
