//! Fuzzes the vsock device's queue and packet path: the input becomes guest memory
//! (descriptor tables, ring indices, headers, payloads) and the device processes its
//! transmit and receive queues over it. The body is `kore_vmm`'s
//! `devices::virtio::vsock::fuzz::run`, which a plain test (`fuzz_body_survives_random_cases`)
//! also runs on every `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kore_vmm::devices::virtio::vsock::fuzz::run(data);
});
