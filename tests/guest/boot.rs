//! Boots Kore + kore-test-image on the Kore VMM: ring 3 on every vCPU, AVX-512 (AVX2 on a host
//! without it), heap, clock, kernel calls, exception reports and panics, each checked by exit
//! status and console.

use std::time::Duration;

use kore_e2e::boot::{boot, config, images};

const TIMEOUT: Duration = Duration::from_secs(120);

fn show(o: &kore_e2e::boot::Outcome) -> String {
    format!("status {}\nconsole:\n{}", o.status, o.console.join("\n"))
}

#[test]
fn demo_passes_every_check_on_two_vcpus() {
    let img = images().unwrap();
    let o = boot(config(&img, 2, ""), TIMEOUT).unwrap();
    assert_eq!(o.status, 0, "{}", show(&o));
    // The guest uses the widest vector ISA the host has: the VMM passes the host's bits.
    let simd = if std::is_x86_feature_detected!("avx512f") { "avx512 ok" } else { "avx2 ok" };
    for line in [
        "ring 3 up, cpus=2",
        "heap ok",
        "clock ok",
        simd,
        "parallel ok",
        "kernel calls ok",
        "0 failure(s)",
    ] {
        assert!(o.said(line), "missing {line:?}\n{}", show(&o));
    }
}

#[test]
fn ring3_page_fault_on_kernel_memory_is_reported_with_cr2() {
    let img = images().unwrap();
    let o = boot(config(&img, 1, "fault=pf"), TIMEOUT).unwrap();
    assert_eq!(o.status, 64 + 14, "{}", show(&o));
    assert!(o.said("CPU exception vector=14 in ring 3"), "{}", show(&o));
    // Error code 5 = present | user; CR2 = KERNEL_BASE (supervisor-only page).
    assert!(o.said("err=0000000000000005 cr2=0000000000800000"), "{}", show(&o));
}

#[test]
fn ring3_panic_prints_the_message_and_exits_101() {
    let img = images().unwrap();
    let o = boot(config(&img, 1, "fault=panic"), TIMEOUT).unwrap();
    assert_eq!(o.status, 101, "{}", show(&o));
    assert!(o.said("requested by the command line"), "{}", show(&o));
}
