//! The interrupt descriptor table (at the VMM-reserved `layout::IDT` page).
//!
//! Gates filled: the 32 exception vectors (NMI, #DF and #MC on IST1), `int3` (vector 3) as
//! the ring-3 kernel-call gate (DPL 3), each device's interrupt vector and the wake IPI
//! (EOI + return), the MSI-X vectors when there is a PCI host bridge (the same stub), and
//! the APIC spurious vector (return only). Vectors left empty raise #NP,
//! which is reported like any exception. Only CPU 0 fills the table; every CPU loads it.

use kore_guest_abi::{
    layout, BootInfo, MSIX_VECTORS, MSIX_VECTOR_BASE, SPURIOUS_VECTOR, WAKE_VECTOR,
};

use crate::trap;

fn gate(handler: u64, dpl: u8, ist: u8) -> [u64; 2] {
    kore_guest_abi::interrupt_gate(handler, kore_guest_abi::entry::KERNEL_CS, dpl, ist)
}

fn set(vector: u8, g: [u64; 2]) {
    let p = (layout::IDT + vector as u64 * 16) as *mut [u64; 2];
    // SAFETY: the IDT page belongs to the kernel (boot ABI); each gate is 16 bytes.
    unsafe { p.write_volatile(g) };
}

/// Fills the gates (CPU 0, before the other CPUs start).
pub fn install(info: &BootInfo, pci: bool) {
    let stubs = trap::exception_stubs();
    for (v, &stub) in stubs.iter().enumerate() {
        let ist = if matches!(v, 2 | 8 | 18) { 1 } else { 0 };
        set(v as u8, gate(stub, 0, ist));
    }
    set(3, gate(trap::kcall_entry(), 3, 0));
    let irq = gate(trap::irq_entry(), 0, 0);
    for d in info.devices() {
        if (32..=255).contains(&d.vector) && d.vector != SPURIOUS_VECTOR as u32 {
            set(d.vector as u8, irq);
        }
    }
    if pci {
        for v in MSIX_VECTOR_BASE..MSIX_VECTOR_BASE + MSIX_VECTORS {
            set(v, irq);
        }
    }
    set(WAKE_VECTOR, irq);
    set(SPURIOUS_VECTOR, gate(trap::spurious_entry(), 0, 0));
}

/// Loads the IDT register on this CPU.
pub fn load() {
    #[repr(C, packed)]
    struct Idtr {
        limit: u16,
        base: u64,
    }
    let idtr = Idtr { limit: 4095, base: layout::IDT };
    // SAFETY: the table at `layout::IDT` holds valid or not-present gates.
    unsafe {
        core::arch::asm!("lidt [{}]", in(reg) &idtr, options(readonly, nostack, preserves_flags))
    };
}
