//! Kore chat protocol (docs/protocol.md): the wire types of every request and
//! event, derived once (`Serialize` + `Deserialize`) and shared by the
//! service that parses requests and writes events, the launcher's client
//! that writes requests and reads events, the HTTP mapping, the fuzz targets
//! and the tests. `no_std + alloc`: the guest appliance builds it too.
//!
//! - [`request`]: [`Request`] lines (generate, cancel, info, bench), read by
//!   [`parse_line`] into validated types or a [`LineError`] with a stable
//!   [`ErrorCode`]; [`Request::to_line`] writes them.
//! - [`event`]: [`Event`] lines (delta, done, error, info, bench), written by
//!   [`write_line`] and read by [`parse_event`].
//! - [`bench`]: the benchmark's request and report.
//! - [`tools`]: tool calls, structured outputs and log-probabilities.
#![no_std]
#![warn(missing_docs)]
extern crate alloc;

pub mod bench;
pub mod error;
pub mod event;
pub mod request;
pub mod tools;

pub use bench::{BenchReport, BenchRequest, MtpBench, BENCH_POSITIVE_FIELDS};
pub use error::{ErrorCode, LineError};
pub use event::{
    parse_event, write_line, BenchEvent, CacheInfo, DeltaEvent, DoneEvent, ErrorBody, ErrorEvent,
    Event, Finish, InfoBody, InfoEvent, Phase, Stats,
};
pub use request::{parse_line, GenerateRequest, Id, Input, Message, Request, Role};
pub use tools::{
    CallDelta, CallOut, Choice, Format, MessageCall, RawJson, ResponseFormat, TokenLogprob,
    TopLogprob,
};

/// Protocol revision documented in `docs/protocol.md`.
pub const PROTOCOL_VERSION: u32 = 1;
