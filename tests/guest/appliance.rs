//! Boots Kore + kore-appliance with the tiny model pack preloaded and checks it against the
//! host: the pack reader agrees with kore-pack's, and the guest's greedy ids equal
//! kore-engine's on the host for the same pack and prompt.

use std::path::PathBuf;
use std::time::Duration;

use kore_e2e::boot::{appliance_images, boot, config, Outcome};

mod common;
use common::{host_greedy, pack_files, tiny_pack, READY_MARKER};

const TIMEOUT: Duration = Duration::from_secs(300);
/// The appliance's default self-test prompt (`SELFTEST_TEXT` in appliance/src/main.rs).
const SELFTEST_TEXT: &str = "ROMEO.\nBut soft, what light";

fn show(o: &Outcome) -> String {
    format!("status {}\nconsole:\n{}", o.status, o.console.join("\n"))
}

fn boot_appliance(files: &[PathBuf], vcpus: u32, cmdline: &str) -> Outcome {
    let img = appliance_images().unwrap();
    let mut cfg = config(&img, vcpus, cmdline);
    for f in files {
        cfg = cfg.preload(f);
    }
    boot(cfg, TIMEOUT).unwrap()
}

/// `[1, 2, 3]` after `key=` on the console line containing `tag`.
fn ids_after(o: &Outcome, tag: &str, key: &str) -> Vec<u32> {
    let line = o
        .console
        .iter()
        .find(|l| l.contains(tag))
        .unwrap_or_else(|| panic!("no {tag:?}\n{}", show(o)));
    let rest =
        &line[line.find(key).unwrap_or_else(|| panic!("no {key} in {line:?}")) + key.len()..];
    let list = &rest[1..rest.find(']').unwrap()];
    list.split(", ").filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect()
}

#[test]
fn guest_pack_reader_matches_kore_pack() {
    let dir = tiny_pack();
    let pack = kore_pack::Pack::open(dir).unwrap();
    let text = std::fs::read_to_string(dir.join("pack.toml")).unwrap();
    let guest = kore_guest_pack::Manifest::parse(&text).unwrap();
    assert_eq!(guest.config, pack.engine_config());
    assert_eq!(guest.name, pack.manifest().name);
    assert_eq!(guest.tokenizer_file, pack.manifest().tokenizer.file);
}

#[test]
fn selftest_greedy_ids_equal_the_host_engine() {
    const N: usize = 24;
    let dir = tiny_pack();
    let o = boot_appliance(&pack_files(dir), 2, &format!("selftest={N}"));
    assert_eq!(o.status, 0, "{}", show(&o));
    assert!(o.said("kore-appliance: ready selftest"), "{}", show(&o));
    assert!(o.markers.iter().any(|(v, _)| *v == READY_MARKER), "no ready marker: {:?}", o.markers);
    let tok = kore_tokenizer::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let prompt = ids_after(&o, "selftest prompt_ids=", "prompt_ids=");
    assert_eq!(prompt, tok.encode(SELFTEST_TEXT), "guest tokenizer differs from the host's");
    let guest = ids_after(&o, "selftest prompt_ids=", " ids=");
    assert_eq!(guest.len(), N, "{}", show(&o));
    for l in o.console.iter().filter(|l| l.contains("selftest prefill") || l.contains("loaded in"))
    {
        eprintln!("{l}");
    }
    assert_eq!(guest, host_greedy(dir, &prompt, N), "{}", show(&o));
}

#[test]
fn selftest_with_given_prompt_ids_matches_the_host_on_one_vcpu() {
    let dir = tiny_pack();
    let prompt = [4071u32, 882, 198, 11, 4072];
    let ids = prompt.map(|i| i.to_string()).join(",");
    let o = boot_appliance(&pack_files(dir), 1, &format!("selftest=8 prompt_ids={ids}"));
    assert_eq!(o.status, 0, "{}", show(&o));
    assert_eq!(ids_after(&o, "selftest prompt_ids=", "prompt_ids="), prompt);
    assert_eq!(ids_after(&o, "selftest prompt_ids=", " ids="), host_greedy(dir, &prompt, 8));
}

#[test]
fn missing_pack_file_is_named_and_exits_3() {
    let dir = tiny_pack();
    let files: Vec<PathBuf> =
        pack_files(dir).into_iter().filter(|p| !p.ends_with("tokenizer.json")).collect();
    let o = boot_appliance(&files, 1, "selftest=1");
    assert_eq!(o.status, 3, "{}", show(&o));
    assert!(o.said("pack file `tokenizer.json` was not preloaded"), "{}", show(&o));
}

#[test]
fn bad_command_line_exits_2() {
    let o = boot_appliance(&pack_files(tiny_pack()), 1, "selftest=x");
    assert_eq!(o.status, 2, "{}", show(&o));
    assert!(o.said("bad command line: `selftest=x`"), "{}", show(&o));
}

#[test]
fn service_mode_without_a_vsock_device_says_so_and_exits_5() {
    let o = boot_appliance(&pack_files(tiny_pack()), 1, "");
    assert_eq!(o.status, 5, "{}", show(&o));
    assert!(o.said("kore-appliance: no usable vsock device"), "{}", show(&o));
}

#[test]
fn bench_mode_reports_every_contract_field() {
    let o = boot_appliance(&pack_files(tiny_pack()), 2, "bench=32 bench_prompt=64 bench_mib=64");
    assert_eq!(o.status, 0, "{}", show(&o));
    let line = o
        .console
        .iter()
        .rev()
        .find(|l| l.starts_with("kore-appliance: bench {"))
        .expect("no report");
    eprintln!("{line}");
    let v: serde_json::Value =
        serde_json::from_str(line.trim_start_matches("kore-appliance: bench ")).unwrap();
    for k in kore_service::protocol::BENCH_POSITIVE_FIELDS {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {line}");
    }
    assert_eq!(v["threads"], 2, "{line}");
    // The guest sees the host's vector features (the VMM passes them through
    // CPUID and XCR0), so it picks the same kernel path as the host would.
    assert_eq!(v["kernels"], kore_engine::simd::best().name(), "{line}");
}
