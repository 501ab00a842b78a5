//! I/O ports the VMM emulates.
//!
//! Ring 3 may use [`SERIAL_COM1`]`..+8`, [`DEBUG_EXIT`] and [`MARKER`]
//! directly: the TSS I/O-permission bitmap allows them. [`SMP_RELEASE`] is
//! ring-0 only.
//!
//! ```
//! use kore_boot_abi::ports;
//! assert!(ports::ring3_allowed(ports::DEBUG_EXIT));
//! assert!(ports::ring3_allowed(ports::SERIAL_COM1 + 5));
//! assert!(!ports::ring3_allowed(ports::SMP_RELEASE));
//! ```

/// 16550 UART (COM1) base port; registers at `+0..+8`. Output goes to the
/// host's log and console ring buffer.
pub const SERIAL_COM1: u16 = 0x3f8;
/// Number of COM1 registers.
pub const SERIAL_PORTS: u16 = 8;
/// GSI (IOAPIC pin) of COM1's interrupt.
pub const SERIAL_GSI: u32 = 4;
/// Debug exit: `out dx, eax` ends the VM; the VM's exit status is `eax`
/// (a byte or word write gives that zero-extended value). Status 0 means
/// success by convention.
pub const DEBUG_EXIT: u16 = 0xf4;
/// Timestamp marker: any write makes the VMM record `(value, host time)`
/// (used to measure VMM start to guest entry). Costs one VM exit.
pub const MARKER: u16 = 0xf5;
/// AP release: CPU 0 writes any value here (ring 0) to start CPUs
/// `1..vcpu_count`. Later writes are ignored.
pub const SMP_RELEASE: u16 = 0xf6;

/// Whether ring 3 may access `port` (the TSS bitmap the VMM builds).
pub const fn ring3_allowed(port: u16) -> bool {
    (port >= SERIAL_COM1 && port < SERIAL_COM1 + SERIAL_PORTS)
        || port == DEBUG_EXIT
        || port == MARKER
}
