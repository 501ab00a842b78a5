//! The transformers reference tests (tests/reference.rs) again on every
//! kernel path this CPU supports: this binary re-runs itself once per path
//! with `KORE_KERNELS=<path>` and only the `reference::` tests (DeltaNet
//! as chosen, then forced into its chunked prefill form). And a
//! threaded pool gives exactly the serial result (rows are split, never
//! partial sums).

#[allow(dead_code)]
#[path = "reference.rs"]
mod reference;

use std::path::Path;
use std::process::Command;

use kore_engine::hf::HfModelDir;
use kore_engine::pool::ThreadPool;
use kore_engine::simd::Path as KernelPath;
use kore_engine::Logits;

#[test]
fn reference_tests_pass_on_every_forced_path() {
    // Each path twice: DeltaNet token by token (the default) and forced into
    // the chunked prefill form from 2 tokens on (`KORE_DELTANET_CHUNKED_MIN`).
    let exe = std::env::current_exe().unwrap();
    for path in KernelPath::ALL.into_iter().filter(|p| p.supported()) {
        for chunked in [None, Some("2")] {
            let mut cmd = Command::new(&exe);
            cmd.args(["reference::", "--test-threads=1"]).env("KORE_KERNELS", path.name());
            match chunked {
                Some(n) => cmd.env("KORE_DELTANET_CHUNKED_MIN", n),
                None => cmd.env_remove("KORE_DELTANET_CHUNKED_MIN"),
            };
            let out = cmd.output().unwrap();
            let log = String::from_utf8_lossy(&out.stdout);
            let what = format!("{} kernels, chunked from {chunked:?} tokens", path.name());
            assert!(out.status.success(), "reference tests on the {what} failed:\n{log}");
            assert!(log.contains("test result: ok. 5 passed"), "{what}: unexpected run:\n{log}");
        }
    }
}

/// Without options a model runs the best path (the re-runs above check that
/// `Model::set_options` sets each one).
#[test]
fn the_default_path_is_the_best() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixed_f32_untied");
    let hf = HfModelDir::open(&dir).unwrap();
    assert_eq!(hf.model().unwrap().kernels(), kore_engine::simd::best());
}

#[test]
fn thread_pool_matches_serial_bit_for_bit() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let pool = ThreadPool::new(3);
    for e in std::fs::read_dir(fixtures).unwrap() {
        let dir = e.unwrap().path();
        if !dir.join("config.json").exists() {
            continue;
        }
        let hf = HfModelDir::open(&dir).unwrap();
        let serial = hf.model().unwrap();
        let mut threaded = hf.model().unwrap();
        threaded.set_pool(&pool);
        let v = serial.config.vocab_size as u32;
        let prompt: Vec<u32> = (0..37u32).map(|i| (i * 7919) % v).collect();
        let (mut s1, mut s2) = (serial.new_state(), threaded.new_state());
        let a = serial.forward(&mut s1, &prompt, Logits::All).unwrap();
        let b = threaded.forward(&mut s2, &prompt, Logits::All).unwrap();
        assert_eq!(a, b, "{}: prefill", dir.display());
        let a = serial.forward(&mut s1, &[1], Logits::Last).unwrap();
        let b = threaded.forward(&mut s2, &[1], Logits::Last).unwrap();
        assert_eq!(a, b, "{}: decode", dir.display());
    }
}
