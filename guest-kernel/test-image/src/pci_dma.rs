//! `test=pci-dma [copies=N] [seed=S]`: N (default 1,000) DMA copies by kore-dma of random
//! sizes (1 B .. 2 MiB, spread over every power-of-two scale) at random offsets between two heap buffers (guest RAM, hugepage
//! backed by the VMM), each completion waited for as its MSI-X interrupt (`kcall::wait`),
//! every destination byte and the bytes around it verified. Then an overlapping copy
//! (memmove semantics) and a masked vector (PBA bit set, delivered on unmask).

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;

use kore_rt::{clock, kcall, println, smp};

use crate::pcidev::{self, Dev, Rng};

const MAX_LEN: u64 = 2 << 20;
const BUF: usize = 4 << 20;

/// Runs the mode; `Err` says what failed.
pub fn run(copies: u32, seed: u64) -> Result<(), String> {
    let dev = pcidev::open()?;
    println!("kore-test-image: pci-dma seed={seed} copies={copies}");
    let mut rng = Rng(seed | 1);
    let mut src = vec![0u8; BUF];
    let mut dst = vec![0u8; BUF];
    let (mut bytes, mut waits, mut min, mut max) = (0u64, 0u64, u64::MAX, 0u64);
    let t0 = clock::ticks();
    for i in 0..copies {
        let len = copy_len(i, &mut rng);
        let so = rng.below(BUF as u64 - len + 1) as usize;
        let d_off = rng.below(BUF as u64 - len + 1) as usize;
        let n = len as usize;
        rng.fill(&mut src[so..so + n]);
        let guard = rng.next() as u8;
        let (before, after) = (d_off.checked_sub(1), (d_off + n < BUF).then_some(d_off + n));
        for g in before.into_iter().chain(after) {
            dst[g] = guard;
        }
        let c = dev
            .dma
            .copy(src[so..].as_ptr() as u64, dst[d_off..].as_mut_ptr() as u64, len, kcall::wait)
            .map_err(|e| format!("copy {i} ({len} bytes): {e}"))?;
        if src[so..so + n] != dst[d_off..d_off + n] {
            let at = (0..n).find(|&k| src[so + k] != dst[d_off + k]).unwrap_or(0);
            return Err(format!("copy {i} ({len} bytes): destination differs at byte {at}"));
        }
        if before.into_iter().chain(after).any(|g| dst[g] != guard) {
            return Err(format!("copy {i} ({len} bytes): wrote outside the destination"));
        }
        (bytes, waits, min, max) =
            (bytes + len, waits + c.waits as u64, min.min(len), max.max(len));
    }
    let ms = clock::ticks_to_ns(clock::ticks() - t0) / 1_000_000;
    println!(
        "kore-test-image: pci-dma: {copies} copies verified, {bytes} bytes, sizes {min}..={max}, \
         {waits} interrupt wait(s), {ms} ms"
    );
    overlap(&dev, &mut src)?;
    round_trip(&dev, &src, &mut dst)?;
    other_cpu(&dev)?;
    masked_vector(&dev, &src, &mut dst)
}

/// Copies driven from the last vCPU with entry 0 pointing at its APIC id: the interrupt must
/// reach that CPU (its `wait` returns). Entry 0 goes back to this CPU afterwards.
fn other_cpu(dev: &Dev) -> Result<(), String> {
    let n = kore_rt::cpu_count();
    if n < 2 {
        return Ok(());
    }
    let result = kore_rt::sync::SpinLock::new(None);
    smp::parallel(&|i, count| {
        if i != count - 1 {
            return;
        }
        let src: alloc::vec::Vec<u8> = (0..10_000u32).map(|k| (k * 13 + 5) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let apic = kore_rt::apic_id() as u8;
        let mut r = dev.table.program(0, apic, dev.vector, false).map_err(|e| format!("{e:?}"));
        for _ in 0..10 {
            if r.is_err() {
                break;
            }
            let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
            r = dev
                .dma
                .copy(s, d, src.len() as u64, kcall::wait)
                .map(|_| ())
                .map_err(|e| format!("{e}"));
        }
        let ok = r.and_then(|()| if src == dst { Ok(apic) } else { Err("data differs".into()) });
        *result.lock() = Some(ok);
    });
    dev.reprogram();
    let outcome = result.lock().take();
    match outcome {
        Some(Ok(apic)) => {
            println!(
                "kore-test-image: pci-dma: 10 copies completed by MSI-X on CPU {} (APIC id {apic})",
                n - 1
            );
            Ok(())
        }
        Some(Err(e)) => Err(format!("copies from CPU {}: {e}", n - 1)),
        None => Err("the last vCPU did not run".into()),
    }
}

/// Times small copies end to end: doorbell (an MMIO exit), the copy, MSI-X, `wait`.
fn round_trip(dev: &Dev, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    const N: u64 = 200;
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    let t0 = clock::ticks();
    for _ in 0..N {
        dev.dma.copy(s, d, 64, kcall::wait).map_err(|e| format!("64-byte copy: {e}"))?;
    }
    let ns = clock::ticks_to_ns(clock::ticks() - t0) / N;
    println!("kore-test-image: pci-dma: 64-byte copy round trip {} us (doorbell, copy, MSI-X, wait; mean of {N})", ns / 1000);
    Ok(())
}

/// The first copy is 1 byte, the second 2 MiB; the others have a random power-of-two scale
/// (1 B .. 2 MiB) and a random length within it, so small and large copies are both common.
fn copy_len(i: u32, rng: &mut Rng) -> u64 {
    match i {
        0 => 1,
        1 => MAX_LEN,
        _ => {
            let scale = 1u64 << rng.below(MAX_LEN.trailing_zeros() as u64 + 1);
            1 + rng.below(scale)
        }
    }
}

/// One copy whose source and destination overlap: the device must copy as memmove.
fn overlap(dev: &Dev, buf: &mut [u8]) -> Result<(), String> {
    let mut want = buf[..1 << 20].to_vec();
    want.copy_within(0..(512 << 10), 1000);
    let base = buf.as_mut_ptr() as u64;
    dev.dma.copy(base, base + 1000, 512 << 10, kcall::wait).map_err(|e| format!("overlap: {e}"))?;
    if buf[..1 << 20] != want[..] {
        return Err("overlapping copy is not a memmove".into());
    }
    println!("kore-test-image: pci-dma: overlapping copy ok (memmove)");
    Ok(())
}

/// A copy with entry 0 masked: the completion sets the PBA bit and no interrupt; unmasking
/// delivers it (the following wait returns) and clears the bit.
fn masked_vector(dev: &Dev, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let pba = |d: &Dev| kore_pci::msix::pending(d.table.bar(), d.msix.pba_offset, 0);
    dev.table.set_masked(0, true).map_err(|e| format!("{e:?}"))?;
    let target = dev.dma.completed() + 1;
    dev.dma.start(src.as_ptr() as u64, dst.as_mut_ptr() as u64, 4096);
    if !dev.poll_completed(target, 2000) {
        return Err("masked-vector copy did not finish in 2 s".into());
    }
    let pending = pba(dev);
    dev.table.set_masked(0, false).map_err(|e| format!("{e:?}"))?;
    kcall::wait(); // returns only once an interrupt came: the one unmasking released
    let cleared = !pba(dev);
    println!("kore-test-image: pci-dma: masked vector: pending={pending}, delivered on unmask, cleared={cleared}");
    if !pending || !cleared || src[..4096] != dst[..4096] {
        return Err("masked vector: PBA bit not set, not cleared, or data wrong".into());
    }
    Ok(())
}
