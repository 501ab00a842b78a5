//! Constrained decoding for Kore, `no_std + alloc` (it runs in the guest).
//!
//! - [`json`]: an order-keeping JSON value with Python-exact printing (what chat
//!   templates and schemas need).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
extern crate alloc;

pub mod json;
