//! An idle appliance sleeps: after it is ready, and again after it served a request (so the
//! engine's vCPU pool ran and went back to halting), its vCPU threads use almost no host CPU.
//! A vCPU that spun instead of halting in the kernel's WAIT would use a whole core.
//!
//! Its own test binary, so no other test's VM runs in this process while it measures.

mod common;

use std::time::{Duration, Instant};

use serde_json::json;

use common::client::{Appliance, Client};

/// Host CPU seconds (user + system) of this process's threads whose name starts with
/// `prefix` (the VMM names its vCPU threads `kore-vcpu<i>`), and of the whole process.
fn cpu_seconds(prefix: &str) -> (f64, f64) {
    let ticks = |stat: &str| -> u64 {
        // Fields after the `(comm)`: state is field 3; utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let mut vcpus = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with(prefix) {
            if let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) {
                vcpus += ticks(&stat);
            }
        }
    }
    let all = ticks(&std::fs::read_to_string("/proc/self/stat").unwrap());
    (vcpus as f64 / USER_HZ, all as f64 / USER_HZ)
}

/// Clock ticks per second of `/proc/*/stat` times (Linux's USER_HZ, 100 on x86-64).
const USER_HZ: f64 = 100.0;

/// CPU used over `window` by the vCPU threads and the whole process, as a share of one core.
fn idle_share(window: Duration) -> (f64, f64) {
    let (v0, a0) = cpu_seconds("kore-vcpu");
    let t0 = Instant::now();
    std::thread::sleep(window);
    let (v1, a1) = cpu_seconds("kore-vcpu");
    let s = t0.elapsed().as_secs_f64();
    ((v1 - v0) / s, (a1 - a0) / s)
}

#[test]
fn an_idle_appliance_halts_instead_of_spinning() {
    const VCPUS: u32 = 2;
    let app = Appliance::boot("idle", VCPUS);
    let mut c = Client::connect(&app.uds, Instant::now() + Duration::from_secs(120));
    // Ready and idle.
    std::thread::sleep(Duration::from_millis(500));
    let (vcpu_ready, proc_ready) = idle_share(Duration::from_secs(3));
    // After a request on every vCPU.
    c.send(&json!({"id": 1, "prompt_ids": [4071, 882, 198], "max_tokens": 16}).to_string());
    let (_, done) = c.until_done(&json!(1));
    assert_eq!(done["done"], json!(true), "{done}");
    std::thread::sleep(Duration::from_millis(500));
    let (vcpu_after, proc_after) = idle_share(Duration::from_secs(3));
    // The measure itself sees busy vCPUs: during a long request (cancelled afterwards).
    c.send(&json!({"id": 2, "prompt_ids": [4071, 882], "max_tokens": 4000}).to_string());
    let first = c.event();
    assert_eq!(first["id"], json!(2), "{first}");
    let (vcpu_busy, _) = idle_share(Duration::from_secs(1));
    c.send(r#"{"cancel": 2}"#);
    let (_, done) = c.until_done(&json!(2));
    assert_eq!(done["finish"], json!("cancelled"), "{done}");
    eprintln!(
        "idle host CPU (share of one core), {VCPUS} vCPUs: after boot vCPU threads {vcpu_ready:.3} \
         (process {proc_ready:.3}); after a request {vcpu_after:.3} (process {proc_after:.3}); \
         busy {vcpu_busy:.3}"
    );
    assert!(vcpu_busy > 0.3, "the measure does not see busy vCPUs: {vcpu_busy:.3}");
    // A spinning vCPU would show ~1.0 per vCPU; halted ones show ~0 (ticks are 10 ms).
    for (what, share) in [("after boot", vcpu_ready), ("after a request", vcpu_after)] {
        assert!(share < 0.1, "{what}: the vCPU threads used {share:.3} of a core while idle");
    }
}
