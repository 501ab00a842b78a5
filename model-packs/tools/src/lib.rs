//! Kore model packs: a directory with `pack.toml`, `weights.safetensors` and
//! `tokenizer.json`, verified and laid out for in-place use by the engine.
//!
//! - [`safetensors`]: strict header parser, aligned streaming writer;
//! - [`nvfp4`]: ModelOpt-exact NVFP4 quantization;
//! - [`config`] / [`manifest`]: the model configuration and `pack.toml`;
//! - [`pack`]: [`Pack::open`] and [`pack::verify`]; [`integrity`]: files against
//!   the sizes and digests pack.toml records (cached for boots);
//! - [`import`], [`synth`], [`inspect`]: the `kore-launch pack` commands.
//!
//! The format is specified in `docs/pack-format.md`.

// `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
#![allow(clippy::manual_is_multiple_of)]

pub mod config;
mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzz;
pub mod head;
pub mod import;
pub mod inspect;
pub mod integrity;
pub mod manifest;
pub mod nvfp4;
mod output;
pub mod pack;
pub mod progress;
pub mod safetensors;
pub mod synth;

pub use config::PackConfig;
pub use error::{PackError, Result};
pub use manifest::Manifest;
pub use pack::{LinearRef, Pack};
pub use progress::{NoProgress, Progress};
