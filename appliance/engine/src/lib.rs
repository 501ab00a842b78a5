//! Kore inference engine: the Qwen3.5 text models (Gated DeltaNet + gated
//! full attention, with dense or mixture-of-experts MLPs), `no_std + alloc` at
//! its core so the same code runs in the Kore guest and natively on the host.
//!
//! - [`config`]: `ModelConfig` from a Hugging Face `config.json`, and
//!   [`safetensors`]: the strict reader (both re-exported from kore-pack-format,
//!   the one home of the pack and number formats).
//! - [`tensor`], [`source`]: borrowed tensors and where they come from.
//! - [`weights`]: `Linear` (F32/BF16/F16/NVFP4), borrowed in place.
//! - [`kernels`]: the kernel layer's API (matrix products, attention,
//!   DeltaNet, SiLU/exp) on an explicit path, its one dispatch table and the
//!   portable twins; [`simd`]: the paths, the CPU features, the shared
//!   kernel types and the per-ISA kernels under them; [`pool`]: the worker
//!   pool the products split rows across.
//! - [`model`]: the forward pass (its kernel path, KV precision and other
//!   [`EngineOptions`] are the model's; its `moe` module: the MoE block,
//!   tokens grouped by expert); [`state`]: per-sequence caches;
//!   [`snapshot`]: checkpoints of a state (fixed part, KV spans, file format).
//! - [`bench`]: the pack benchmark (read bandwidth, prefill, decode), clock supplied.
//! - [`sampling`], [`generate`]: token selection and the generation loop;
//!   [`spec`]: speculative decoding with the MTP head.
//! - [`hf`] (feature `std`): memory-mapped Hugging Face model directories.
#![cfg_attr(not(feature = "std"), no_std)]
// `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
#![allow(clippy::manual_is_multiple_of)]
extern crate alloc;

/// Prompt tokens one forward prefills, by default: the appliance's
/// scheduler chunks prompts by it and the bench measures prefill in it.
pub const PREFILL_CHUNK: usize = 512;

pub mod bench;
pub mod exp;
/// The model configuration and its `config.json` reader (from kore-pack-format).
pub use kore_pack_format::config;
pub mod generate;
#[cfg(feature = "std")]
pub mod hf;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod options;
pub mod pool;
pub mod profile;
/// The strict safetensors reader (from kore-pack-format).
pub use kore_pack_format::safetensors;
pub mod sampling;
mod scan;
pub mod simd;
pub mod snapshot;
pub mod source;
pub mod spec;
pub mod state;
pub mod tensor;
pub mod weights;

pub use config::{ConfigError, LayerKind, ModelConfig};
pub use generate::{generate, GenerateOptions, Generation, StopReason};
pub use model::{BatchError, ForwardError, LoadError, Logits, Model, SeqInput};
pub use model::{MtpError, MtpState, RESCORE_ROWS};
pub use options::EngineOptions;
pub use pool::{Parallel, Serial};
pub use sampling::{logprobs, masked_argmax, Sampler, SamplingParams, TokenLogprobs};
pub use spec::{generate_spec, Restore, SpecOptions, SpecStats, Speculator};
pub use state::{Checkpoints, State};
pub use tensor::{DType, TensorSource, TensorView};
pub use weights::{Linear, WeightError, Q8_GROUP};
