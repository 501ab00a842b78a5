//! pack.toml text (`kore_pack::fuzz::run_manifest`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_pack::fuzz::run_manifest(data));
