//! Kore VMM: runs the Kore guest on KVM with guest RAM in preallocated
//! hugepages, the model pack preloaded, a serial console and virtio-vsock.
