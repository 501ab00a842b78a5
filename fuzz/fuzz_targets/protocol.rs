//! The JSON-lines protocol: three clients sending arbitrary bytes to the service over the
//! fake engine (`kore_service::fuzz::run`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_service::fuzz::run(data));
