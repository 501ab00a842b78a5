//! The boot ABI between the Kore VMM and the Kore guest kernel: fixed
//! guest-physical layout and the versioned boot-info block.
#![no_std]
