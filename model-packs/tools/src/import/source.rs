//! Reading a Hugging Face model directory for import: the engine's reader
//! ([`HfModelDir`]: config.json, single or sharded safetensors, canonical names),
//! plus the pack's view of the config and ModelOpt's `hf_quant_config.json`.
//! MoE experts fused as transformers keeps them (`mlp.experts.gate_up_proj`
//! `[E, 2I, H]`, `mlp.experts.down_proj` `[E, H, I]`) are seen as the
//! per-expert tensors packs store (`mlp.experts.N.{gate,up,down}_proj.weight`),
//! borrowed slices of the fused ones.

use crate::config::PackConfig;
use crate::error::{PackError, Result};
use crate::safetensors::TensorRef;
use kore_engine::hf::{HfError, HfModelDir};
use kore_pack_format::JsonConfig;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

pub use kore_engine::hf::canonical as pack_name;

/// An opened Hugging Face checkpoint.
#[derive(Debug)]
pub struct HfCheckpoint {
    /// The directory.
    pub dir: PathBuf,
    /// The model configuration read from config.json (MTP count reconciled with the tensors).
    pub config: PackConfig,
    /// The mapped files.
    hf: HfModelDir,
    /// Tensors by pack name (`model.layers.0...`, `lm_head.weight`, `mtp.*`).
    pub tensors: BTreeSet<String>,
    /// Tensors skipped on purpose (vision tower, KV-cache scales...).
    pub dropped: Vec<String>,
    /// True when hf_quant_config.json (or config.json) declares ModelOpt NVFP4.
    pub modelopt: bool,
    /// Per-expert views of fused expert tensors, by pack name.
    split: BTreeMap<String, Split>,
}

/// One expert's matrix inside a fused expert tensor.
#[derive(Debug)]
struct Split {
    /// The fused tensor's name.
    fused: String,
    /// The expert's shape `[rows, cols]`.
    shape: Vec<u64>,
    /// Its bytes within the fused tensor.
    bytes: Range<usize>,
}

impl HfCheckpoint {
    /// Opens `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let hf = HfModelDir::open(dir).map_err(hf_error)?;
        let cfg_path = dir.join("config.json");
        let root: Value = serde_json::from_slice(hf.config_json())
            .map_err(|e| PackError::manifest(&cfg_path, format!("not valid JSON: {e}")))?;
        let json = JsonConfig::parse(hf.config_json())
            .map_err(|e| PackError::manifest(&cfg_path, e.to_string()))?;
        let mut config = PackConfig::from_json(&json);
        if config.eos_token_ids.is_empty() {
            config.eos_token_ids = generation_eos(dir);
        }
        let modelopt = detect_modelopt(dir, &root)?;
        let mut tensors: BTreeSet<String> = hf.tensor_names().map(str::to_string).collect();
        let split = split_fused_experts(&hf, &mut tensors);
        let mut dropped = hf.dropped().to_vec();
        reconcile_mtp(&cfg_path, &mut config, &tensors)?;
        if config.tie_word_embeddings && tensors.remove("lm_head.weight") {
            tracing::info!("config ties embeddings: dropping the checkpoint's lm_head.weight copy");
            dropped.push("lm_head.weight".into());
        }
        config.validate().map_err(|e| PackError::from_manifest(&cfg_path, e))?;
        Ok(Self { dir: dir.to_path_buf(), config, hf, tensors, dropped, modelopt, split })
    }

    /// A view of the tensor stored under pack name `name`.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        if !self.tensors.contains(name) {
            return None;
        }
        if let Some((key, s)) = self.split.get_key_value(name) {
            let t = self.hf.stored(&s.fused)?;
            let data = t.data.get(s.bytes.clone())?;
            return Some(TensorRef { name: key, dtype: t.info.dtype, shape: &s.shape, data });
        }
        let t = self.hf.stored(name)?;
        Some(TensorRef {
            name: &t.info.name,
            dtype: t.info.dtype,
            shape: &t.info.shape,
            data: t.data,
        })
    }

    /// The path of the file holding `name`.
    pub fn file_of(&self, name: &str) -> PathBuf {
        let stored = self.split.get(name).map_or(name, |s| s.fused.as_str());
        self.hf.stored(stored).map_or_else(|| self.dir.clone(), |t| t.file.to_path_buf())
    }
}

/// Replaces every fused expert tensor (3-D float `*.mlp.experts.gate_up_proj`
/// or `*.mlp.experts.down_proj`) in `tensors` by its per-expert views.
fn split_fused_experts(hf: &HfModelDir, tensors: &mut BTreeSet<String>) -> BTreeMap<String, Split> {
    let mut split = BTreeMap::new();
    let fused: Vec<String> = tensors
        .iter()
        .filter(|n| {
            n.ends_with(".mlp.experts.gate_up_proj") || n.ends_with(".mlp.experts.down_proj")
        })
        .cloned()
        .collect();
    for name in fused {
        let Some(t) = hf.stored(&name) else { continue };
        let (dtype, shape) = (t.info.dtype, &t.info.shape);
        if shape.len() != 3 || !dtype.is_float() {
            continue; // left as it is: the import names it as unexpected
        }
        let (n, rows, cols) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
        let base = &name[..name.rfind('.').unwrap_or(0)];
        let es = dtype.size();
        let each = rows * cols * es;
        let parts: Vec<(&str, usize, usize)> = if name.ends_with("gate_up_proj") {
            if rows % 2 != 0 {
                continue;
            }
            vec![("gate_proj", 0, rows / 2), ("up_proj", rows / 2, rows)]
        } else {
            vec![("down_proj", 0, rows)]
        };
        for e in 0..n {
            for &(part, r0, r1) in &parts {
                let start = e * each + r0 * cols * es;
                split.insert(
                    format!("{base}.{e}.{part}.weight"),
                    Split {
                        fused: name.clone(),
                        shape: vec![(r1 - r0) as u64, cols as u64],
                        bytes: start..start + (r1 - r0) * cols * es,
                    },
                );
            }
        }
        tensors.remove(&name);
    }
    tensors.extend(split.keys().cloned());
    split
}

/// The engine reader's error as this crate's, naming the same file.
fn hf_error(e: HfError) -> PackError {
    let not_found =
        |what: &str| std::io::Error::new(std::io::ErrorKind::NotFound, what.to_string());
    match e {
        HfError::NotADirectory(p) => PackError::io(p, not_found("not a model directory")),
        HfError::Io { path, source } => PackError::io(path, source),
        HfError::NoWeights(p) => {
            PackError::io(p, not_found("no *.safetensors weights in this directory"))
        }
        HfError::Safetensors { path, source } => PackError::header(&path, source),
        HfError::Config { path, source } => PackError::manifest(path, source.to_string()),
        HfError::Index { path, reason } => PackError::manifest(path, reason),
        other @ (HfError::DuplicateTensor { .. } | HfError::Load { .. }) => {
            PackError::Invalid(other.to_string())
        }
    }
}

fn reconcile_mtp(
    cfg_path: &Path,
    config: &mut PackConfig,
    tensors: &BTreeSet<String>,
) -> Result<()> {
    let layers: BTreeSet<u64> = tensors
        .iter()
        .filter_map(|n| n.strip_prefix("mtp.layers.")?.split('.').next()?.parse().ok())
        .collect();
    let present = layers.len() as u64;
    let declared = config.mtp_num_hidden_layers;
    if present == 0 && declared > 0 {
        tracing::warn!("config.json declares {declared} MTP layer(s) but the checkpoint has no mtp.* tensors; the pack will have no MTP head");
        config.mtp_num_hidden_layers = 0;
    } else if declared == 0 && present > 0 {
        config.mtp_num_hidden_layers = present;
    } else if declared != present {
        return Err(PackError::manifest(
            cfg_path,
            format!(
                "config.json declares {declared} MTP layer(s) but the checkpoint holds {present}"
            ),
        ));
    }
    Ok(())
}

/// `eos_token_id` of `generation_config.json`, when the file exists and names one.
fn generation_eos(dir: &Path) -> Vec<u64> {
    let Ok(Value::Object(gen)) = read_json(&dir.join("generation_config.json")) else {
        return Vec::new();
    };
    let ids = kore_pack_format::config::eos_ids(&gen).unwrap_or_default();
    ids.into_iter().map(u64::from).collect()
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path).map_err(|e| PackError::io(path, e))?;
    serde_json::from_slice(&text)
        .map_err(|e| PackError::manifest(path, format!("not valid JSON: {e}")))
}

fn detect_modelopt(dir: &Path, root: &Value) -> Result<bool> {
    let hf_quant = dir.join("hf_quant_config.json");
    let (file, q) = if hf_quant.is_file() {
        let v = read_json(&hf_quant)?;
        (hf_quant, v.get("quantization").cloned().unwrap_or(v))
    } else {
        match root.get("quantization_config") {
            Some(q) => (dir.join("config.json"), q.clone()),
            None => return Ok(false),
        }
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("modelopt");
    let algo = q.get("quant_algo").and_then(Value::as_str).unwrap_or("");
    if method != "modelopt" || !algo.eq_ignore_ascii_case("NVFP4") {
        return Err(PackError::manifest(
            file,
            format!("quantization `{method}`/`{algo}` is not supported; import a bf16/f16/f32 checkpoint or a ModelOpt NVFP4 one"),
        ));
    }
    let group = q.get("group_size").and_then(Value::as_u64).unwrap_or(16);
    if group != 16 {
        return Err(PackError::manifest(
            file,
            format!("NVFP4 group_size {group} is not supported (16 is)"),
        ));
    }
    Ok(true)
}
