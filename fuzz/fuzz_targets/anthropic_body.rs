//! An Anthropic Messages body (`POST /v1/messages`) through its parse and its mapping onto a
//! protocol request (`kore_launch::fuzz::anthropic_body`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_launch::fuzz::anthropic_body(data));
