//! Guest vs native, measured in one run: kore-engine's benchmark (`kore_engine::bench`, what
//! `kore-launch bench --native` runs) in-process on the host with a pool of N threads,
//! alternated with the same benchmark in the Kore appliance with N vCPUs through
//! `{"op":"bench"}` over vsock: one VM boot and one native model load, then rounds of one
//! guest and one native run back to back (order swapped every round), the ratio taken per
//! round and its median reported, so load changes on the machine between rounds cancel out.
//! Also boot-to-ready (VMM start to the appliance's ready marker, pack preloaded) and the
//! VMM's preload rate.
//!
//! A benchmark, not a test (it checks only its own preconditions): run it with
//! `cargo bench -p kore-e2e --features e2e --bench guest_vs_native` (it boots the guest images
//! of `target/guest`, as the guest suites do).
//! Environment: `KORE_BENCH_PACK` (default the tiny pack), `KORE_BENCH_THREADS` (default: the
//! host's cores), `KORE_BENCH_ROUNDS` (7), `KORE_BENCH_PROMPT` (128), `KORE_BENCH_DECODE` (128).
//! Prints one JSON line per measurement and a summary line `guest/native ...`.

#[path = "../guest/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kore_e2e::boot::{appliance_images, config};
use kore_engine::bench::{self, BenchOptions};
use kore_engine::pool::ThreadPool;
use kore_vmm::{RunningVm, Vm};
use serde_json::{json, Value};

use common::client::Client;
use common::{pack_files, tiny_pack, READY_MARKER};

/// Bytes of the read-bandwidth buffer on both sides (as `kore-launch bench --native`).
const BANDWIDTH_BYTES: usize = 1 << 30;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One native measurement on a loaded model: read bandwidth, prefill, decode.
fn native(model: &kore_engine::Model<'_>, buf: &mut [u64], opts: &BenchOptions) -> Value {
    let start = Instant::now();
    let clock = move || start.elapsed().as_nanos() as u64;
    let gbps = bench::read_bandwidth(model.pool(), buf, &clock, opts.bandwidth_passes);
    let r = bench::run(model, gbps, &clock, opts, &mut |_| {}).unwrap();
    json!({"side": "native", "measured_read_gbps": r.measured_read_gbps,
           "prefill_tok_per_s": r.prefill_tok_per_s, "decode_tok_per_s": r.decode_tok_per_s,
           "step_ms": r.step_ms, "bandwidth_fraction": r.bandwidth_fraction,
           "threads": r.threads, "kernels": r.kernels})
}

/// The weights file copied into 2 MiB pages as `kore-launch --native` does
/// (`SafetensorsFile::open_resident`: the hugetlb pool when it has room), leaked for the
/// test's lifetime.
fn hugepage_copy(path: &Path) -> &'static [u8] {
    let file = kore_pack::safetensors::SafetensorsFile::open_resident(path, &kore_pack::NoProgress)
        .unwrap();
    eprintln!("native weights: {}", file.residency());
    Box::leak(Box::new(file)).bytes()
}

/// Guest RAM besides the preloaded pack (the VMM maps the pack in its own region): the
/// bandwidth buffer and 512 MiB for the image, heap and state. Returns (RAM MiB, pack MiB).
fn guest_memory_mib(pack_dir: &Path) -> (u64, u64) {
    let pack: u64 = pack_files(pack_dir).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    let ram = ((BANDWIDTH_BYTES >> 20) as u64 + 512).next_multiple_of(2);
    (ram, (pack >> 20) + 16)
}

/// Makes sure `mib` of 2 MiB hugepages are free and unreserved (root: raises the pool via
/// sysfs, with a margin for other VMs on the machine).
fn reserve_hugepages(mib: u64) {
    let dir = Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB");
    let read =
        |f: &str| -> u64 { std::fs::read_to_string(dir.join(f)).unwrap().trim().parse().unwrap() };
    let need = mib / 2 + 64;
    let avail = || read("free_hugepages").saturating_sub(read("resv_hugepages"));
    if avail() < need {
        let _ = std::fs::write(
            dir.join("nr_hugepages"),
            (read("nr_hugepages") + need - avail()).to_string(),
        );
    }
    assert!(avail() >= need, "need {need} free 2 MiB hugepages");
}

/// The booted appliance and what its boot measured.
struct Guest {
    vm: Option<RunningVm>,
    client: Client,
    dir: PathBuf,
    vcpus: u32,
    boot: Value,
}

impl Guest {
    fn boot(pack_dir: &Path, vcpus: u32) -> Guest {
        let img = appliance_images().unwrap();
        let dir = std::env::temp_dir().join(format!("kore-gvn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uds = dir.join("vsock.sock");
        let (mib, pack_mib) = guest_memory_mib(pack_dir);
        reserve_hugepages(mib + pack_mib);
        let mut cfg = config(&img, vcpus, "").memory_mib(mib).vsock_uds(&uds);
        for f in pack_files(pack_dir) {
            cfg = cfg.preload(f);
        }
        // Preload rate from the VMM's progress callbacks: bytes after the first chunk over
        // the time from the first callback to the last.
        let mut seen: Vec<(Instant, u64, u64)> = Vec::new();
        let vm = Vm::start(cfg, &mut |p| seen.push((Instant::now(), p.done, p.total))).unwrap();
        let (first, last) = (seen.first().unwrap(), seen.last().unwrap());
        assert_eq!(last.1, last.2, "preload finished");
        let secs = last.0.duration_since(first.0).as_secs_f64().max(1e-9);
        let preload_gbps = (last.1 - first.1) as f64 / secs / 1e9;
        let client = Client::connect(&uds, Instant::now() + Duration::from_secs(300));
        let ready = vm.markers().into_iter().find(|(v, _)| *v == READY_MARKER).map(|(_, t)| t);
        let boot = json!({"boot_to_ready_ms": ready.map(|d| d.as_secs_f64() * 1e3),
                          "preload_bytes": last.2, "preload_gbps": preload_gbps,
                          "memory_mib": mib, "vcpus": vcpus});
        Guest { vm: Some(vm), client, dir, vcpus, boot }
    }

    /// One guest measurement through `{"op":"bench"}`.
    fn bench(&mut self, opts: &BenchOptions) -> Value {
        let req = json!({"op": "bench", "id": 1, "prompt_tokens": opts.prompt_tokens,
                         "decode_tokens": opts.decode_tokens, "threads": self.vcpus});
        self.client.send(&req.to_string());
        let ev = self.client.event();
        let console = || self.vm.as_ref().unwrap().console_lines().join("\n");
        let b =
            ev.get("bench").unwrap_or_else(|| panic!("guest bench failed: {ev}\n{}", console()));
        json!({"side": "guest", "measured_read_gbps": b["measured_read_gbps"],
               "prefill_tok_per_s": b["prefill_tok_per_s"], "decode_tok_per_s": b["decode_tok_per_s"],
               "step_ms": b["step_ms"], "bandwidth_fraction": b["bandwidth_fraction"],
               "threads": b["threads"]})
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(vm) = self.vm.take() {
            vm.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The host's 1-minute load average (other work on the machine skews both sides).
fn load() -> f64 {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

fn main() {
    let pack_dir: PathBuf = std::env::var_os("KORE_BENCH_PACK")
        .map_or_else(|| tiny_pack().to_path_buf(), PathBuf::from);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = env_usize("KORE_BENCH_THREADS", cores);
    let rounds = env_usize("KORE_BENCH_ROUNDS", 7);
    let opts = BenchOptions {
        prompt_tokens: env_usize("KORE_BENCH_PROMPT", 128),
        decode_tokens: env_usize("KORE_BENCH_DECODE", 128),
        ..BenchOptions::default()
    };
    eprintln!("pack {}, {threads} threads/vCPUs, {rounds} rounds, {opts:?}", pack_dir.display());
    let mut guest = Guest::boot(&pack_dir, threads as u32);
    println!("{}", guest.boot);
    let pool = ThreadPool::new(threads);
    let pack = kore_pack::Pack::open(&pack_dir).unwrap();
    let mut model = pack.model().unwrap();
    model.set_pool(&pool);
    // Optionally the same pack over hugepage-backed weights (kore-guest-pack, as the guest).
    let hugepages = std::env::var_os("KORE_BENCH_NATIVE_HUGEPAGES").is_some();
    let files: Vec<(PathBuf, &'static [u8])> = pack_files(&pack_dir)
        .into_iter()
        .filter(|_| hugepages)
        .map(|f| {
            let bytes: &'static [u8] = if f.ends_with("weights.safetensors") {
                hugepage_copy(&f)
            } else {
                Vec::leak(std::fs::read(&f).unwrap())
            };
            (f, bytes)
        })
        .collect();
    let names: Vec<String> =
        files.iter().map(|(f, _)| f.file_name().unwrap().to_str().unwrap().into()).collect();
    let hp_pack = (!files.is_empty()).then(|| {
        kore_guest_pack::Pack::from_files(
            names.iter().zip(&files).map(|(n, (_, b))| (n.as_bytes(), *b)),
        )
        .unwrap()
    });
    let mut hp_model = hp_pack.as_ref().map(|p| p.model().unwrap());
    if let Some(m) = hp_model.as_mut() {
        m.set_pool(&pool);
    }
    let mut buf = vec![0u64; BANDWIDTH_BYTES / 8];
    let (mut decode, mut prefill, mut hp_decode, mut loads) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Swap the order every round, so drift within a round favours neither side.
        let (g, n) = if round % 2 == 0 {
            let g = guest.bench(&opts);
            (g, native(&model, &mut buf, &opts))
        } else {
            let n = native(&model, &mut buf, &opts);
            (guest.bench(&opts), n)
        };
        println!("{g}");
        println!("{n}");
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
        decode.push(f(&g, "decode_tok_per_s") / f(&n, "decode_tok_per_s"));
        prefill.push(f(&g, "prefill_tok_per_s") / f(&n, "prefill_tok_per_s"));
        if let Some(m) = hp_model.as_ref() {
            let mut h = native(m, &mut buf, &opts);
            h["side"] = json!("native-hugepages");
            println!("{h}");
            hp_decode.push(f(&g, "decode_tok_per_s") / f(&h, "decode_tok_per_s"));
        }
        loads.push(load());
    }
    if !hp_decode.is_empty() {
        println!(
            "guest/native-hugepages decode ratio per round {hp_decode:.3?} median {:.3}",
            median(hp_decode.clone())
        );
    }
    println!(
        "guest/native decode ratio per round {decode:.3?} median {:.3}; prefill ratio median \
         {:.3}; load average per round {loads:.1?}; boot {}",
        median(decode.clone()),
        median(prefill.clone()),
        guest.boot
    );
}
