//! Resolving `--model PATH` into a loaded model and its tokenizer: a model
//! pack directory (`pack.toml`, opened and structurally validated by
//! kore-pack, weights used in place), or a Hugging Face model directory
//! (`config.json` + safetensors, memory-mapped, "imported on the fly": no
//! quantization). Without `--model`, the default pack [`DEFAULT_MODEL`] is
//! looked up as described at [`resolve`].

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::{Model, ModelConfig};
use kore_pack::Pack;
use kore_tokenizer::Tokenizer;

use crate::error::{LaunchError, Result};

/// The model used when `--model` is absent (relative to the repository).
pub const DEFAULT_MODEL: &str = "model-packs/tiny";

/// Where the weights live.
#[derive(Debug)]
enum Weights {
    /// A Hugging Face model directory.
    Hf(HfModelDir),
    /// A Kore model pack.
    Pack(Box<Pack>),
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
    /// Stop ids: the config's and generation_config.json's `eos_token_id`
    /// (a pack's `eos_token`), plus `<|im_end|>` and `<|endoftext|>` when the
    /// tokenizer knows them.
    pub stop_tokens: Vec<u32>,
}

/// The model directory of the effective settings: the one configured, or
/// the default pack found by [`resolve`].
pub fn effective_path(settings: &crate::config::Settings) -> Result<PathBuf> {
    match settings.model_is_default {
        true => resolve(None),
        false => Ok(settings.model.clone()),
    }
}

/// The directory `--model` names, or the default pack: `model-packs/tiny`
/// under the current directory or one of its ancestors (so any directory of
/// the repository works), else under an ancestor of the `kore-launch`
/// executable (`target/release/` of a checkout), else under the checkout this
/// binary was built from. A clear error when none exists.
pub fn resolve(path: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = path {
        return Ok(p.to_path_buf());
    }
    find_default(&default_candidates())
}

/// The first of `candidates` holding a `pack.toml`, or an error listing them.
fn find_default(candidates: &[PathBuf]) -> Result<PathBuf> {
    if let Some(found) = candidates.iter().find(|d| d.join("pack.toml").is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(LaunchError::Model(format!(
        "the default pack {DEFAULT_MODEL} was not found (looked for pack.toml in {}); \
         run from the Kore repository or pass --model PACK_OR_HF_DIR",
        looked.join(", ")
    )))
}

/// Where the default pack may be, most specific first, without duplicates.
fn default_candidates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |base: &Path| {
        let p = base.join(DEFAULT_MODEL);
        if !out.contains(&p) {
            out.push(p);
        }
    };
    if let Ok(cwd) = std::env::current_dir() {
        cwd.ancestors().for_each(&mut push);
    }
    if let Some(exe_dir) =
        std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf))
    {
        exe_dir.ancestors().for_each(&mut push);
    }
    // The checkout this binary was built from (launcher/..).
    if let Some(repo) = Path::new(env!("CARGO_MANIFEST_DIR")).parent() {
        push(repo);
    }
    out
}

/// The tokenizer file of a pack (as its pack.toml names it) or a Hugging Face
/// directory (`tokenizer.json`); a path that is not a directory is returned as is.
pub fn tokenizer_path(dir: &Path) -> PathBuf {
    if !dir.is_dir() {
        return dir.to_path_buf();
    }
    if dir.join("pack.toml").is_file() {
        if let Ok(m) = kore_pack::manifest::load(dir) {
            return dir.join(m.tokenizer.file);
        }
    }
    dir.join("tokenizer.json")
}

/// Opens `path` (or the default pack, see [`resolve`]).
pub fn open(path: Option<&Path>) -> Result<ModelFiles> {
    let path = resolve(path)?;
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
    let tokenizer = load_tokenizer(&path.join("tokenizer.json"))?;
    let mut ids = config.eos_token_ids.clone();
    ids.extend(generation_config_eos(&path));
    let stop_tokens = stop_tokens(ids, &config, tokenizer.as_ref(), None);
    Ok(ModelFiles { path, weights: Weights::Hf(hf), tokenizer, stop_tokens })
}

/// Opens a model pack: manifest, weights header, offsets, alignment and every
/// tensor's dtype and shape are checked against the config, and every file
/// against pack.toml's sizes and digests (hashed once, then cached: see
/// [`crate::pack_check`]); the tokenizer is the one pack.toml names.
///
/// The weights are copied into hugepage-backed memory first, as the VMM
/// preloads them into guest RAM, so native and guest runs read weights the same
/// way; `KORE_NATIVE_WEIGHTS=mmap` reads them through the file mapping instead.
pub fn open_pack(path: &Path) -> Result<ModelFiles> {
    crate::pack_check::ensure_intact(path)?;
    let pack = match std::env::var("KORE_NATIVE_WEIGHTS").as_deref() {
        Ok("mmap") => Pack::open(path),
        Ok("resident") | Err(_) => Pack::open_resident(path, &crate::cmd::pack::Bar::default()),
        Ok(other) => {
            return Err(LaunchError::Usage(format!(
                "KORE_NATIVE_WEIGHTS={other}: expected `resident` (the default) or `mmap`"
            )))
        }
    }
    .map_err(|e| LaunchError::Model(e.to_string()))?;
    tracing::info!(pack = %path.display(), weights = %pack.residency(), "pack opened");
    let config = pack.engine_config();
    let tokenizer = load_tokenizer(&pack.tokenizer_path())?;
    let eos = pack.manifest().tokenizer.eos_token.clone();
    let stop_tokens =
        stop_tokens(config.eos_token_ids.clone(), &config, tokenizer.as_ref(), eos.as_deref());
    Ok(ModelFiles {
        path: path.to_path_buf(),
        weights: Weights::Pack(Box::new(pack)),
        tokenizer,
        stop_tokens,
    })
}

impl ModelFiles {
    /// Where the weights live, for logs and `bench`: a pack's [`kore_pack::safetensors::Residency`],
    /// or the file mapping of a Hugging Face directory.
    pub fn residency(&self) -> String {
        match &self.weights {
            Weights::Hf(_) => "mapped from the file (4 KiB pages)".into(),
            Weights::Pack(pack) => pack.residency().to_string(),
        }
    }

    /// The model, its weights checked against the config and borrowed from the
    /// files, with this process's engine options (`engine_options`).
    pub fn model(&self) -> Result<Model<'_>> {
        let mut model = match &self.weights {
            Weights::Hf(hf) => hf.model().map_err(|e| LaunchError::Model(e.to_string()))?,
            Weights::Pack(pack) => pack.model().map_err(|e| LaunchError::Model(e.to_string()))?,
        };
        let opts = crate::engine_options::current();
        model.set_options(&opts).map_err(|e| LaunchError::Usage(format!("KORE_KERNELS: {e}")))?;
        Ok(model)
    }
}

fn load_tokenizer(path: &Path) -> Result<Option<Tokenizer>> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(path)
        .map_err(|source| LaunchError::Io { path: path.display().to_string(), source })?;
    Tokenizer::from_json(&bytes)
        .map(Some)
        .map_err(|e| LaunchError::Model(format!("{}: {e}", path.display())))
}

/// `eos_token_id` (a number or a list) of `dir/generation_config.json`, if any.
fn generation_config_eos(dir: &Path) -> Vec<u32> {
    let Ok(bytes) = std::fs::read(dir.join("generation_config.json")) else { return Vec::new() };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Vec::new() };
    match v.get("eos_token_id") {
        Some(serde_json::Value::Array(a)) => {
            a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect()
        }
        Some(x) => x.as_u64().map(|x| x as u32).into_iter().collect(),
        None => Vec::new(),
    }
}

fn stop_tokens(
    mut ids: Vec<u32>,
    config: &ModelConfig,
    tok: Option<&Tokenizer>,
    eos_token: Option<&str>,
) -> Vec<u32> {
    if let Some(t) = tok {
        let names = ["<|im_end|>", "<|endoftext|>"].into_iter().chain(eos_token);
        ids.extend(names.filter_map(|s| t.token_to_id(s)));
    }
    ids.sort_unstable();
    ids.dedup();
    ids.retain(|&id| (id as usize) < config.vocab_size);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_pack_is_searched_from_the_working_directory_up() {
        let c = default_candidates();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(c[0], cwd.join(DEFAULT_MODEL));
        assert!(c.contains(&cwd.parent().unwrap().join(DEFAULT_MODEL)));
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join(DEFAULT_MODEL);
        assert!(c.contains(&repo));
        let mut sorted = c.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), c.len(), "no duplicates");
    }

    #[test]
    fn missing_default_pack_is_a_clear_error() {
        let base = std::env::temp_dir().join(format!("kore-default-pack-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        std::fs::create_dir_all(&b).unwrap();
        let err = find_default(&[a.clone(), b.clone()]).unwrap_err().to_string();
        assert!(err.contains("default pack model-packs/tiny was not found"), "{err}");
        assert!(err.contains(&a.display().to_string()) && err.contains("--model"), "{err}");
        std::fs::write(b.join("pack.toml"), "").unwrap();
        assert_eq!(find_default(&[a, b.clone()]).unwrap(), b);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_explicit_path_is_taken_as_given() {
        let p = Path::new("/nonexistent/model");
        assert_eq!(resolve(Some(p)).unwrap(), p);
        let err = open(Some(p)).unwrap_err().to_string();
        assert!(err.contains("not a model pack") && err.contains("/nonexistent/model"), "{err}");
    }
}
