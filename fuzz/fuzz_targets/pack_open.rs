//! A whole pack directory made of the input, opened and verified (`kore_pack::fuzz::run_dir`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_pack::fuzz::run_dir(data));
