//! The guest appliance's pack loader: the preloaded pack.toml and weights file made of the
//! input (split at the first `0xff 0xfe`), parsed in place and turned into the engine's
//! model as Kore does at boot.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let at = data.windows(2).position(|w| w == [0xff, 0xfe]).unwrap_or(data.len());
    let (manifest, weights) = (&data[..at], data.get(at + 2..).unwrap_or(&[]));
    let tokenizer: &[u8] = b"{}";
    let files = [
        (&b"pack.toml"[..], manifest),
        (&b"weights.safetensors"[..], weights),
        (&b"tokenizer.json"[..], tokenizer),
    ];
    if let Ok(pack) = kore_guest_pack::Pack::from_files(files) {
        let _ = pack.model();
    }
});
