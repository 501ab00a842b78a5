//! Kore inference engine: the Qwen3.5 dense text model (Gated DeltaNet + gated
//! full attention), `no_std + alloc` at its core so the same code runs in the
//! Kore guest and natively on the host.
#![cfg_attr(not(feature = "std"), no_std)]
extern crate alloc;
