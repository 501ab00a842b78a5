//! The vsock device's queue and packet path over guest memory made of the input
//! (`kore_vmm::devices::virtio::vsock::fuzz::run`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_vmm::devices::virtio::vsock::fuzz::run(data));
