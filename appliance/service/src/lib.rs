//! Kore chat service: the JSON-lines protocol spoken on vsock port 1025 and
//! the request scheduler, `no_std + alloc` so it runs in the guest appliance.
//!
//! The crate is transport-independent ("sans I/O"): a transport registers
//! connections with [`Service::open`], feeds received bytes with
//! [`Service::on_bytes`], reports [`Service::on_eof`] / [`Service::on_closed`],
//! sends whatever [`Service::output`] holds, and calls [`Service::poll`] while
//! [`Service::has_work`] is true; each poll runs at most one engine step, so
//! I/O and cancellations interleave with generation. The engine, tokenizer
//! and clock come in through the [`Engine`], [`Codec`] and [`Clock`] traits.
//! The wire format is documented in `docs/protocol.md`; its types are
//! crate `kore-protocol`'s.
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
extern crate alloc;

mod active;
pub mod codec;
pub mod connection;
pub mod emit;
pub mod engine;
pub mod fake;
pub mod framing;
#[doc(hidden)]
pub mod fuzz;
#[cfg(feature = "std")]
pub mod host;
pub mod service;

pub use codec::{Codec, CodecError, StreamDecode};
pub use engine::{
    Clock, Engine, EngineError, EngineInfo, GenParams, SeqId, StepOut, TokenLogprobs,
};
/// The wire types this service speaks (crate `kore-protocol`).
pub use kore_protocol as protocol;
pub use kore_protocol::{
    BenchReport, BenchRequest, ErrorCode, Message, MtpBench, Role, PROTOCOL_VERSION,
};
pub use service::{Config, ConnId, Service};
