//! kore-guest-pack: the model pack as the Kore appliance finds it in guest memory.
//!
//! The VMM preloads the pack's files (`pack.toml`, `weights.safetensors`, the tokenizer file
//! that `pack.toml` names) into read-only guest RAM and lists them by base name in the boot
//! info. [`Pack::from_files`] picks them out, reads `pack.toml` with kore-pack-format (the
//! host's reader: same types, checks and mapping to kore-engine's `ModelConfig`), and parses
//! the safetensors header in place with its strict parser: tensors stay where the VMM put
//! them, nothing is copied.
#![no_std]
extern crate alloc;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use kore_engine::{LoadError, Model, ModelConfig};
pub use kore_pack_format::manifest::{ManifestError, MANIFEST_FILE, WEIGHTS_FILE};
use kore_pack_format::safetensors::{HeaderError, Safetensors};

/// Why the preloaded pack cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum PackError {
    /// A pack file was not preloaded.
    MissingFile(String),
    /// `pack.toml` is not UTF-8.
    NotUtf8,
    /// `pack.toml` is not TOML, lacks a field or has a wrong value.
    Manifest(ManifestError),
    /// The weights file's header is malformed.
    Weights(HeaderError),
    /// The engine rejected config or weights.
    Load(LoadError),
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackError::MissingFile(n) => write!(
                f,
                "pack file `{n}` was not preloaded: boot with every file of the pack directory preloaded"
            ),
            PackError::NotUtf8 => write!(f, "pack.toml: not UTF-8"),
            PackError::Manifest(e) => write!(f, "pack.toml: {e}"),
            PackError::Weights(e) => write!(f, "weights.safetensors: {e}"),
            PackError::Load(e) => write!(f, "the engine cannot load this pack: {e}"),
        }
    }
}

/// What the appliance needs from `pack.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Model name.
    pub name: String,
    /// Context length (the engine's `max_position_embeddings`).
    pub context_length: usize,
    /// The tokenizer file name.
    pub tokenizer_file: String,
    /// The tokenizer's `eos_token` text, if pack.toml names one.
    pub eos_token: Option<String>,
    /// The engine's model configuration.
    pub config: ModelConfig,
}

/// The preloaded pack: its manifest and borrowed file contents.
#[derive(Debug)]
pub struct Pack<'a> {
    /// The parsed manifest.
    pub manifest: Manifest,
    /// The safetensors weights, parsed in place.
    pub weights: Safetensors<'a>,
    /// Raw weights file (for size and address reporting).
    pub weights_bytes: &'a [u8],
    /// The tokenizer JSON.
    pub tokenizer_json: &'a [u8],
}

impl<'a> Pack<'a> {
    /// Finds the pack among preloaded `(name, bytes)` files and parses its manifest and the
    /// weights header.
    pub fn from_files(
        files: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<Self, PackError> {
        let files: Vec<(&[u8], &[u8])> = files.into_iter().collect();
        let get = |name: &str| {
            files
                .iter()
                .find(|(n, _)| *n == name.as_bytes())
                .map(|(_, b)| *b)
                .ok_or_else(|| PackError::MissingFile(name.to_string()))
        };
        let text = core::str::from_utf8(get(MANIFEST_FILE)?).map_err(|_| PackError::NotUtf8)?;
        let manifest = Manifest::parse(text)?;
        let weights_bytes = get(WEIGHTS_FILE)?;
        let weights = Safetensors::parse(weights_bytes).map_err(PackError::Weights)?;
        let tokenizer_json = get(&manifest.tokenizer_file)?;
        Ok(Pack { manifest, weights, weights_bytes, tokenizer_json })
    }

    /// Builds the engine's model over the weights in place.
    pub fn model(&self) -> Result<Model<'_>, PackError> {
        Model::load(self.manifest.config.clone(), &self.weights).map_err(PackError::Load)
    }
}

impl Manifest {
    /// Reads `pack.toml` text with the host's reader (kore-pack-format): the same
    /// types, checks and mapping to the engine's configuration.
    pub fn parse(text: &str) -> Result<Self, PackError> {
        let m = kore_pack_format::Manifest::parse(text).map_err(PackError::Manifest)?;
        let config = m.model_config();
        config.validate().map_err(|e| PackError::Load(LoadError::Config(e)))?;
        Ok(Manifest {
            name: m.name,
            context_length: config.max_position_embeddings,
            tokenizer_file: m.tokenizer.file,
            eos_token: m.tokenizer.eos_token,
            config,
        })
    }
}

#[cfg(test)]
mod tests;
