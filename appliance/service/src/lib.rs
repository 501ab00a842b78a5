//! Kore chat service: the JSON-lines protocol spoken on vsock port 1025 and
//! the request scheduler, `no_std + alloc` so it runs in the guest appliance.
#![cfg_attr(not(feature = "std"), no_std)]
extern crate alloc;
