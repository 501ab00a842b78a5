//! Finding and bringing up kore-dma for the PCI test modes: enumerate bus 0, size the BARs,
//! enable memory + bus master, map BAR0 (registers) and the MSI-X table's BAR through the
//! kernel, and point MSI-X entry 0 at this CPU.

extern crate alloc;

use alloc::format;
use alloc::string::String;

use kore_kdma::KoreDma;
use kore_rt::pci::{self, bar, cap::MsixCap, command, msix::Table, BarRegs, Ecam, Header};
use kore_rt::println;

/// kore-dma, ready to copy with MSI-X entry 0 unmasked.
pub struct Dev {
    pub cfg: Ecam,
    pub hdr: Header,
    pub dma: KoreDma<BarRegs>,
    pub msix: MsixCap,
    pub table: Table<BarRegs>,
    /// The vector entry 0 delivers.
    pub vector: u8,
}

/// A tiny PRNG (xorshift64*), seeded from the command line or the TSC.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        let last = self.next().to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

/// Finds kore-dma and sets it up; lists bus 0 on the console.
pub fn open() -> Result<Dev, String> {
    let cfg = pci::config().ok_or("no PCI host bridge in the boot info")?;
    pci::list("kore-test-image");
    let hdr = kore_pci::find(&cfg, kore_kdma::VENDOR_ID, kore_kdma::DEVICE_ID)
        .ok_or("no kore-dma (1234:4b44) on bus 0")?;
    for b in bar::probe_all(&cfg, &hdr).iter().flatten() {
        println!(
            "kore-test-image: pci bar{} {:?} at {:#x} size {:#x}",
            b.index, b.kind, b.base, b.size
        );
    }
    let f = hdr.function;
    kore_pci::enable(&cfg, f, command::MEMORY | command::BUS_MASTER);
    let regs = pci::map_bar(f, kore_kdma::REGS_BAR).map_err(|e| format!("map BAR0: {e}"))?;
    let dma = KoreDma::new(regs).map_err(|e| format!("{e}"))?;
    let msix = MsixCap::find(&cfg, f).ok_or("kore-dma has no MSI-X capability")?;
    let tbar = pci::map_bar(f, msix.table_bar).map_err(|e| format!("map MSI-X BAR: {e}"))?;
    let table = Table::new(tbar, msix.table_offset, msix.table_size);
    let vector = pci::msix_vector(0).ok_or("no MSI-X vector")?;
    msix.enable_masked(&cfg);
    table
        .program(0, kore_rt::apic_id() as u8, vector, false)
        .map_err(|e| format!("MSI-X entry 0: {e:?}"))?;
    msix.unmask_function(&cfg);
    println!(
        "kore-test-image: pci kore-dma at {:02x}.{}: regs {:#x}, MSI-X {} vector(s) in bar{} -> vector {:#x}",
        f.dev(),
        f.func(),
        dma.regs().base(),
        msix.table_size,
        msix.table_bar,
        vector
    );
    Ok(Dev { cfg, hdr, dma, msix, table, vector })
}

impl Dev {
    /// Reprograms MSI-X entry 0 correctly (after tests that scribbled on it).
    pub fn reprogram(&self) {
        let _ = self.table.program(0, kore_rt::apic_id() as u8, self.vector, false);
    }

    /// Polls COMPLETED until it reaches `target` or `ms` milliseconds pass.
    pub fn poll_completed(&self, target: u64, ms: u64) -> bool {
        let end = kore_rt::clock::now_ns() + ms * 1_000_000;
        while self.dma.completed() < target {
            if kore_rt::clock::now_ns() > end {
                return false;
            }
            core::hint::spin_loop();
        }
        true
    }
}
