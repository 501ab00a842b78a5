//! `pack.toml`: the pack's manifest (format version, model, config,
//! tokenizer, per-module quantization and file checksums), read by the host
//! tools and the guest alike with [`Manifest::parse`].

mod config;
#[cfg(test)]
mod tests;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use serde::{Deserialize, Serialize};

pub use config::{
    ExpectedTensor, LayerType, LinearGroup, PackConfig, PackMoe, TensorKind, ARCHITECTURE,
    ARCHITECTURE_MOE,
};

/// What is wrong with a manifest (the caller adds the file name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not TOML at all.
    #[error("not valid TOML: {0}")]
    Toml(String),
    /// Written by a newer Kore.
    #[error("pack format version {found} is newer than this reader supports ({supported}); upgrade kore-launch")]
    NewerFormat {
        /// The version found.
        found: u32,
        /// The newest version understood.
        supported: u32,
    },
    /// A field is missing, mistyped or inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// The newest pack format this crate reads and the one it writes.
pub const FORMAT_VERSION: u32 = 1;
/// Manifest file name.
pub const MANIFEST_FILE: &str = "pack.toml";
/// Weights file name.
pub const WEIGHTS_FILE: &str = "weights.safetensors";
/// Tokenizer file name.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Alignment of every tensor's data within weights.safetensors.
pub const ALIGNMENT: u64 = 64;

/// The parsed manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Pack format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Model name.
    pub name: String,
    /// Architecture (`qwen3_5_text`, or `qwen3_5_moe_text` with `[config.moe]`).
    pub architecture: String,
    /// Context length the engine should allow.
    pub context_length: u64,
    /// Whether the MTP head (`mtp.*`) is present.
    pub mtp: bool,
    /// Byte alignment of tensor data in weights.safetensors.
    pub alignment: u64,
    /// Where the weights came from (free text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Model configuration.
    pub config: PackConfig,
    /// Tokenizer and chat template.
    pub tokenizer: TokenizerEntry,
    /// Quantization of Linear modules.
    pub quantization: Quantization,
    /// sha256 and size of every file of the pack except pack.toml.
    pub files: BTreeMap<String, FileEntry>,
}

/// Tokenizer section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerEntry {
    /// Tokenizer file (Hugging Face `tokenizer.json`), relative to the pack.
    pub file: String,
    /// Jinja chat template, if the model has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// BOS token text, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token: Option<String>,
    /// EOS token text, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
}

/// A Linear module's storage scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    /// ModelOpt NVFP4: `weight` U8, `weight_scale` F8_E4M3, `weight_scale_2` F32.
    Nvfp4,
    /// int8 `weight` I8 with F16 `weight_scale` per 32 columns (output heads).
    Q8,
}

/// Quantization section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quantization {
    /// Elements per block scale (16 for NVFP4).
    pub group_size: u64,
    /// Who produced the quantized weights (`kore` or `modelopt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Quantized modules (name without `.weight`) and their scheme; every
    /// other tensor is stored as its safetensors dtype says.
    #[serde(default)]
    pub modules: BTreeMap<String, Scheme>,
}

/// A file's checksum entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Lowercase hex sha256 of the file.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

impl Manifest {
    /// Parses and validates pack.toml text. Checks the format version first, so a
    /// newer pack fails with [`ManifestError::NewerFormat`] even if the rest is
    /// unreadable.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ManifestError::Toml(e.to_string()))?;
        let version = table
            .get("format_version")
            .and_then(toml::Value::as_integer)
            .ok_or_else(|| ManifestError::Invalid("`format_version` is missing".into()))?;
        if version > i64::from(FORMAT_VERSION) {
            let found = u32::try_from(version).unwrap_or(u32::MAX);
            return Err(ManifestError::NewerFormat { found, supported: FORMAT_VERSION });
        }
        if version < 1 {
            return Err(ManifestError::Invalid(format!("format_version {version} is invalid")));
        }
        let m: Manifest =
            toml::from_str(text).map_err(|e| ManifestError::Invalid(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// The engine's model configuration (context length from pack.toml).
    pub fn model_config(&self) -> crate::config::ModelConfig {
        self.config.to_model(self.context_length)
    }

    /// Checks the manifest's own consistency.
    pub fn validate(&self) -> Result<(), ManifestError> {
        let bad = |r: String| Err(ManifestError::Invalid(r));
        if self.architecture != self.config.architecture() {
            let known = [ARCHITECTURE, ARCHITECTURE_MOE].contains(&self.architecture.as_str());
            return bad(if known {
                format!(
                    "architecture `{}` disagrees with [config] (expected `{}`: `[config.moe]` is {})",
                    self.architecture,
                    self.config.architecture(),
                    if self.config.moe.is_some() { "present" } else { "absent" }
                )
            } else {
                format!(
                    "architecture `{}` is not supported (expected `{ARCHITECTURE}` or `{ARCHITECTURE_MOE}`)",
                    self.architecture
                )
            });
        }
        self.config.validate()?;
        if self.mtp != (self.config.mtp_num_hidden_layers > 0) {
            return bad("`mtp` disagrees with config.mtp_num_hidden_layers".into());
        }
        if self.alignment == 0 || !self.alignment.is_power_of_two() {
            return bad(format!("alignment {} is not a power of two", self.alignment));
        }
        if self.context_length == 0 {
            return bad("context_length must be positive".into());
        }
        if !self.quantization.modules.is_empty() && self.quantization.group_size != 16 {
            return bad(format!(
                "NVFP4 needs group_size 16, found {}",
                self.quantization.group_size
            ));
        }
        for name in [WEIGHTS_FILE, self.tokenizer.file.as_str()] {
            if !self.files.contains_key(name) {
                return bad(format!("[files] has no entry for `{name}`"));
            }
        }
        for (name, entry) in &self.files {
            let plain = !name.is_empty()
                && !name.contains('/')
                && !name.contains('\\')
                && name != ".."
                && name != ".";
            if !plain {
                return bad(format!(
                    "file name `{name}` must be a plain file name inside the pack"
                ));
            }
            let hex_ok =
                entry.sha256.len() == 64 && entry.sha256.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex_ok {
                return bad(format!("sha256 of `{name}` is not 64 hex digits"));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "write")]
impl Manifest {
    /// Serializes to TOML.
    pub fn to_toml(&self) -> Result<String, ManifestError> {
        toml::to_string(self)
            .map_err(|e| ManifestError::Invalid(format!("cannot serialize pack.toml: {e}")))
    }
}
