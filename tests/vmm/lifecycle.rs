//! VM lifecycle on KVM with tiny hand-assembled kernels (no build step): a triple fault is
//! reported with the registers and the last console lines, and SIGTERM stops a running VM
//! and releases its hugepages (no huge-page mapping is left in this process).
//!
//! Its own test binary: the SIGTERM handler is process-wide.

use std::path::PathBuf;
use std::time::Duration;

use kore_vmm::{HugePageSize, Vm, VmConfig, VmError};

/// Guest-physical (and virtual: identity-mapped) load address of the test kernels.
const BASE: u64 = 8 << 20;

/// Code that prints `msg` on COM1 (`rep outsb` from a RIP-relative string), then runs `tail`.
fn kernel_code(msg: &str, tail: &[u8]) -> Vec<u8> {
    let mut c = vec![0x66, 0xba, 0xf8, 0x03]; // mov dx, 0x3f8
    let lea_at = c.len();
    c.extend_from_slice(&[0x48, 0x8d, 0x35, 0, 0, 0, 0]); // lea rsi, [rip + msg]
    c.push(0xb9); // mov ecx, len
    c.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    c.extend_from_slice(&[0xfc, 0xf3, 0x6e]); // cld; rep outsb
    c.extend_from_slice(tail);
    let rel = (c.len() - (lea_at + 7)) as u32;
    c[lea_at + 3..lea_at + 7].copy_from_slice(&rel.to_le_bytes());
    c.extend_from_slice(msg.as_bytes());
    c
}

/// A static ELF64 with one PT_LOAD segment of `code` at [`BASE`], entry at its start.
fn elf(code: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 0x100];
    b[0..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little-endian
    b[6] = 1; // version
    b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    b[24..32].copy_from_slice(&BASE.to_le_bytes()); // entry
    b[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    b[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    b[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    b[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
    let p = 64;
    b[p..p + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b[p + 4..p + 8].copy_from_slice(&7u32.to_le_bytes()); // RWX
    b[p + 8..p + 16].copy_from_slice(&0x100u64.to_le_bytes()); // offset
    b[p + 16..p + 24].copy_from_slice(&BASE.to_le_bytes()); // vaddr
    b[p + 24..p + 32].copy_from_slice(&BASE.to_le_bytes()); // paddr
    b[p + 32..p + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    b[p + 40..p + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    b.extend_from_slice(code);
    b
}

fn write_kernel(name: &str, code: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("kore-lifecycle-{}-{name}.elf", std::process::id()));
    std::fs::write(&p, elf(code)).unwrap();
    p
}

fn config(kernel: &PathBuf) -> VmConfig {
    VmConfig::new(kernel).vcpus(1).memory_mib(128).hugepages(HugePageSize::Size2M)
}

/// Sums `field` (kB) over this process's /proc/self/smaps entries whose
/// `KernelPageSize` is huge (`huge`) or 4 kB (`!huge`).
fn smaps_kb(field: &str, huge: bool) -> u64 {
    let s = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (mut value, mut total) = (0u64, 0u64);
    for l in s.lines() {
        let mut f = l.split_whitespace();
        match f.next() {
            Some(k) if k.strip_suffix(':') == Some(field) => {
                value = f.next().unwrap().parse().unwrap()
            }
            Some("KernelPageSize:") if (f.next().unwrap().parse::<u64>().unwrap() > 4) == huge => {
                total += value
            }
            _ => {}
        }
    }
    total
}

/// Size in kB of this process's mappings backed by huge pages (reserved, touched or not).
fn hugetlb_mapped_kb() -> u64 {
    smaps_kb("Size", true)
}

/// This process's resident memory outside huge-page mappings, in kB (RSS minus guest RAM).
fn rss_outside_hugetlb_kb() -> u64 {
    smaps_kb("Rss", false)
}

/// The tests share this process's mappings: one VM at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn triple_fault_is_reported_with_registers_and_console() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // push 0; push 0; lidt [rsp] (an empty IDT); ud2: #UD -> #GP -> #DF -> shutdown.
    let tail = [0x6a, 0x00, 0x6a, 0x00, 0x0f, 0x01, 0x1c, 0x24, 0x0f, 0x0b];
    let k = write_kernel("triple", &kernel_code("kore-test: about to triple fault\n", &tail));
    let vm = Vm::start(config(&k), &mut |_| {}).expect("VM starts");
    let r = vm.wait_timeout(Duration::from_secs(60));
    let _ = std::fs::remove_file(&k);
    let Some(Err(VmError::GuestCrashed(report))) = r else {
        panic!("expected a crash report, got {r:?}");
    };
    assert!(report.reason.contains("triple fault"), "{report}");
    assert!(report.registers.contains("rip=0x"), "{report}");
    assert!(report.registers.contains("lapic"), "{report}");
    // The faulting ud2 is the last instruction before the message.
    let rip = format!(
        "rip={:#x}",
        BASE + kernel_code("kore-test: about to triple fault\n", &tail).len() as u64 - 2 - 33
    );
    assert!(report.registers.contains(&rip), "want {rip}: {report}");
    assert_eq!(
        report.console.last().map(String::as_str),
        Some("kore-test: about to triple fault"),
        "{report}"
    );
}

#[test]
fn sigterm_stops_the_vm_and_releases_its_hugepages() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(hugetlb_mapped_kb(), 0, "no hugetlb mappings before the VM");
    // cli; 1: hlt; jmp 1b — halts until the VMM stops it.
    let tail = [0xfa, 0xf4, 0xeb, 0xfd];
    let k = write_kernel("idle", &kernel_code("kore-test: idle\n", &tail));
    let vm = Vm::start(config(&k), &mut |_| {}).expect("VM starts");
    let _ = std::fs::remove_file(&k);
    kore_vmm::signals::stop_on_signals(vm.stopper()).expect("signal handlers");
    let mapped = hugetlb_mapped_kb();
    assert!(mapped >= 128 * 1024, "guest RAM is in hugepages: {mapped} kB mapped");
    assert!(vm.wait_timeout(Duration::from_millis(200)).is_none(), "the guest idles");
    // SAFETY: kill(2) on our own pid with SIGTERM, whose handler stop_on_signals installed.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    let r = vm.wait();
    assert!(matches!(r, Err(VmError::Stopped)), "{r:?}");
    assert_eq!(hugetlb_mapped_kb(), 0, "hugepages released after teardown");
}

/// Figures for docs/vmm.md (run by hand: `cargo test --release -p kore-e2e --features e2e --test
/// vmm_lifecycle -- --ignored --nocapture`; `KORE_PRELOAD_FILE` picks the file to preload, default a 1 GiB
/// temporary file): VMM start to the guest's first instruction (a marker-port write is the
/// kernel's first instruction), the preload rate from the page cache into hugepage guest
/// RAM, and the VMM's memory beyond guest RAM (RSS outside hugetlb mappings, the test
/// harness included, so an upper bound).
#[test]
#[ignore]
fn figures_boot_preload_memory() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // mov al, 1; out 0xf5, al (marker); then the idle loop.
    let mut code = vec![0xb0, 0x01, 0xe6, 0xf5];
    code.extend_from_slice(&kernel_code("kore-test: idle\n", &[0xfa, 0xf4, 0xeb, 0xfd]));
    let k = write_kernel("figures", &code);
    let rss_before = rss_outside_hugetlb_kb();
    let mut entry = Vec::new();
    for _ in 0..5 {
        let vm = Vm::start(config(&k), &mut |_| {}).expect("VM starts");
        while vm.markers().is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
        entry.push((vm.markers()[0].1, vm.setup_time()));
        vm.stop();
    }
    entry.sort();
    eprintln!("VMM start -> first guest instruction (5 boots, 128 MiB, 1 vCPU, sorted): {entry:?}");
    let file = std::env::var_os("KORE_PRELOAD_FILE").map(PathBuf::from).unwrap_or_else(|| {
        let p = std::env::temp_dir().join(format!("kore-preload-{}.bin", std::process::id()));
        let chunk: Vec<u8> = (0..1u32 << 20).map(|i| ((i * 2_654_435_761) >> 24) as u8).collect();
        let mut f = std::fs::File::create(&p).unwrap();
        for _ in 0..1024 {
            std::io::Write::write_all(&mut f, &chunk).unwrap();
        }
        p
    });
    let len = std::fs::metadata(&file).unwrap().len();
    let _ = std::fs::read(&file); // into the page cache
    for round in 0..3 {
        let t = std::time::Instant::now();
        let (mut first, mut last) = (None, t);
        let vm = Vm::start(config(&k).memory_mib(256).preload(&file), &mut |p| {
            let now = std::time::Instant::now();
            first.get_or_insert((now, p.done));
            last = now;
        })
        .expect("VM starts");
        let load = last.duration_since(t).as_secs_f64();
        let (t1, b1) = first.unwrap();
        let copy = (len - b1) as f64 / last.duration_since(t1).as_secs_f64() / 1e9;
        while vm.markers().is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
        let overhead = rss_outside_hugetlb_kb().saturating_sub(rss_before);
        eprintln!(
            "round {round}: {len} bytes preloaded, copy rate {copy:.2} GB/s (first to last \
             progress call), start->preload done {load:.3} s ({:.2} GB/s incl. RAM setup), \
             start->entry {:?}, RSS outside guest RAM +{overhead} kB",
            len as f64 / load / 1e9,
            vm.markers()[0].1
        );
        vm.stop();
    }
    if std::env::var_os("KORE_PRELOAD_FILE").is_none() {
        let _ = std::fs::remove_file(&file);
    }
    let _ = std::fs::remove_file(&k);
}
