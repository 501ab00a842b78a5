//! Virtio devices on the virtio-mmio (version 2) transport: [`mmio`] is the
//! transport, [`vsock`] the vsock device with its Unix-socket backend.

pub mod mmio;
pub mod mmio_fuzz;
pub mod vsock;

/// The register table and values shared with the guest ([`kore_boot_abi::virtio`])
/// agree with Linux's UAPI headers (`virtio-bindings`).
#[cfg(test)]
mod tests {
    use kore_boot_abi::virtio::{mmio, vsock};
    use virtio_bindings::{virtio_config as cfg, virtio_ids as ids, virtio_mmio as linux};

    #[test]
    fn shared_wire_matches_linux_headers() {
        let r = |v: u32| u64::from(v);
        let pairs = [
            (mmio::reg::MAGIC, r(linux::VIRTIO_MMIO_MAGIC_VALUE)),
            (mmio::reg::VERSION, r(linux::VIRTIO_MMIO_VERSION)),
            (mmio::reg::DEVICE_ID, r(linux::VIRTIO_MMIO_DEVICE_ID)),
            (mmio::reg::VENDOR_ID, r(linux::VIRTIO_MMIO_VENDOR_ID)),
            (mmio::reg::DEVICE_FEATURES, r(linux::VIRTIO_MMIO_DEVICE_FEATURES)),
            (mmio::reg::DEVICE_FEATURES_SEL, r(linux::VIRTIO_MMIO_DEVICE_FEATURES_SEL)),
            (mmio::reg::DRIVER_FEATURES, r(linux::VIRTIO_MMIO_DRIVER_FEATURES)),
            (mmio::reg::DRIVER_FEATURES_SEL, r(linux::VIRTIO_MMIO_DRIVER_FEATURES_SEL)),
            (mmio::reg::QUEUE_SEL, r(linux::VIRTIO_MMIO_QUEUE_SEL)),
            (mmio::reg::QUEUE_NUM_MAX, r(linux::VIRTIO_MMIO_QUEUE_NUM_MAX)),
            (mmio::reg::QUEUE_NUM, r(linux::VIRTIO_MMIO_QUEUE_NUM)),
            (mmio::reg::QUEUE_READY, r(linux::VIRTIO_MMIO_QUEUE_READY)),
            (mmio::reg::QUEUE_NOTIFY, r(linux::VIRTIO_MMIO_QUEUE_NOTIFY)),
            (mmio::reg::INTERRUPT_STATUS, r(linux::VIRTIO_MMIO_INTERRUPT_STATUS)),
            (mmio::reg::INTERRUPT_ACK, r(linux::VIRTIO_MMIO_INTERRUPT_ACK)),
            (mmio::reg::STATUS, r(linux::VIRTIO_MMIO_STATUS)),
            (mmio::reg::QUEUE_DESC_LOW, r(linux::VIRTIO_MMIO_QUEUE_DESC_LOW)),
            (mmio::reg::QUEUE_DESC_HIGH, r(linux::VIRTIO_MMIO_QUEUE_DESC_HIGH)),
            (mmio::reg::QUEUE_DRIVER_LOW, r(linux::VIRTIO_MMIO_QUEUE_AVAIL_LOW)),
            (mmio::reg::QUEUE_DRIVER_HIGH, r(linux::VIRTIO_MMIO_QUEUE_AVAIL_HIGH)),
            (mmio::reg::QUEUE_DEVICE_LOW, r(linux::VIRTIO_MMIO_QUEUE_USED_LOW)),
            (mmio::reg::QUEUE_DEVICE_HIGH, r(linux::VIRTIO_MMIO_QUEUE_USED_HIGH)),
            (mmio::reg::CONFIG_GENERATION, r(linux::VIRTIO_MMIO_CONFIG_GENERATION)),
            (mmio::reg::CONFIG, r(linux::VIRTIO_MMIO_CONFIG)),
        ];
        for (i, (ours, theirs)) in pairs.iter().enumerate() {
            assert_eq!(ours, theirs, "register {i}");
        }
        assert_eq!(mmio::INT_USED_RING, linux::VIRTIO_MMIO_INT_VRING);
        assert_eq!(mmio::status::ACKNOWLEDGE, cfg::VIRTIO_CONFIG_S_ACKNOWLEDGE);
        assert_eq!(mmio::status::DRIVER, cfg::VIRTIO_CONFIG_S_DRIVER);
        assert_eq!(mmio::status::DRIVER_OK, cfg::VIRTIO_CONFIG_S_DRIVER_OK);
        assert_eq!(mmio::status::FEATURES_OK, cfg::VIRTIO_CONFIG_S_FEATURES_OK);
        assert_eq!(mmio::status::DEVICE_NEEDS_RESET, cfg::VIRTIO_CONFIG_S_NEEDS_RESET);
        assert_eq!(mmio::status::FAILED, cfg::VIRTIO_CONFIG_S_FAILED);
        assert_eq!(mmio::F_VERSION_1, 1 << cfg::VIRTIO_F_VERSION_1);
        assert_eq!(vsock::DEVICE_ID, ids::VIRTIO_ID_VSOCK);
    }
}
