//! kore-guest-pack: the model pack as the Kore appliance finds it in guest memory.
//!
//! The VMM preloads the pack's files (`pack.toml`, `weights.safetensors`, the tokenizer file
//! that `pack.toml` names) into read-only guest RAM and lists them by base name in the boot
//! info. [`Pack::from_files`] picks them out, reads `pack.toml` with a small TOML-subset
//! reader ([`toml`]) into kore-engine's `ModelConfig` (the same mapping as kore-pack's
//! `Pack::engine_config`), and parses the safetensors header in place: tensors stay where the
//! VMM put them, nothing is copied.
#![no_std]
extern crate alloc;

pub mod toml;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use kore_engine::safetensors::{Safetensors, SafetensorsError};
use kore_engine::{LayerKind, LoadError, Model, ModelConfig};

pub use toml::{TomlError, Value};

/// Manifest file name.
pub const MANIFEST_FILE: &str = "pack.toml";
/// Weights file name.
pub const WEIGHTS_FILE: &str = "weights.safetensors";
/// The newest pack format this reader understands.
pub const FORMAT_VERSION: i64 = 1;
/// The one architecture packs carry.
pub const ARCHITECTURE: &str = "qwen3_5_text";

/// Why the preloaded pack cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum PackError {
    /// A pack file was not preloaded.
    MissingFile(String),
    /// `pack.toml` is not UTF-8 or not readable TOML.
    Toml(TomlError),
    /// `pack.toml` lacks a field or has a wrong value.
    Manifest(String),
    /// The weights file's header is malformed.
    Weights(SafetensorsError),
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
            PackError::Toml(e) => write!(f, "pack.toml: {e}"),
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
        let text = core::str::from_utf8(get(MANIFEST_FILE)?)
            .map_err(|_| PackError::Manifest("not UTF-8".into()))?;
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
    /// Reads the fields the appliance needs from `pack.toml` text.
    pub fn parse(text: &str) -> Result<Self, PackError> {
        let t = toml::parse(text).map_err(PackError::Toml)?;
        let f = Fields(&t);
        let version = f.int("format_version")?;
        if version > FORMAT_VERSION || version < 1 {
            return Err(PackError::Manifest(format!(
                "format_version {version} is not supported (this appliance reads {FORMAT_VERSION}): rebuild the pack with this release's kore-launch"
            )));
        }
        let arch = f.str("architecture")?;
        if arch != ARCHITECTURE {
            return Err(PackError::Manifest(format!(
                "architecture `{arch}` is not supported (expected `{ARCHITECTURE}`)"
            )));
        }
        if !f.bool("config.attn_output_gate")? {
            return Err(PackError::Manifest(
                "config.attn_output_gate = false is not supported (Qwen3.5 attention is gated)"
                    .into(),
            ));
        }
        let context_length = f.usize("context_length")?;
        let config = engine_config(&f, context_length)?;
        config.validate().map_err(|e| PackError::Load(LoadError::Config(e)))?;
        Ok(Manifest {
            name: f.str("name")?.to_string(),
            context_length,
            tokenizer_file: f.str("tokenizer.file")?.to_string(),
            config,
        })
    }
}

/// kore-pack's `Pack::engine_config`, from the flat TOML map.
fn engine_config(f: &Fields<'_>, context_length: usize) -> Result<ModelConfig, PackError> {
    let layer_types = f
        .array("config.layer_types")?
        .iter()
        .map(|v| match v {
            Value::Str(s) if s == "linear_attention" => Ok(LayerKind::Linear),
            Value::Str(s) if s == "full_attention" => Ok(LayerKind::Full),
            other => Err(PackError::Manifest(format!(
                "config.layer_types: unknown layer type {other:?}"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if layer_types.len() != f.usize("config.num_hidden_layers")? {
        return Err(PackError::Manifest(
            "config.layer_types disagrees with num_hidden_layers".into(),
        ));
    }
    let head_dim = f.usize("config.head_dim")?;
    let eos_token_ids = match f.0.get("config.eos_token_ids") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::Int(i) if (0..=u32::MAX as i64).contains(i) => Ok(*i as u32),
                _ => Err(PackError::Manifest("config.eos_token_ids must be token ids".into())),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(PackError::Manifest("config.eos_token_ids must be an array".into())),
    };
    Ok(ModelConfig {
        vocab_size: f.usize("config.vocab_size")?,
        hidden_size: f.usize("config.hidden_size")?,
        intermediate_size: f.usize("config.intermediate_size")?,
        layer_types,
        num_attention_heads: f.usize("config.num_attention_heads")?,
        num_key_value_heads: f.usize("config.num_key_value_heads")?,
        head_dim,
        rotary_dim: (head_dim as f64 * f.float("config.partial_rotary_factor")?) as usize,
        rope_theta: f.float("config.rope_theta")?,
        linear_conv_kernel_dim: f.usize("config.linear_conv_kernel_dim")?,
        linear_num_key_heads: f.usize("config.linear_num_key_heads")?,
        linear_num_value_heads: f.usize("config.linear_num_value_heads")?,
        linear_key_head_dim: f.usize("config.linear_key_head_dim")?,
        linear_value_head_dim: f.usize("config.linear_value_head_dim")?,
        rms_norm_eps: f.float("config.rms_norm_eps")? as f32,
        tie_word_embeddings: f.bool("config.tie_word_embeddings")?,
        max_position_embeddings: context_length,
        eos_token_ids,
        mtp_num_hidden_layers: f.usize("config.mtp_num_hidden_layers")?,
    })
}

/// Typed access to the flat TOML map.
struct Fields<'t>(&'t BTreeMap<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Result<&Value, PackError> {
        self.0.get(key).ok_or_else(|| PackError::Manifest(format!("`{key}` is missing")))
    }

    fn wrong(key: &str, what: &str) -> PackError {
        PackError::Manifest(format!("`{key}` must be {what}"))
    }

    fn int(&self, key: &str) -> Result<i64, PackError> {
        match self.get(key)? {
            Value::Int(i) => Ok(*i),
            _ => Err(Self::wrong(key, "an integer")),
        }
    }

    fn usize(&self, key: &str) -> Result<usize, PackError> {
        usize::try_from(self.int(key)?).map_err(|_| Self::wrong(key, "a non-negative integer"))
    }

    fn float(&self, key: &str) -> Result<f64, PackError> {
        match self.get(key)? {
            Value::Float(x) => Ok(*x),
            Value::Int(i) => Ok(*i as f64),
            _ => Err(Self::wrong(key, "a number")),
        }
    }

    fn bool(&self, key: &str) -> Result<bool, PackError> {
        match self.get(key)? {
            Value::Bool(b) => Ok(*b),
            _ => Err(Self::wrong(key, "true or false")),
        }
    }

    fn str(&self, key: &str) -> Result<&str, PackError> {
        match self.get(key)? {
            Value::Str(s) => Ok(s),
            _ => Err(Self::wrong(key, "a string")),
        }
    }

    fn array(&self, key: &str) -> Result<&[Value], PackError> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            _ => Err(Self::wrong(key, "an array")),
        }
    }
}

#[cfg(test)]
mod tests;
