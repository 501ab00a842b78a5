//! Kore's one reader of a Hugging Face model directory as people download it
//! (the engine runs from it; `pack import` reads through it):
//! `config.json` plus one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, memory-mapped, never copied, every header
//! checked by the strict parser. Tensor names of multimodal checkpoints
//! (`model.language_model.…`) are mapped to the text model's (`model.…`);
//! vision tower tensors and the like are set aside ([`canonical`]).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::config::{ConfigError, ModelConfig};
use crate::model::{LoadError, Model};
use crate::safetensors::{HeaderError, TensorIndex, TensorInfo, PAD_PREFIX};
use crate::tensor::{TensorSource, TensorView};

/// What went wrong opening a Hugging Face model directory.
#[derive(Debug)]
pub enum HfError {
    /// The path is not a directory.
    NotADirectory(PathBuf),
    /// A file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is unusable.
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        source: ConfigError,
    },
    /// No safetensors weights in the directory.
    NoWeights(PathBuf),
    /// A safetensors file is malformed.
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: HeaderError,
    },
    /// `model.safetensors.index.json` is malformed or disagrees with the shards.
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The same (canonical) tensor appears twice.
    DuplicateTensor {
        /// Canonical tensor name.
        name: String,
        /// Where it appeared.
        files: (String, String),
    },
    /// The weights do not match the config.
    Load {
        /// The model directory.
        dir: PathBuf,
        /// What is wrong.
        source: LoadError,
    },
}

impl fmt::Display for HfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HfError::NotADirectory(p) => write!(f, "{}: not a model directory", p.display()),
            HfError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            HfError::Config { path, source } => write!(f, "{}: {source}", path.display()),
            HfError::NoWeights(p) => write!(
                f,
                "{}: no model.safetensors, model.safetensors.index.json or *.safetensors files",
                p.display()
            ),
            HfError::Safetensors { path, source } => write!(f, "{}: {source}", path.display()),
            HfError::Index { path, reason } => write!(f, "{}: {reason}", path.display()),
            HfError::DuplicateTensor { name, files } => {
                write!(f, "tensor `{name}` appears twice (in {} and {})", files.0, files.1)
            }
            HfError::Load { dir, source } => write!(f, "{}: {source}", dir.display()),
        }
    }
}

impl std::error::Error for HfError {}

/// One memory-mapped safetensors file.
struct Shard {
    path: PathBuf,
    map: Mmap,
    index: TensorIndex,
}

impl Shard {
    fn open(path: PathBuf) -> Result<Shard, HfError> {
        let io = |source| HfError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 8 {
            let what = "the 8-byte header length".into();
            let source = HeaderError::Truncated { what, needed: 8, actual: len };
            return Err(HfError::Safetensors { path, source });
        }
        // SAFETY: the file is mapped read-only and we never write through the
        // map; as with any mmap, the user must not truncate or rewrite the
        // model files while the process runs (documented on `HfModelDir`).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let index = TensorIndex::parse(&map)
            .map_err(|source| HfError::Safetensors { path: path.clone(), source })?;
        Ok(Shard { path, map, index })
    }

    fn contains(&self, name: &str) -> bool {
        self.index.header().get(name).is_some()
    }
}

/// A Hugging Face model directory, memory-mapped. Do not modify the files
/// while it is open.
pub struct HfModelDir {
    dir: PathBuf,
    config_path: PathBuf,
    config_bytes: Vec<u8>,
    shards: Vec<Shard>,
    /// Canonical name -> (shard index, name in the file).
    index: BTreeMap<String, (usize, String)>,
    /// Names (as in the files) of the tensors left out by [`canonical`].
    dropped: Vec<String>,
}

impl fmt::Debug for HfModelDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HfModelDir")
            .field("dir", &self.dir)
            .field("tensors", &self.index.len())
            .finish()
    }
}

/// The canonical (engine and pack) name of a checkpoint tensor, or `None` for
/// one the text model never uses (vision tower, KV-cache scales, RoPE caches,
/// Kore's alignment padding).
pub fn canonical(name: &str) -> Option<String> {
    let renamed = if let Some(rest) = name.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else if let Some(rest) = name.strip_prefix("language_model.model.") {
        format!("model.{rest}")
    } else if let Some(rest) = name.strip_prefix("language_model.") {
        rest.to_string()
    } else if let Some(rest) = name.strip_prefix("model.mtp.") {
        format!("mtp.{rest}")
    } else {
        name.to_string()
    };
    let vision = renamed.starts_with("model.visual.")
        || renamed.starts_with("visual.")
        || renamed.contains("vision_tower");
    let kv_scale = renamed.ends_with(".k_scale") || renamed.ends_with(".v_scale");
    let pad = renamed.starts_with(PAD_PREFIX);
    if vision || kv_scale || pad || renamed.ends_with("rotary_emb.inv_freq") {
        return None;
    }
    Some(renamed)
}

/// One tensor as the checkpoint stores it.
#[derive(Debug, Clone, Copy)]
pub struct StoredTensor<'a> {
    /// The file holding it.
    pub file: &'a Path,
    /// Its header entry (original name, dtype, shape).
    pub info: &'a TensorInfo,
    /// Its bytes.
    pub data: &'a [u8],
}

impl HfModelDir {
    /// Opens `dir`: reads `config.json`, maps and checks every safetensors header.
    pub fn open(dir: &Path) -> Result<Self, HfError> {
        if !dir.is_dir() {
            return Err(HfError::NotADirectory(dir.to_path_buf()));
        }
        let config_path = dir.join("config.json");
        let config_bytes = std::fs::read(&config_path)
            .map_err(|source| HfError::Io { path: config_path.clone(), source })?;
        let shards = open_shards(dir)?;
        let mut index: BTreeMap<String, (usize, String)> = BTreeMap::new();
        let mut dropped = Vec::new();
        for (i, shard) in shards.iter().enumerate() {
            for name in shard.index.names() {
                let Some(c) = canonical(name) else {
                    dropped.push(name.to_string());
                    continue;
                };
                if let Some((j, other)) = index.get(&c) {
                    let files = (
                        format!("{} as `{other}`", shards[*j].path.display()),
                        format!("{} as `{name}`", shard.path.display()),
                    );
                    return Err(HfError::DuplicateTensor { name: c, files });
                }
                index.insert(c, (i, name.to_string()));
            }
        }
        Ok(HfModelDir { dir: dir.to_path_buf(), config_path, config_bytes, shards, index, dropped })
    }

    /// The model directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Raw `config.json`.
    pub fn config_json(&self) -> &[u8] {
        &self.config_bytes
    }

    /// Parses `config.json`.
    pub fn config(&self) -> Result<ModelConfig, HfError> {
        ModelConfig::from_json(&self.config_bytes)
            .map_err(|source| HfError::Config { path: self.config_path.clone(), source })
    }

    /// Parses the config and loads the model, borrowing the mapped weights.
    pub fn model(&self) -> Result<Model<'_>, HfError> {
        let cfg = self.config()?;
        Model::load(cfg, self).map_err(|source| HfError::Load { dir: self.dir.clone(), source })
    }

    /// Canonical names of all (non-vision) tensors.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Tensors of the files that no canonical name maps to (see [`canonical`]).
    pub fn dropped(&self) -> &[String] {
        &self.dropped
    }

    /// Canonical tensor `name` as stored: file, header entry and bytes.
    pub fn stored(&self, name: &str) -> Option<StoredTensor<'_>> {
        let (i, orig) = self.index.get(name)?;
        let shard = &self.shards[*i];
        let header = shard.index.header();
        let info = header.get(orig)?;
        let start = usize::try_from(header.data_start + info.start).ok()?;
        let end = usize::try_from(header.data_start + info.end).ok()?;
        Some(StoredTensor { file: &shard.path, info, data: shard.map.get(start..end)? })
    }
}

impl TensorSource for HfModelDir {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let (i, orig) = self.index.get(name)?;
        let shard = &self.shards[*i];
        shard.index.view(&shard.map, orig)
    }

    fn location(&self, name: &str) -> String {
        match self.index.get(name) {
            Some((i, _)) => self.shards[*i].path.display().to_string(),
            None => {
                let files: Vec<String> = self
                    .shards
                    .iter()
                    .map(|s| {
                        s.path
                            .file_name()
                            .map(|f| f.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    })
                    .collect();
                format!("{} ({})", self.dir.display(), files.join(", "))
            }
        }
    }
}

/// Finds and maps the weight files: the index's shards, else
/// `model.safetensors`, else every `*.safetensors` file.
fn open_shards(dir: &Path) -> Result<Vec<Shard>, HfError> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.exists() {
        return open_indexed(dir, &index_path);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![Shard::open(single)?]);
    }
    let read =
        std::fs::read_dir(dir).map_err(|source| HfError::Io { path: dir.to_path_buf(), source })?;
    let mut files: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(HfError::NoWeights(dir.to_path_buf()));
    }
    files.into_iter().map(Shard::open).collect()
}

fn open_indexed(dir: &Path, index_path: &Path) -> Result<Vec<Shard>, HfError> {
    let bad = |reason: String| HfError::Index { path: index_path.to_path_buf(), reason };
    let bytes = std::fs::read(index_path)
        .map_err(|source| HfError::Io { path: index_path.to_path_buf(), source })?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("missing `weight_map` object".into()))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map entry for `{tensor}` is not a file name")))?;
        if file.contains('/') || file.contains('\\') || file == ".." || file.is_empty() {
            return Err(bad(format!(
                "weight_map entry for `{tensor}` names `{file}`, which is not a plain file name"
            )));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    if files.is_empty() {
        return Err(bad("weight_map lists no files".into()));
    }
    files.sort();
    let shards: Vec<Shard> =
        files.iter().map(|f| Shard::open(dir.join(f))).collect::<Result<_, _>>()?;
    for (tensor, file) in map {
        let file = file.as_str().unwrap_or_default();
        let pos = files.iter().position(|f| f == file).unwrap_or(0);
        if !shards[pos].contains(tensor) {
            return Err(bad(format!(
                "weight_map puts `{tensor}` in {file}, but that file does not contain it"
            )));
        }
    }
    Ok(shards)
}
