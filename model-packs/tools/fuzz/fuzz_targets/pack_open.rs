//! Fuzzes pack loading: the input is a safetensors header, a `pack.toml`, or a whole pack
//! directory (first byte selects), read by the parsers, `Pack::open` and `verify`. The body
//! is `kore_pack::fuzz::run`, which `model-packs/tools/tests/pack_fuzz.rs` also runs on every
//! `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kore_pack::fuzz::run(data);
});
