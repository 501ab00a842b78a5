//! Resolving `--model PATH` into a loaded model and its tokenizer: a model
//! pack directory (`pack.toml`, opened and structurally validated by
//! kore-pack, weights used in place), or a Hugging Face model directory
//! (`config.json` + safetensors, memory-mapped, "imported on the fly": no
//! quantization). Without `--model`, the default pack [`DEFAULT_MODEL`] is
//! looked up as described at [`resolve`].

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::Model;
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
/// config), tokenizer if present, and what decides the ids that end a
/// generation besides the config (`kore_appliance::stop_ids` is the rule).
#[derive(Debug)]
pub struct ModelFiles {
    weights: Weights,
    /// The tokenizer from `tokenizer.json`, when the directory has one.
    pub tokenizer: Option<Tokenizer>,
    /// A pack's `eos_token` text.
    pub eos_token: Option<String>,
    /// A Hugging Face directory's `generation_config.json` `eos_token_id`s.
    pub extra_eos_ids: Vec<u32>,
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
/// executable (`target/release/` of a checkout), else the copy this binary
/// carries ([`crate::bundle`], written under `$XDG_DATA_HOME/kore` on first
/// use). A clear error when none exists.
pub fn resolve(path: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = path {
        return Ok(p.to_path_buf());
    }
    find_default(&default_candidates()).or_else(|missing| {
        // No checkout around: the pack this binary carries (an installed kore-launch).
        crate::bundle::tree("packs/tiny").map_err(|e| match e {
            crate::bundle::BundleError::Missing(_) => missing,
            other => LaunchError::Host(other.to_string()),
        })
    })
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
    let tokenizer = load_tokenizer(&path.join("tokenizer.json"))?;
    let extra_eos_ids = generation_config_eos(&path);
    Ok(ModelFiles { weights: Weights::Hf(hf), tokenizer, eos_token: None, extra_eos_ids })
}

/// Opens a model pack: manifest, weights header, offsets, alignment and every
/// tensor's dtype and shape are checked against the config, and every file
/// against pack.toml's sizes and digests (hashed once, then cached: see
/// [`crate::pack_check`]); the tokenizer is the one pack.toml names.
///
/// The weights are copied into hugepage-backed memory first, as the VMM
/// preloads them into guest RAM, so native and guest runs read weights the
/// same way ([`copy_by_default`]); a mixture-of-experts pack larger than half
/// the available memory stays mapped from the file instead: a token reads only
/// its routed experts, and a copy would pin every expert (a 35B-A3B pack is
/// ~20 GB) where the page cache can hold the ones in use.
/// `KORE_NATIVE_WEIGHTS=mmap` or `resident` chooses either for any pack.
pub fn open_pack(path: &Path) -> Result<ModelFiles> {
    crate::pack_check::ensure_intact(path)?;
    let bar = crate::term::progress::Bar::default();
    let pack = match crate::env::get("KORE_NATIVE_WEIGHTS").as_deref() {
        Some("mmap") => Pack::open(path),
        Some("resident") => Pack::open_resident(path, &bar),
        None => Pack::open(path).and_then(|p| {
            let bytes = std::fs::metadata(p.dir().join(kore_pack::manifest::WEIGHTS_FILE))
                .map_or(u64::MAX, |m| m.len());
            let available = kore_pack::safetensors::mem_available();
            if copy_by_default(p.config().moe.is_some(), bytes, available) {
                p.into_resident(&bar)
            } else {
                Ok(p)
            }
        }),
        Some(other) => {
            return Err(LaunchError::Usage(format!(
                "KORE_NATIVE_WEIGHTS={other}: expected `mmap` or `resident` (the default, \
                 except for a mixture-of-experts pack larger than half the available memory)"
            )))
        }
    }
    .map_err(|e| LaunchError::Model(e.to_string()))?;
    tracing::info!(pack = %path.display(), weights = %pack.residency(), "pack opened");
    let tokenizer = load_tokenizer(&pack.tokenizer_path())?;
    let eos_token = pack.manifest().tokenizer.eos_token.clone();
    Ok(ModelFiles {
        weights: Weights::Pack(Box::new(pack)),
        tokenizer,
        eos_token,
        extra_eos_ids: Vec::new(),
    })
}

/// Whether `--native` copies a pack's `bytes` of weights by default: a dense
/// pack always (the copy itself keeps the mapping when it does not fit in the
/// available memory); a mixture-of-experts pack only when it takes at most half
/// of `available`. Mapped weights decoded 0.57-0.78x as fast as copied ones on
/// the cut 35B-A3B pack (docs/benchmarks.md), so a pack that fits comfortably
/// is still copied, but a large one leaves its memory to the page cache.
fn copy_by_default(moe: bool, bytes: u64, available: Option<u64>) -> bool {
    !moe || available.is_some_and(|a| bytes.saturating_mul(2) <= a)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_pack_is_searched_from_the_working_directory_up() {
        let c = default_candidates();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(c[0], cwd.join(DEFAULT_MODEL));
        assert!(c.contains(&cwd.parent().unwrap().join(DEFAULT_MODEL)));
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
    fn a_large_moe_pack_stays_mapped_and_everything_else_is_copied() {
        const GB: u64 = 1_000_000_000;
        // The 35B-A3B (20 GB) on an idle 24 GB host: mapped; its 8-layer cut: copied.
        assert!(!copy_by_default(true, 20 * GB, Some(22 * GB)));
        assert!(copy_by_default(true, 6 * GB, Some(18 * GB)));
        assert!(!copy_by_default(true, 6 * GB, Some(11 * GB)));
        assert!(!copy_by_default(true, 6 * GB, None));
        // Dense packs: always asked for (the copy falls back to the mapping itself).
        assert!(copy_by_default(false, 20 * GB, Some(22 * GB)));
        assert!(copy_by_default(false, 2 * GB, None));
    }

    #[test]
    fn a_small_moe_pack_opens_and_is_copied() {
        // Assumes KORE_NATIVE_WEIGHTS is unset (the default placement).
        let dir = tempfile::tempdir().unwrap();
        let moe = dir.path().join("moe");
        let head = kore_pack::head::DEFAULT_HEAD;
        kore_pack::synth::synth("qwen3.5-moe-tiny", &moe, 1, head, Some(2), &kore_pack::NoProgress)
            .unwrap();
        let files = open_pack(&moe).unwrap();
        assert!(files.residency().starts_with("copied"), "{}", files.residency());
        files.model().unwrap();
    }

    #[test]
    fn an_explicit_path_is_taken_as_given() {
        let p = Path::new("/nonexistent/model");
        assert_eq!(resolve(Some(p)).unwrap(), p);
        let err = open(Some(p)).unwrap_err().to_string();
        assert!(err.contains("not a model pack") && err.contains("/nonexistent/model"), "{err}");
    }
}
