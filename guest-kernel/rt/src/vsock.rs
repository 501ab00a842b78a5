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
    // SAFETY: the boot info names this window as the device's registers; the device window is
    // mapped uncached for ring 3 (boot ABI).
    let mmio = unsafe { VolatileMmio::new(d.mmio_base as usize) };
    VsockDevice::new(mmio)
}

/// Runs the device until `done` returns true: polls the rings, and when nothing moves halts
/// this vCPU until the next interrupt (an interrupt that came in meanwhile ends the halt at once).
pub fn run_until(
    dev: &mut Device,
    mut done: impl FnMut(&mut Device) -> bool,
) -> Result<(), DriverError> {
    loop {
        while dev.poll()? {}
        if done(dev) {
            return Ok(());
        }
        kcall::wait();
        dev.ack_interrupt();
    }
}
