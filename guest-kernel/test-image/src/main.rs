//! kore-test-image: the image the boot test runs on our VMM.
//!
//! It checks, in ring 3 on every vCPU: the heap, the TSC clock, an AVX-512 loop (results
//! compared with scalar code), a parallel job over all vCPUs (including workers woken from
//! HLT by IPI), and (command line `echo=PORT [conns=N] [vsock_mode=...]`) serves N vsock connections at once
//! (see [`serve`]). The command line picks
//! extra modes: `fault=pf` touches kernel memory (the test expects the exception report),
//! `fault=panic` panics, `fault=hang` spins forever, `fault=hang-answer` serves the
//! appliance's port until the first request, then spins mid-answer ([`hang`]), `fault=pci-window` reads the PCI BAR window outside any BAR,
//! `test=pci-dma` runs DMA copies on the VMM's kore-dma PCI device
//! ([`pci_dma`]), `test=pci-evil` abuses it ([`pci_evil`]). Exit status 0 means every check passed; the console says what failed.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use kore_rt::{clock, println, smp};

mod hang;
mod pci_dma;
mod pci_evil;
mod pcidev;
mod serve;

kore_rt::main!(main);

fn main() -> u32 {
    let info = kore_rt::boot_info();
    let cmdline = core::str::from_utf8(info.cmdline()).unwrap_or("");
    println!(
        "kore-test-image: ring 3 up, cpus={} tsc_khz={} cmdline={:?}",
        kore_rt::cpu_count(),
        clock::tsc_khz(),
        cmdline
    );
    for arg in cmdline.split_ascii_whitespace() {
        match arg {
            "fault=pf" => {
                // SAFETY: deliberately reads supervisor-only memory (the kernel image) to test
                // the kernel's exception report; this faults and never returns.
                let v =
                    unsafe { (kore_rt::abi::layout::KERNEL_BASE as *const u64).read_volatile() };
                println!("kore-test-image: read kernel memory without a fault: {v:#x}");
                return 1;
            }
            "fault=panic" => panic!("requested by the command line"),
            "fault=hang" => {
                println!("kore-test-image: hanging as the command line asks");
                loop {
                    core::hint::spin_loop();
                }
            }
            "fault=hang-answer" => hang::run(),
            "fault=pci-window" => {
                let a = kore_rt::abi::layout::PCI_MMIO32_BASE + (128 << 20);
                // SAFETY: deliberately reads the PCI BAR window outside any mapped BAR: with a
                // PCI host bridge the kernel took the window from ring 3, so this faults.
                let v = unsafe { (a as *const u32).read_volatile() };
                println!("kore-test-image: read the PCI BAR window without a fault: {v:#x}");
                return 1;
            }
            _ => {}
        }
    }
    let mut failures = 0;
    let arg = |key: &str| {
        cmdline.split_ascii_whitespace().find_map(|a| a.strip_prefix(key)?.parse::<u32>().ok())
    };
    let echo_port = arg("echo=");
    let echo_conns = arg("conns=").unwrap_or(1).max(1) as usize;
    let mode = cmdline.split_ascii_whitespace().find_map(|a| a.strip_prefix("vsock_mode="));
    let mode = match mode.map(serve::Mode::parse) {
        None => serve::Mode::Echo,
        Some(Some(m)) => m,
        Some(None) => {
            println!("kore-test-image: bad vsock_mode (echo, sink or source:BYTES)");
            return 2;
        }
    };
    failures += check("heap", heap_check());
    failures += check("clock", clock_check());
    // The widest vector ISA the guest sees must be the host's (the host-side test knows which).
    failures += if avx512_available() {
        check("avx512", avx512_check())
    } else {
        check("avx2", avx2_check())
    };
    failures += check("parallel", parallel_check());
    failures += check("kernel calls", kcall_check());
    if let Some(port) = echo_port {
        failures += check("vsock echo", serve::run(port, echo_conns, mode));
    }
    let test = cmdline.split_ascii_whitespace().find_map(|a| a.strip_prefix("test="));
    match test {
        None => {}
        Some("pci-dma") => {
            let copies = arg("copies=").unwrap_or(1000);
            let seed = cmdline
                .split_ascii_whitespace()
                .find_map(|a| a.strip_prefix("seed=")?.parse::<u64>().ok())
                .unwrap_or_else(clock::ticks);
            failures += check("pci-dma", pci_dma::run(copies, seed));
        }
        Some("pci-evil") => failures += check("pci-evil", pci_evil::run()),
        Some(other) => {
            println!("kore-test-image: unknown test={other} (pci-dma, pci-evil)");
            return 2;
        }
    }
    println!("kore-test-image: {} failure(s)", failures);
    failures
}

fn check<E: core::fmt::Display>(name: &str, r: Result<(), E>) -> u32 {
    match r {
        Ok(()) => {
            println!("kore-test-image: {name} ok");
            0
        }
        Err(e) => {
            println!("kore-test-image: {name} FAILED: {e}");
            1
        }
    }
}

fn heap_check() -> Result<(), &'static str> {
    let mut v: Vec<u64> = Vec::new();
    for i in 0..100_000u64 {
        v.push(i * 3);
    }
    let big = alloc::vec![7u8; 64 << 20];
    let sum: u64 = v.iter().sum();
    if sum != 3 * (99_999 * 100_000 / 2)
        || big.iter().map(|&b| b as u64).sum::<u64>() != 7 * (64 << 20)
    {
        return Err("wrong contents");
    }
    let s = kore_rt::HEAP.stats();
    println!("kore-test-image: heap total={} MiB in_use={} KiB", s.total >> 20, s.in_use >> 10);
    Ok(())
}

fn clock_check() -> Result<(), &'static str> {
    let t0 = clock::now_ns();
    clock::spin_ns(1_000_000);
    let dt = clock::now_ns() - t0;
    if !(1_000_000..50_000_000).contains(&dt) {
        return Err("1 ms spin did not take about 1 ms");
    }
    Ok(())
}

/// CPUID leaf 7's EBX, leaf 1's ECX and XCR0 (0 without OSXSAVE).
fn cpu_bits() -> (u32, u32, u64) {
    // cpuid is always available on x86-64 (it traps to the VMM here, ~5 µs).
    let l7 = core::arch::x86_64::__cpuid_count(7, 0);
    let l1 = core::arch::x86_64::__cpuid(1);
    // SAFETY: xgetbv(0) is valid when OSXSAVE is set.
    let xcr0 = if l1.ecx & (1 << 27) != 0 { unsafe { core::arch::x86_64::_xgetbv(0) } } else { 0 };
    (l7.ebx, l1.ecx, xcr0)
}

fn avx512_available() -> bool {
    let (ebx7, _, xcr0) = cpu_bits();
    ebx7 & (1 << 16) != 0 && xcr0 & 0xe6 == 0xe6
}

/// AVX2 and FMA by CPUID, with the YMM state enabled in XCR0 (a host without AVX-512).
fn avx2_available() -> bool {
    let (ebx7, ecx1, xcr0) = cpu_bits();
    ebx7 & (1 << 5) != 0 && ecx1 & (1 << 12) != 0 && xcr0 & 0x6 == 0x6
}

#[target_feature(enable = "avx512f")]
fn avx512_sum(data: &[f32]) -> f32 {
    use core::arch::x86_64::*;
    let mut acc = _mm512_setzero_ps();
    let chunks = data.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    for c in chunks {
        // SAFETY: `c` has exactly 16 floats.
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    _mm512_reduce_add_ps(acc) + tail
}

#[target_feature(enable = "avx2,fma")]
fn avx2_sum(data: &[f32]) -> f32 {
    use core::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let chunks = data.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    for c in chunks {
        // SAFETY: `c` has exactly 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes.iter().sum::<f32>() + tail
}

/// Sums of squares by `sum` (100 passes, timed) against the scalar f64 sum.
fn sum_check(name: &str, sum: &dyn Fn(&[f32]) -> f32) -> Result<(), &'static str> {
    let data: Vec<f32> = (0..100_003).map(|i| ((i % 97) as f32) * 0.25).collect();
    let t0 = clock::ticks();
    let mut got = 0.0;
    for _ in 0..100 {
        got = sum(core::hint::black_box(&data));
    }
    let ns = clock::ticks_to_ns(clock::ticks() - t0);
    let want: f64 = data.iter().map(|&x| x as f64 * x as f64).sum();
    println!("kore-test-image: {name} sum={got} want={want} ({} us for 100 passes)", ns / 1000);
    if ((got as f64 - want) / want).abs() > 1e-4 {
        return Err("the vector sum differs from the scalar one");
    }
    Ok(())
}

fn avx512_check() -> Result<(), &'static str> {
    if !avx512_available() {
        return Err("CPUID/XCR0 do not report AVX-512F (the VMM must pass the host's bits)");
    }
    // SAFETY: AVX-512F is available (checked above).
    sum_check("avx512", &|d| unsafe { avx512_sum(d) })
}

fn avx2_check() -> Result<(), &'static str> {
    if !avx2_available() {
        return Err(
            "CPUID/XCR0 report neither AVX-512F nor AVX2 (the VMM must pass the host's bits)",
        );
    }
    // SAFETY: AVX2 and FMA are available (checked above).
    sum_check("avx2", &|d| unsafe { avx2_sum(d) })
}

fn parallel_check() -> Result<(), &'static str> {
    static HITS: AtomicU64 = AtomicU64::new(0);
    let n = kore_rt::cpu_count();
    for round in 0..3u64 {
        if round == 2 {
            // Let the workers fall asleep in HLT, so this round needs the wake IPIs.
            clock::spin_ns(2 * smp::spin_ns() + 1_000_000);
        }
        HITS.store(0, Ordering::SeqCst);
        let t0 = clock::ticks();
        smp::parallel(&|i, count| {
            // Each CPU also runs AVX-512 code on its own data.
            let v: Vec<f32> = (0..4096).map(|k| (k + i) as f32).collect();
            let s = if avx512_available() {
                // SAFETY: checked just above.
                unsafe { avx512_sum(&v) }
            } else {
                v.iter().map(|x| x * x).sum()
            };
            if s > 0.0 && count == n && kore_rt::cpu_id() == i && kore_rt::apic_id() == i {
                HITS.fetch_or(1 << i, Ordering::SeqCst);
            }
        });
        let us = clock::ticks_to_ns(clock::ticks() - t0) / 1000;
        println!("kore-test-image: parallel round {round}: {us} us");
        if HITS.load(Ordering::SeqCst) != (1u64 << n) - 1 {
            return Err("not every vCPU ran the job on its own CPU");
        }
    }
    Ok(())
}

fn kcall_check() -> Result<(), &'static str> {
    use kore_rt::kcall;
    const N: u64 = 200;
    let t0 = clock::ticks();
    for _ in 0..N {
        if kcall::null_call() != kore_rt::abi::call::BAD_CALL {
            return Err("unknown kernel call did not return BAD_CALL");
        }
    }
    let per = clock::ticks_to_ns(clock::ticks() - t0) / N;
    println!("kore-test-image: int3 kernel-call round trip {} ns", per);
    // A wake IPI to ourselves stays pending (ring 3 runs with IF = 0), so wait() returns at
    // once: this times int3 + sti/hlt + the interrupt (EOI) + iretq.
    let t0 = clock::ticks();
    for _ in 0..N {
        smp::wake(kore_rt::cpu_id());
        kcall::wait();
    }
    let per = clock::ticks_to_ns(clock::ticks() - t0) / N;
    println!("kore-test-image: self-IPI + wait round trip {} ns", per);
    if !kcall::log(b"kore-test-image: log through the kernel ok\n") {
        return Err("log call refused user memory");
    }
    if kcall::log(unsafe_kernel_slice()) {
        return Err("log call accepted kernel memory");
    }
    Ok(())
}

fn unsafe_kernel_slice() -> &'static [u8] {
    // SAFETY: never dereferenced in ring 3; only passed to the kernel, which must refuse it.
    unsafe { core::slice::from_raw_parts(kore_rt::abi::layout::KERNEL_BASE as *const u8, 16) }
}
