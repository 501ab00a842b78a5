//! A safetensors header with its length prefix (`kore_pack::fuzz::run_header`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_pack::fuzz::run_header(data));
