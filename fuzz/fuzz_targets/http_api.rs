//! The HTTP API of `kore-launch serve`: one arbitrary HTTP request through the whole router to
//! a service over the fake engine (`kore_launch::fuzz::http_api`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_launch::fuzz::http_api(data));
