//! Resolving `--model PATH` into a loaded model and its tokenizer: a Hugging
//! Face model directory (`config.json` + safetensors, memory-mapped) through
//! kore-engine's loader, or a model pack directory (`pack.toml`) through
//! kore-pack (see [`open_pack`]).

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::{Model, ModelConfig};
use kore_tokenizer::Tokenizer;

use crate::error::{LaunchError, Result};

/// The model used when `--model` is absent.
pub const DEFAULT_MODEL: &str = "model-packs/tiny";

/// Where the weights live.
#[derive(Debug)]
enum Weights {
    /// A Hugging Face model directory.
    Hf(HfModelDir),
}

/// An opened model directory: weights (mapped, not yet checked against the
/// config), tokenizer if present, and the ids that end a generation.
#[derive(Debug)]
pub struct ModelFiles {
    /// The directory.
    pub path: PathBuf,
    weights: Weights,
    /// The tokenizer from `tokenizer.json`, when the directory has one.
    pub tokenizer: Option<Tokenizer>,
    /// Stop ids: the config's and generation_config.json's `eos_token_id`,
    /// plus `<|im_end|>` and `<|endoftext|>` when the tokenizer knows them.
    pub stop_tokens: Vec<u32>,
}

/// Opens `path` (or [`DEFAULT_MODEL`]).
pub fn open(path: Option<&Path>) -> Result<ModelFiles> {
    let path = path.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL));
    if path.join("pack.toml").is_file() {
        return open_pack(&path);
    }
    if !path.join("config.json").is_file() {
        return Err(LaunchError::Model(format!(
            "{}: not a model pack (no pack.toml) nor a Hugging Face model directory (no config.json)",
            path.display()
        )));
    }
    let hf = HfModelDir::open(&path).map_err(|e| LaunchError::Model(e.to_string()))?;
    let config = hf.config().map_err(|e| LaunchError::Model(e.to_string()))?;
    let tokenizer = load_tokenizer(&path)?;
    let stop_tokens = stop_tokens(&path, &config, tokenizer.as_ref());
    Ok(ModelFiles { path, weights: Weights::Hf(hf), tokenizer, stop_tokens })
}

/// Opens a model pack. Packs are written by kore-pack, which does not expose
/// a loading API (a `TensorSource` over the pack) yet; until it does this
/// returns a clear error.
pub fn open_pack(path: &Path) -> Result<ModelFiles> {
    Err(LaunchError::Model(format!(
        "{}: model packs cannot be run natively yet (kore-pack has no loading API); \
         pass a Hugging Face model directory with --model",
        path.display()
    )))
}

impl ModelFiles {
    /// The model, its weights checked against the config and borrowed from the files.
    pub fn model(&self) -> Result<Model<'_>> {
        match &self.weights {
            Weights::Hf(hf) => hf.model().map_err(|e| LaunchError::Model(e.to_string())),
        }
    }
}

fn load_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path)
        .map_err(|source| LaunchError::Io { path: path.display().to_string(), source })?;
    Tokenizer::from_json(&bytes)
        .map(Some)
        .map_err(|e| LaunchError::Model(format!("{}: {e}", path.display())))
}

fn stop_tokens(dir: &Path, config: &ModelConfig, tok: Option<&Tokenizer>) -> Vec<u32> {
    let mut ids = config.eos_token_ids.clone();
    if let Ok(bytes) = std::fs::read(dir.join("generation_config.json")) {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            match v.get("eos_token_id") {
                Some(serde_json::Value::Array(a)) => {
                    ids.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                Some(x) => ids.extend(x.as_u64().map(|x| x as u32)),
                None => {}
            }
        }
    }
    if let Some(t) = tok {
        ids.extend(["<|im_end|>", "<|endoftext|>"].iter().filter_map(|s| t.token_to_id(s)));
    }
    ids.sort_unstable();
    ids.dedup();
    ids.retain(|&id| (id as usize) < config.vocab_size);
    ids
}
