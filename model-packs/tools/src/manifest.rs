//! `pack.toml` on disk: the types and their rules live in kore-pack-format
//! (shared with the guest); this adds file names to errors, reading and writing.

use crate::error::{PackError, Result};
use std::path::Path;

pub use kore_pack_format::manifest::{
    FileEntry, Manifest, ManifestError, Quantization, Scheme, TokenizerEntry, ALIGNMENT,
    FORMAT_VERSION, MANIFEST_FILE, TOKENIZER_FILE, WEIGHTS_FILE,
};

/// Parses and validates pack.toml text; `file` labels errors.
pub fn parse(file: &Path, text: &str) -> Result<Manifest> {
    Manifest::parse(text).map_err(|e| PackError::from_manifest(file, e))
}

/// Reads and parses `dir/pack.toml`.
pub fn load(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| PackError::io(&path, e))?;
    parse(&path, &text)
}

/// Serializes a manifest to TOML.
pub fn to_toml(m: &Manifest) -> Result<String> {
    m.to_toml().map_err(|e| PackError::Invalid(e.to_string()))
}
