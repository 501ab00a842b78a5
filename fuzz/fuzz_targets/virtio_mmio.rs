//! The virtio-mmio register file under arbitrary guest reads and writes
//! (`kore_vmm::devices::virtio::mmio_fuzz::run`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_vmm::devices::virtio::mmio_fuzz::run(data));
