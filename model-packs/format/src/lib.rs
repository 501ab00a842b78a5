//! kore-pack-format: the one home of Kore's pack and number formats, `no_std + alloc`
//! so the engine, the pack tools (host) and the appliance (guest) share it.
//!
//! - [`dtype`]: the element types safetensors headers name;
//! - [`view`]: a borrowed tensor ([`TensorView`]) and float reads;
//! - [`fp`]: FP4 E2M1 and FP8 E4M3 tables and conversions (NVFP4);
//! - [`safetensors`]: the strict header parser and a zero-copy view of a buffer;
//! - [`config`]: the engine's [`ModelConfig`] and the one `config.json` reader;
//! - [`manifest`]: `pack.toml` ([`Manifest`]) and its one mapping to [`ModelConfig`].
//!
//! The pack format is specified in `docs/pack-format.md`.
#![no_std]
// `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
#![allow(clippy::manual_is_multiple_of)]
extern crate alloc;

pub mod config;
pub mod dtype;
pub mod fp;
pub mod manifest;
pub mod safetensors;
pub mod view;

pub use config::{ConfigError, JsonConfig, LayerKind, ModelConfig, MoeConfig};
pub use dtype::DType;
pub use manifest::{Manifest, ManifestError, PackConfig};
pub use safetensors::{HeaderError, Safetensors};
pub use view::TensorView;
