//! Kore appliance adapters: the real inference engine (`kore-engine`) and
//! tokenizer (`kore-tokenizer`) behind the traits of the chat service
//! (`kore-service`), `no_std + alloc` so the very same adapters serve the
//! protocol in the Kore guest (vsock port 1025) and in-process on the host
//! (`kore-launch --native`, tests).
//!
//! - [`ModelEngine`]: `kore_service::Engine` over a borrowed [`kore_engine::Model`],
//!   up to [`ModelEngine::with_max_sequences`] requests decoded together (one
//!   batched forward per step, prompts prefilled in chunks between decode
//!   steps), a [`kore_engine::Sampler`] per request, MTP drafting
//!   ([`kore_engine::Speculator`], one sequence at a time) when a request asks
//!   for it, and `{"op":"bench"}` through [`bench`] (kore-engine's benchmark,
//!   the same as `kore-launch bench --native`).
//! - [`TokenizerCodec`]: `kore_service::Codec` over a shared
//!   [`kore_tokenizer::Tokenizer`] (raw prompts, the Qwen3.5 chat template with
//!   thinking on/off, stop ids) with [`OwnedDecoder`], a streaming decoder that
//!   owns a reference-counted handle to the tokenizer instead of borrowing it.
//! - [`cache`]: the automatic prefix cache's memory tier (a radix tree of
//!   checkpoints under a byte budget) and the [`CheckpointStore`] seam; with
//!   feature `std`, `disk`: the disk tier (checkpoint files, writer thread).
//!
//! - Constrained decoding: a request's `GenParams::constraint` (a
//!   `kore_grammar::Grammar`) is matched token by token over the vocabulary of
//!   [`grammar_vocab`] given to [`ModelEngine::with_grammar_vocab`]; sampling
//!   draws only allowed tokens, stop tokens only where the output is complete.
//!
//! [`assemble`] is the one place that builds the service from a model, its
//! tokenizer and [`Settings`] (the guest image and the launcher's in-process
//! placement both call [`service`]), with the transport's clock (TSC in the
//! guest, `StdClock` on the host).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
extern crate alloc;

pub mod assemble;
pub mod bench;
pub mod cache;
pub mod codec;
mod constrain;
#[cfg(feature = "std")]
pub mod disk;
pub mod engine;
mod seq;

pub use assemble::{service, stop_ids, Settings, Store};
pub use cache::{CacheStats, Checkpoint, CheckpointStore, StoreStats, Tier};
pub use codec::{OwnedDecoder, TokenizerCodec};
pub use constrain::grammar_vocab;
pub use engine::ModelEngine;
