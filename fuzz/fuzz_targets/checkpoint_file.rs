//! Checkpoint files of the prefix cache's disk tier (`kore_engine::snapshot::fuzz::run`):
//! arbitrary bytes as a file, and valid files damaged in arbitrary ways.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_engine::snapshot::fuzz::run(data));
