//! Reading a Hugging Face model directory: config.json, single or sharded
//! safetensors, tokenizer files, and ModelOpt's `hf_quant_config.json`.

use crate::config::PackConfig;
use crate::error::{PackError, Result};
use crate::safetensors::{SafetensorsFile, TensorInfo, TensorRef};
use kore_pack_format::JsonConfig;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where one (renamed) tensor lives.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// Index into [`HfCheckpoint::files`].
    pub file: usize,
    /// The header entry (with the original name).
    pub info: TensorInfo,
}

/// An opened Hugging Face checkpoint.
#[derive(Debug)]
pub struct HfCheckpoint {
    /// The directory.
    pub dir: PathBuf,
    /// The model configuration read from config.json (MTP count reconciled with the tensors).
    pub config: PackConfig,
    /// Mapped safetensors files.
    pub files: Vec<SafetensorsFile>,
    /// Tensors by pack name (`model.layers.0...`, `lm_head.weight`, `mtp.*`).
    pub tensors: BTreeMap<String, SourceTensor>,
    /// Tensors skipped on purpose (vision tower, KV-cache scales...).
    pub dropped: Vec<String>,
    /// True when hf_quant_config.json (or config.json) declares ModelOpt NVFP4.
    pub modelopt: bool,
}

impl HfCheckpoint {
    /// Opens `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let bytes = std::fs::read(&cfg_path).map_err(|e| PackError::io(&cfg_path, e))?;
        let root: Value = serde_json::from_slice(&bytes)
            .map_err(|e| PackError::manifest(&cfg_path, format!("not valid JSON: {e}")))?;
        let json =
            JsonConfig::parse(&bytes).map_err(|e| PackError::manifest(&cfg_path, e.to_string()))?;
        let mut config = PackConfig::from_json(&json);
        if config.eos_token_ids.is_empty() {
            config.eos_token_ids = generation_eos(dir);
        }
        let modelopt = detect_modelopt(dir, &root)?;
        let files = open_shards(dir)?;
        let mut tensors = BTreeMap::new();
        let mut dropped = Vec::new();
        for (i, f) in files.iter().enumerate() {
            for info in &f.header().tensors {
                let Some(name) = pack_name(&info.name) else {
                    dropped.push(info.name.clone());
                    continue;
                };
                if tensors
                    .insert(name.clone(), SourceTensor { file: i, info: info.clone() })
                    .is_some()
                {
                    return Err(PackError::BadTensor {
                        file: f.path().to_path_buf(),
                        tensor: info.name.clone(),
                        reason: format!("a second tensor maps to `{name}`"),
                    });
                }
            }
        }
        reconcile_mtp(&cfg_path, &mut config, &tensors)?;
        if config.tie_word_embeddings && tensors.remove("lm_head.weight").is_some() {
            tracing::info!("config ties embeddings: dropping the checkpoint's lm_head.weight copy");
            dropped.push("lm_head.weight".into());
        }
        config.validate().map_err(|e| PackError::from_manifest(&cfg_path, e))?;
        Ok(Self { dir: dir.to_path_buf(), config, files, tensors, dropped, modelopt })
    }

    /// A view of the tensor stored under pack name `name`.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let s = self.tensors.get(name)?;
        Some(self.files[s.file].view(&s.info))
    }

    /// The path of the file holding `name`.
    pub fn file_of(&self, name: &str) -> PathBuf {
        self.tensors
            .get(name)
            .map(|s| self.files[s.file].path().to_path_buf())
            .unwrap_or_else(|| self.dir.clone())
    }
}

/// Maps a checkpoint tensor name to the pack's naming, or `None` to drop it.
pub fn pack_name(name: &str) -> Option<String> {
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
    let pad = renamed.starts_with(crate::safetensors::PAD_PREFIX);
    if vision || kv_scale || pad || renamed.ends_with("rotary_emb.inv_freq") {
        return None;
    }
    Some(renamed)
}

fn reconcile_mtp(
    cfg_path: &Path,
    config: &mut PackConfig,
    tensors: &BTreeMap<String, SourceTensor>,
) -> Result<()> {
    let layers: BTreeSet<u64> = tensors
        .keys()
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

fn open_shards(dir: &Path) -> Result<Vec<SafetensorsFile>> {
    let index = dir.join("model.safetensors.index.json");
    let mut names: Vec<String> = if index.is_file() {
        let v = read_json(&index)?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| PackError::manifest(&index, "has no `weight_map` object"))?;
        let set: BTreeSet<String> =
            map.values().filter_map(|f| f.as_str().map(str::to_string)).collect();
        set.into_iter().collect()
    } else {
        let rd = std::fs::read_dir(dir).map_err(|e| PackError::io(dir, e))?;
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        v.sort();
        v
    };
    names.retain(|n| !n.contains(".."));
    if names.is_empty() {
        return Err(PackError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no *.safetensors weights in this directory",
            ),
        ));
    }
    names.iter().map(|n| SafetensorsFile::open(&dir.join(n))).collect()
}
