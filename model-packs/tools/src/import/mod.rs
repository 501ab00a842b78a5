//! `pack import`: a Hugging Face directory (bf16/f16/f32, or ModelOpt NVFP4)
//! becomes a pack.
//!
//! Unquantized matrices (embeddings, kept Linears) are stored as BF16 (with
//! [`QuantMode::Keep`]: in the checkpoint's own dtype); an MoE router and
//! shared-expert gate (unless quantized on request) keep the checkpoint's
//! dtype, since they choose the experts; norms, conv1d, A_log and dt_bias as
//! F32. Chosen Linear families are quantized to
//! NVFP4 with [`crate::nvfp4`]; a ModelOpt checkpoint's NVFP4 tensors are copied
//! byte for byte and nothing else of it is quantized. The output head is
//! stored as [`ImportOptions::head`] says ([`crate::head`]).

mod source;

pub use source::{pack_name, HfCheckpoint};

use crate::config::{ExpectedTensor, LinearGroup, TensorKind};
use crate::error::{PackError, Result};
use crate::head::{HeadFormat, DEFAULT_HEAD, LM_HEAD, LM_HEAD_EXACT};
use crate::manifest::{Manifest, Quantization, Scheme, TokenizerEntry, ALIGNMENT, FORMAT_VERSION};
use crate::nvfp4::{self, E4M3_ONE, GROUP};
use crate::output::{write_pack, WeightsWriter};
use crate::progress::Progress;
use crate::safetensors::{to_f32, DType, TensorRef, TensorSpec};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

/// Storage for the quantizable Linears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// NVFP4 for the chosen families.
    Nvfp4,
    /// No quantization (BF16).
    Bf16,
    /// No quantization and no conversion: matrices keep the checkpoint's
    /// dtype (F32, BF16 or F16; F64 becomes F32), so the pack computes
    /// exactly what the checkpoint does.
    Keep,
}

/// Options of [`import`].
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Quantization mode.
    pub quant: QuantMode,
    /// Linear families to quantize when `quant` is NVFP4.
    pub groups: BTreeSet<LinearGroup>,
    /// Module-name globs (`*`, `?`) kept unquantized.
    pub keep: Vec<String>,
    /// Model name for pack.toml (default: the directory name).
    pub name: Option<String>,
    /// Context length (default: the config's max_position_embeddings).
    pub context_length: Option<u64>,
    /// Storage of the output head; `None`: BF16 with `QuantMode::Bf16`,
    /// NVFP4 when `groups` has the lm-head family, else [`DEFAULT_HEAD`].
    pub head: Option<HeadFormat>,
}

impl ImportOptions {
    /// The head format this import writes (see [`ImportOptions::head`]).
    pub fn head_format(&self) -> HeadFormat {
        match (self.head, self.quant) {
            (Some(h), _) => h,
            (None, QuantMode::Bf16 | QuantMode::Keep) => HeadFormat::Bf16,
            (None, _) if self.groups.contains(&LinearGroup::LmHead) => HeadFormat::Nvfp4,
            (None, _) => DEFAULT_HEAD,
        }
    }
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self {
            quant: QuantMode::Nvfp4,
            groups: default_groups(),
            keep: Vec::new(),
            name: None,
            context_length: None,
            head: None,
        }
    }
}

/// The Linear families quantized by default: MLP (and an MoE model's shared
/// expert), attention, DeltaNet projections and routed experts.
pub fn default_groups() -> BTreeSet<LinearGroup> {
    [LinearGroup::Mlp, LinearGroup::Attention, LinearGroup::LinearAttention, LinearGroup::Experts]
        .into_iter()
        .collect()
}

/// What an import produced.
#[derive(Debug, Clone)]
pub struct ImportSummary {
    /// Model tensors written (NVFP4 modules count once).
    pub tensors: usize,
    /// Modules stored as NVFP4.
    pub nvfp4_modules: usize,
    /// Of those, copied from a ModelOpt checkpoint.
    pub copied_nvfp4: usize,
    /// weights.safetensors size.
    pub weights_bytes: u64,
    /// Whether the pack has an MTP head.
    pub mtp: bool,
    /// Checkpoint tensors dropped on purpose.
    pub dropped: usize,
}

enum Action<'a> {
    Plain { name: String, src: TensorRef<'a>, out: DType },
    Quantize { module: String, src: TensorRef<'a>, rows: u64, cols: u64 },
    QuantizeQ8 { module: String, src: TensorRef<'a>, rows: u64, cols: u64 },
    Copy { module: String, parts: Vec<(String, TensorRef<'a>)> },
}

/// Imports the Hugging Face model in `hf_dir` as a pack in `out`.
pub fn import(
    hf_dir: &Path,
    out: &Path,
    opts: &ImportOptions,
    progress: &dyn Progress,
) -> Result<ImportSummary> {
    let ck = HfCheckpoint::open(hf_dir)?;
    let mut expected = ck.config.expected_tensors();
    let head = opts.head_format();
    if ck.config.tie_word_embeddings && head != HeadFormat::Bf16 {
        expected.push(crate::head::separate_head(&ck.config));
    }
    // An untied NVFP4 head gets a q8 copy that rescores its candidates, unless
    // the head stays unquantized (kept, or a ModelOpt checkpoint's own).
    if !head_stays_plain(&ck, opts) && crate::head::stores_exact_copy(&ck.config, head) {
        expected.push(crate::head::exact_head(&ck.config));
    }
    let mut planner = Planner { ck: &ck, opts, used: HashSet::new() };
    let mut actions = Vec::with_capacity(expected.len());
    for e in &expected {
        actions.push(planner.plan(e)?);
    }
    if let Some(name) = ck.tensors.iter().find(|n| !planner.used.contains(*n)) {
        let tensor = ck.get(name).map_or_else(|| name.clone(), |t| t.name.to_string());
        return Err(PackError::UnexpectedTensor { file: ck.file_of(name), tensor });
    }
    let (specs, modules) = specs_of(&actions);
    let copied = actions.iter().filter(|a| matches!(a, Action::Copy { .. })).count();
    let manifest = build_manifest(&ck, opts, modules)?;
    let tokenizer_path = hf_dir.join("tokenizer.json");
    let tokenizer =
        std::fs::read(&tokenizer_path).map_err(|e| PackError::io(&tokenizer_path, e))?;
    let nvfp4_modules =
        manifest.quantization.modules.values().filter(|s| **s == Scheme::Nvfp4).count();
    let mtp = manifest.mtp;
    let pack = write_pack(out, manifest, &specs, &tokenizer, progress, |w| {
        actions.iter().try_for_each(|a| write_action(w, a, progress))
    })?;
    Ok(ImportSummary {
        tensors: expected.len(),
        nvfp4_modules,
        copied_nvfp4: copied,
        weights_bytes: pack.manifest().files[crate::manifest::WEIGHTS_FILE].bytes,
        mtp,
        dropped: ck.dropped.len(),
    })
}

/// Whether the output head is copied unquantized whatever `--head` says: kept
/// by `--keep`, or a ModelOpt checkpoint's own.
fn head_stays_plain(ck: &HfCheckpoint, opts: &ImportOptions) -> bool {
    ck.modelopt || opts.keep.iter().any(|g| glob_match(g, LM_HEAD))
}

/// Matches each expected tensor with the checkpoint's, noting which it used.
struct Planner<'a> {
    ck: &'a HfCheckpoint,
    opts: &'a ImportOptions,
    used: HashSet<String>,
}

impl<'a> Planner<'a> {
    fn plan(&mut self, e: &ExpectedTensor) -> Result<Action<'a>> {
        let (ck, opts) = (self.ck, self.opts);
        if let (Some(module), TensorKind::Linear(group)) = (e.module(), e.kind) {
            if module == LM_HEAD_EXACT {
                // Quantized from the same lm_head as the NVFP4 head.
                let from = ExpectedTensor { name: format!("{LM_HEAD}.weight"), ..e.clone() };
                let (module, src) = (module.to_string(), self.plain_source(&from)?);
                return Ok(Action::QuantizeQ8 { module, src, rows: e.shape[0], cols: e.shape[1] });
            }
            let src = ck.get(&e.name);
            if module == LM_HEAD && src.is_none_or(|t| t.dtype != DType::U8) {
                return self.head(e);
            }
            if src.is_some_and(|t| t.dtype == DType::U8) {
                return self.copy(e, module);
            }
            let (rows, cols) = (e.shape[0], e.shape[1]);
            let wanted =
                opts.quant == QuantMode::Nvfp4 && !ck.modelopt && opts.groups.contains(&group);
            let kept = opts.keep.iter().any(|g| glob_match(g, module));
            if wanted && !kept && cols % GROUP as u64 == 0 {
                let src = self.plain_source(e)?;
                return Ok(Action::Quantize { module: module.to_string(), src, rows, cols });
            }
        }
        let src = self.plain_source(e)?;
        let out = match e.kind {
            TensorKind::Linear(LinearGroup::Router) => match src.dtype {
                DType::F32 | DType::BF16 | DType::F16 => src.dtype,
                _ => DType::F32,
            },
            TensorKind::Linear(_) | TensorKind::Embedding if opts.quant == QuantMode::Keep => {
                match src.dtype {
                    DType::F32 | DType::BF16 | DType::F16 => src.dtype,
                    _ => DType::F32,
                }
            }
            TensorKind::Linear(_) | TensorKind::Embedding => DType::BF16,
            TensorKind::Norm | TensorKind::Conv | TensorKind::Param => DType::F32,
        };
        Ok(Action::Plain { name: e.name.clone(), src, out })
    }

    /// The output head as [`ImportOptions::head_format`] says; a tied model's
    /// separate copy is quantized from the embedding.
    fn head(&mut self, e: &ExpectedTensor) -> Result<Action<'a>> {
        let (ck, opts) = (self.ck, self.opts);
        let mut from = e.clone();
        if ck.config.tie_word_embeddings {
            from.name = "model.embed_tokens.weight".into();
        }
        let src = self.plain_source(&from)?;
        let module = LM_HEAD.to_string();
        let (rows, cols) = (e.shape[0], e.shape[1]);
        // An unquantized head is BF16, or with `QuantMode::Keep` the checkpoint's own dtype.
        let plain = match src.dtype {
            DType::F32 | DType::F16 if opts.quant == QuantMode::Keep => src.dtype,
            _ => DType::BF16,
        };
        Ok(match opts.head_format() {
            _ if head_stays_plain(ck, opts) => {
                Action::Plain { name: e.name.clone(), src, out: plain }
            }
            HeadFormat::Q8 if cols % crate::head::Q8_GROUP as u64 == 0 => {
                Action::QuantizeQ8 { module, src, rows, cols }
            }
            HeadFormat::Nvfp4 if cols % GROUP as u64 == 0 => {
                Action::Quantize { module, src, rows, cols }
            }
            _ => Action::Plain { name: e.name.clone(), src, out: plain },
        })
    }

    fn plain_source(&mut self, e: &ExpectedTensor) -> Result<TensorRef<'a>> {
        let ck = self.ck;
        let src = ck.get(&e.name).ok_or_else(|| PackError::MissingTensor {
            file: ck.dir.clone(),
            tensor: e.name.clone(),
        })?;
        if !src.dtype.is_float() {
            return Err(PackError::BadTensor {
                file: ck.file_of(&e.name),
                tensor: src.name.to_string(),
                reason: format!("dtype {} is not a floating-point type", src.dtype),
            });
        }
        if src.shape != e.shape.as_slice() {
            return Err(PackError::ShapeMismatch {
                file: ck.file_of(&e.name),
                tensor: src.name.to_string(),
                expected: e.shape.clone(),
                found: src.shape.to_vec(),
            });
        }
        self.used.insert(e.name.clone());
        Ok(src)
    }

    fn copy(&mut self, e: &ExpectedTensor, module: &str) -> Result<Action<'a>> {
        let ck = self.ck;
        let file = ck.file_of(&e.name);
        if !ck.modelopt {
            return Err(PackError::BadTensor {
            file,
            tensor: e.name.clone(),
            reason: "U8 weight but the checkpoint declares no ModelOpt NVFP4 quantization (hf_quant_config.json)".into(),
        });
        }
        let (n, k) = (e.shape[0], e.shape[1]);
        let mut parts = Vec::new();
        for (suffix, dtype, shape, required) in crate::nvfp4::stored_parts(n, k) {
            let name = format!("{module}.{suffix}");
            let Some(t) = ck.get(&name) else {
                if required {
                    return Err(PackError::MissingTensor { file: file.clone(), tensor: name });
                }
                continue;
            };
            // ModelOpt writes scalars as shape [] (some tools use [1]).
            let shape_ok = t.shape == shape.as_slice() || (shape.is_empty() && t.shape == [1]);
            if t.dtype != dtype || !shape_ok || k % GROUP as u64 != 0 {
                return Err(PackError::ShapeMismatch {
                    file: ck.file_of(&name),
                    tensor: t.name.to_string(),
                    expected: shape,
                    found: t.shape.to_vec(),
                });
            }
            self.used.insert(name.clone());
            parts.push((name, t));
        }
        Ok(Action::Copy { module: module.to_string(), parts })
    }
}

fn specs_of(actions: &[Action<'_>]) -> (Vec<TensorSpec>, BTreeMap<String, Scheme>) {
    let mut specs = Vec::new();
    let mut modules = BTreeMap::new();
    for a in actions {
        match a {
            Action::Plain { name, src, out } => {
                specs.push(TensorSpec::new(name.clone(), *out, src.shape.to_vec()))
            }
            Action::Quantize { module, rows, cols, .. } => {
                specs.push(TensorSpec::new(
                    format!("{module}.weight"),
                    DType::U8,
                    vec![*rows, cols / 2],
                ));
                specs.push(TensorSpec::new(
                    format!("{module}.weight_scale"),
                    DType::F8E4M3,
                    vec![*rows, cols / GROUP as u64],
                ));
                specs.push(TensorSpec::new(format!("{module}.weight_scale_2"), DType::F32, vec![]));
                modules.insert(module.clone(), Scheme::Nvfp4);
            }
            Action::QuantizeQ8 { module, rows, cols, .. } => {
                specs.push(TensorSpec::new(
                    format!("{module}.weight"),
                    DType::I8,
                    vec![*rows, *cols],
                ));
                let blocks = cols / crate::head::Q8_GROUP as u64;
                specs.push(TensorSpec::new(
                    format!("{module}.weight_scale"),
                    DType::F16,
                    vec![*rows, blocks],
                ));
                modules.insert(module.clone(), Scheme::Q8);
            }
            Action::Copy { module, parts } => {
                for (name, t) in parts {
                    let shape = if t.dtype == DType::F32 { vec![] } else { t.shape.to_vec() };
                    specs.push(TensorSpec::new(name.clone(), t.dtype, shape));
                }
                modules.insert(module.clone(), Scheme::Nvfp4);
            }
        }
    }
    (specs, modules)
}

fn build_manifest(
    ck: &HfCheckpoint,
    opts: &ImportOptions,
    modules: BTreeMap<String, Scheme>,
) -> Result<Manifest> {
    let (chat_template, bos_token, eos_token) = tokenizer_meta(&ck.dir)?;
    let name = opts
        .name
        .clone()
        .or_else(|| {
            ck.dir.canonicalize().ok()?.file_name().map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "model".into());
    let producer = if modules.is_empty() {
        None
    } else if ck.modelopt {
        Some("modelopt".to_string())
    } else {
        Some("kore".to_string())
    };
    Ok(Manifest {
        format_version: FORMAT_VERSION,
        name,
        architecture: ck.config.architecture().into(),
        context_length: opts.context_length.unwrap_or(ck.config.max_position_embeddings),
        mtp: ck.config.mtp_num_hidden_layers > 0,
        alignment: ALIGNMENT,
        source: Some(format!("pack import {}", ck.dir.display())),
        config: ck.config.clone(),
        tokenizer: TokenizerEntry {
            file: crate::manifest::TOKENIZER_FILE.into(),
            chat_template,
            bos_token,
            eos_token,
        },
        quantization: Quantization { group_size: GROUP as u64, producer, modules },
        files: BTreeMap::new(),
    })
}

type TokenizerMeta = (Option<String>, Option<String>, Option<String>);

/// Chat template, BOS and EOS text from tokenizer_config.json / chat_template.jinja.
fn tokenizer_meta(dir: &Path) -> Result<TokenizerMeta> {
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = if cfg_path.is_file() { Some(source::read_json(&cfg_path)?) } else { None };
    let token = |key: &str| -> Option<String> {
        let v = cfg.as_ref()?.get(key)?;
        v.as_str().or_else(|| v.get("content")?.as_str()).map(str::to_string)
    };
    let mut template = cfg.as_ref().and_then(|c| match c.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    });
    let jinja = dir.join("chat_template.jinja");
    if template.is_none() && jinja.is_file() {
        template = Some(std::fs::read_to_string(&jinja).map_err(|e| PackError::io(&jinja, e))?);
    }
    Ok((template, token("bos_token"), token("eos_token")))
}

const CHUNK_ELEMS: u64 = 1 << 20;

fn write_action(w: &mut WeightsWriter, action: &Action<'_>, progress: &dyn Progress) -> Result<()> {
    match action {
        Action::Plain { name, src, out } => write_plain(w, name, src, *out, progress),
        Action::Quantize { module, src, rows, cols } => {
            write_quantized(w, module, src, *rows, *cols, progress)
        }
        Action::QuantizeQ8 { module, src, cols, .. } => {
            crate::head::write_q8(w, module, src, *cols as usize, progress)
        }
        Action::Copy { parts, .. } => parts.iter().try_for_each(|(name, t)| {
            progress.inc(t.data.len() as u64);
            w.write_tensor(name, t.data)
        }),
    }
}

fn write_plain(
    w: &mut WeightsWriter,
    name: &str,
    src: &TensorRef<'_>,
    out: DType,
    progress: &dyn Progress,
) -> Result<()> {
    w.begin(name)?;
    let size = src.dtype.size();
    if src.dtype == out {
        for chunk in src.data.chunks(CHUNK_ELEMS as usize * size) {
            w.write(chunk)?;
            progress.inc(chunk.len() as u64);
        }
        return Ok(());
    }
    let mut buf = Vec::new();
    for chunk in src.data.chunks(CHUNK_ELEMS as usize * size) {
        let vals = to_f32(src.name, src.dtype, chunk)?;
        buf.clear();
        match out {
            DType::BF16 => vals.iter().for_each(|&v| {
                buf.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes())
            }),
            _ => vals.iter().for_each(|&v| buf.extend_from_slice(&v.to_le_bytes())),
        }
        w.write(&buf)?;
        progress.inc(buf.len() as u64);
    }
    Ok(())
}

/// Streams a ModelOpt-exact NVFP4 quantization: one pass for amax, one for the codes.
fn write_quantized(
    w: &mut WeightsWriter,
    module: &str,
    src: &TensorRef<'_>,
    rows: u64,
    cols: u64,
    progress: &dyn Progress,
) -> Result<()> {
    let size = src.dtype.size();
    let rows_per_chunk = (CHUNK_ELEMS / cols).max(1) as usize;
    let chunk_bytes = rows_per_chunk * cols as usize * size;
    let mut amax = 0.0f32;
    for (c, chunk) in src.data.chunks(chunk_bytes).enumerate() {
        let vals = to_f32(src.name, src.dtype, chunk)?;
        if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
            let at = c * rows_per_chunk * cols as usize + i;
            return Err(PackError::Quant {
                tensor: src.name.to_string(),
                reason: format!(
                    "non-finite value at row {}, column {}; fix the checkpoint",
                    at / cols as usize,
                    at % cols as usize
                ),
            });
        }
        amax = vals.iter().fold(amax, |m, v| m.max(v.abs()));
    }
    let s2 = nvfp4::global_scale(amax);
    let mut scales = vec![E4M3_ONE; (rows * cols) as usize / GROUP];
    w.begin(&format!("{module}.weight"))?;
    let mut packed = Vec::with_capacity(chunk_bytes / size / 2);
    for (c, chunk) in src.data.chunks(chunk_bytes).enumerate() {
        let vals = to_f32(src.name, src.dtype, chunk)?;
        packed.clear();
        let first_block = c * rows_per_chunk * cols as usize / GROUP;
        for (b, block) in vals.chunks_exact(GROUP).enumerate() {
            if s2 > 0.0 {
                let (sb, bytes) = nvfp4::quantize_block(block, s2);
                scales[first_block + b] = sb;
                packed.extend_from_slice(&bytes);
            } else {
                packed.extend_from_slice(&[0u8; GROUP / 2]);
            }
        }
        w.write(&packed)?;
        progress.inc(packed.len() as u64);
    }
    w.write_tensor(&format!("{module}.weight_scale"), &scales)?;
    w.write_tensor(&format!("{module}.weight_scale_2"), &s2.to_le_bytes())?;
    progress.inc(scales.len() as u64 + 4);
    Ok(())
}

/// Glob match with `*` (any run, dots included) and `?` (one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*.mlp.*", "model.layers.3.mlp.down_proj"));
        assert!(glob_match("model.layers.?.self_attn.*", "model.layers.3.self_attn.q_proj"));
        assert!(!glob_match("model.layers.?.self_attn.*", "model.layers.13.self_attn.q_proj"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "acd"));
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(
            pack_name("model.language_model.layers.0.mlp.up_proj.weight").unwrap(),
            "model.layers.0.mlp.up_proj.weight"
        );
        assert_eq!(pack_name("mtp.fc.weight").unwrap(), "mtp.fc.weight");
        assert!(pack_name("model.visual.blocks.0.attn.qkv.weight").is_none());
        assert!(pack_name("model.language_model.layers.3.self_attn.k_scale").is_none());
    }
}
