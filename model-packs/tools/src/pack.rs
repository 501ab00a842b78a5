//! Opening and verifying packs.
//!
//! [`Pack::open`] maps weights.safetensors and validates everything that does
//! not need a full read: manifest, header, offsets, alignment, every tensor's
//! dtype and shape against the config. [`verify`] also hashes every file,
//! checks the tokenizer and scans NVFP4 scales.

use crate::config::{ExpectedTensor, PackConfig, TensorKind};
use crate::error::{PackError, Result};
use crate::manifest::{Manifest, Scheme, MANIFEST_FILE, WEIGHTS_FILE};
use crate::nvfp4::GROUP;
use crate::progress::Progress;
use crate::safetensors::{DType, SafetensorsFile, SafetensorsHeader, TensorRef, PAD_PREFIX};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// An opened, structurally validated pack.
#[derive(Debug)]
pub struct Pack {
    dir: PathBuf,
    manifest: Manifest,
    weights: SafetensorsFile,
}

/// A Linear weight as stored: plain floats or NVFP4.
#[derive(Debug, Clone, Copy)]
pub enum LinearRef<'a> {
    /// Unquantized `[out, in]` (F32, BF16 or F16).
    Float(TensorRef<'a>),
    /// NVFP4 in ModelOpt's layout.
    Nvfp4 {
        /// Packed codes `[out, in/2]`.
        weight: TensorRef<'a>,
        /// E4M3 block scales `[out, in/16]`.
        weight_scale: TensorRef<'a>,
        /// Per-tensor scale.
        weight_scale_2: f32,
    },
    /// int8 with F16 scales per 32 columns (a `q8` head).
    Q8 {
        /// int8 values `[out, in]`.
        weight: TensorRef<'a>,
        /// F16 block scales `[out, in/32]`.
        weight_scale: TensorRef<'a>,
    },
}

impl Pack {
    /// Opens the pack in `dir` (see the module docs for what is checked),
    /// reading the weights through a file mapping.
    pub fn open(dir: impl AsRef<Path>) -> Result<Pack> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = crate::manifest::load(&dir)?;
        let wpath = dir.join(WEIGHTS_FILE);
        let weights = SafetensorsFile::open(&wpath)?;
        check_tensors(&wpath, &manifest, weights.header())?;
        let tok = dir.join(&manifest.tokenizer.file);
        if !tok.is_file() {
            return Err(PackError::io(
                &tok,
                std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer file is missing"),
            ));
        }
        Ok(Pack { dir, manifest, weights })
    }

    /// [`Pack::open`], then the weights copied into hugepage-backed memory (as
    /// the VMM preloads them into guest RAM) when memory allows; see
    /// [`Residency`](crate::safetensors::Residency). Native inference uses this.
    /// Everything is validated before the copy.
    pub fn open_resident(dir: impl AsRef<Path>, progress: &dyn Progress) -> Result<Pack> {
        Pack::open(dir)?.into_resident(progress)
    }

    /// This pack with its weights copied as [`Pack::open_resident`] does.
    pub fn into_resident(mut self, progress: &dyn Progress) -> Result<Pack> {
        self.weights = self.weights.into_resident(progress)?;
        Ok(self)
    }

    /// Where the weights live (mapped, or copied to hugepages).
    pub fn residency(&self) -> crate::safetensors::Residency {
        self.weights.residency()
    }

    /// The pack directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The model configuration.
    pub fn config(&self) -> &PackConfig {
        &self.manifest.config
    }

    /// Path of the tokenizer.json.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join(&self.manifest.tokenizer.file)
    }

    /// The mapped weights file.
    pub fn weights(&self) -> &SafetensorsFile {
        &self.weights
    }

    /// A raw tensor view by name.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.weights.tensor(name)
    }

    /// The Linear module `module` (name without `.weight`).
    pub fn linear(&self, module: &str) -> Option<LinearRef<'_>> {
        let weight = self.tensor(&format!("{module}.weight"))?;
        match self.manifest.quantization.modules.get(module) {
            Some(Scheme::Nvfp4) => {
                let weight_scale = self.tensor(&format!("{module}.weight_scale"))?;
                let s2 = self.tensor(&format!("{module}.weight_scale_2"))?;
                let weight_scale_2 = f32::from_le_bytes(s2.data.try_into().ok()?);
                Some(LinearRef::Nvfp4 { weight, weight_scale, weight_scale_2 })
            }
            Some(Scheme::Q8) => {
                let weight_scale = self.tensor(&format!("{module}.weight_scale"))?;
                Some(LinearRef::Q8 { weight, weight_scale })
            }
            None => Some(LinearRef::Float(weight)),
        }
    }
}

/// What [`verify`] checked.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Files hashed.
    pub files: usize,
    /// Bytes hashed.
    pub bytes: u64,
    /// Tensors checked (padding excluded).
    pub tensors: usize,
    /// NVFP4 modules checked.
    pub nvfp4_modules: usize,
}

/// Fully verifies the pack in `dir`: manifest, sizes, structure, checksums,
/// tokenizer and NVFP4 scales. Any defect is an error.
pub fn verify(dir: &Path, progress: &dyn Progress) -> Result<VerifyReport> {
    let manifest = crate::manifest::load(dir)?;
    crate::integrity::check_sizes(dir, &manifest)?;
    let pack = Pack::open(dir)?;
    let checked = crate::integrity::check_files(dir, &manifest, progress)?;
    let mut report = VerifyReport {
        files: checked.hashed_files,
        bytes: checked.hashed_bytes,
        ..Default::default()
    };
    check_tokenizer(&pack.tokenizer_path(), manifest.config.vocab_size)?;
    report.nvfp4_modules = check_scales(&pack)?;
    report.tensors =
        pack.weights.header().tensors.iter().filter(|t| !t.name.starts_with(PAD_PREFIX)).count();
    Ok(report)
}

fn check_tokenizer(path: &Path, vocab: u64) -> Result<()> {
    let text = std::fs::read(path).map_err(|e| PackError::io(path, e))?;
    let json: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| PackError::manifest(path, format!("tokenizer is not valid JSON: {e}")))?;
    let model = json
        .get("model")
        .ok_or_else(|| PackError::manifest(path, "tokenizer has no `model` section"))?;
    let mut max_id = None::<u64>;
    if let Some(v) = model.get("vocab").and_then(|v| v.as_object()) {
        max_id = v.values().filter_map(|x| x.as_u64()).max();
    }
    if let Some(added) = json.get("added_tokens").and_then(|v| v.as_array()) {
        let m = added.iter().filter_map(|t| t.get("id").and_then(|i| i.as_u64())).max();
        max_id = max_id.max(m);
    }
    match max_id {
        Some(id) if id >= vocab => Err(PackError::manifest(
            path,
            format!("tokenizer has token id {id} but the model's vocabulary is {vocab}; tokenizer and weights do not belong together"),
        )),
        _ => Ok(()),
    }
}

fn check_scales(pack: &Pack) -> Result<usize> {
    let file = pack.weights.path().to_path_buf();
    let mut n = 0;
    for module in pack.manifest.quantization.modules.keys() {
        if let Some(LinearRef::Nvfp4 { weight_scale, weight_scale_2, .. }) = pack.linear(module) {
            let bad = |reason: String| PackError::BadTensor {
                file: file.clone(),
                tensor: format!("{module}.weight_scale"),
                reason,
            };
            if !(weight_scale_2.is_finite() && weight_scale_2 >= 0.0) {
                return Err(bad(format!(
                    "weight_scale_2 = {weight_scale_2} is not a finite non-negative number"
                )));
            }
            if let Some(i) = weight_scale.data.iter().position(|&b| b & 0x7f == 0x7f) {
                return Err(bad(format!("block scale {i} is NaN")));
            }
            if let Some(i) = weight_scale.data.iter().position(|&b| b & 0x80 != 0 && b != 0x80) {
                return Err(bad(format!("block scale {i} is negative")));
            }
            n += 1;
        }
    }
    Ok(n)
}

/// Checks every tensor of `header` against the manifest's config and quantization.
pub fn check_tensors(file: &Path, manifest: &Manifest, header: &SafetensorsHeader) -> Result<()> {
    let align = manifest.alignment;
    for t in &header.tensors {
        let abs = header.data_start + t.start;
        if t.nbytes() > 0 && abs % align != 0 && !t.name.starts_with(PAD_PREFIX) {
            return Err(PackError::BadTensor {
                file: file.to_path_buf(),
                tensor: t.name.clone(),
                reason: format!("data starts at file offset {abs}, not a multiple of {align}; re-create the pack"),
            });
        }
    }
    let expected = crate::head::expected_tensors(&manifest.config, &manifest.quantization.modules);
    let mut used: HashSet<String> = HashSet::new();
    let mut linear_modules = HashSet::new();
    for e in &expected {
        if let Some(m) = e.module() {
            linear_modules.insert(m.to_string());
            if let Some(&scheme) = manifest.quantization.modules.get(m) {
                check_quantized(file, header, e, m, scheme, &mut used)?;
                continue;
            }
        }
        check_plain(file, header, e)?;
        used.insert(e.name.clone());
    }
    if let Some(m) = manifest.quantization.modules.keys().find(|m| !linear_modules.contains(*m)) {
        return Err(PackError::manifest(
            file.with_file_name(MANIFEST_FILE),
            format!("[quantization.modules] lists `{m}`, which is not a Linear of this model"),
        ));
    }
    if let Some(t) =
        header.tensors.iter().find(|t| !used.contains(&t.name) && !t.name.starts_with(PAD_PREFIX))
    {
        return Err(PackError::UnexpectedTensor {
            file: file.to_path_buf(),
            tensor: t.name.clone(),
        });
    }
    Ok(())
}

fn check_plain(file: &Path, header: &SafetensorsHeader, e: &ExpectedTensor) -> Result<()> {
    let t = header.get(&e.name).ok_or_else(|| PackError::MissingTensor {
        file: file.to_path_buf(),
        tensor: e.name.clone(),
    })?;
    if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(PackError::BadTensor {
            file: file.to_path_buf(),
            tensor: e.name.clone(),
            reason: format!(
                "dtype {} is not F32, BF16 or F16 (and the module is not listed as quantized)",
                t.dtype
            ),
        });
    }
    if t.shape != e.shape {
        return Err(PackError::ShapeMismatch {
            file: file.to_path_buf(),
            tensor: e.name.clone(),
            expected: e.shape.clone(),
            found: t.shape.clone(),
        });
    }
    Ok(())
}

/// Checks a quantized module `module` (expected as `e`) stored as `scheme`.
fn check_quantized(
    file: &Path,
    header: &SafetensorsHeader,
    e: &ExpectedTensor,
    module: &str,
    scheme: Scheme,
    used: &mut HashSet<String>,
) -> Result<()> {
    let (n, k) = (e.shape[0], e.shape[1]);
    let q8_group = crate::head::Q8_GROUP as u64;
    let (fits, parts, why) = match scheme {
        Scheme::Nvfp4 => (
            k % GROUP as u64 == 0 && matches!(e.kind, TensorKind::Linear(_)),
            crate::nvfp4::stored_parts(n, k).to_vec(),
            format!("listed as NVFP4 but its input dimension {k} is not a multiple of {GROUP}"),
        ),
        Scheme::Q8 => (
            k % q8_group == 0
                && (module == crate::head::LM_HEAD || module == crate::head::LM_HEAD_EXACT),
            vec![
                ("weight", DType::I8, vec![n, k], true),
                ("weight_scale", DType::F16, vec![n, k / q8_group], true),
            ],
            format!("listed as q8, which only `lm_head` or `lm_head_exact` with a multiple of {q8_group} columns may be (input dimension {k})"),
        ),
    };
    if !fits {
        let tensor = e.name.clone();
        return Err(PackError::BadTensor { file: file.to_path_buf(), tensor, reason: why });
    }
    let label = match scheme {
        Scheme::Nvfp4 => "NVFP4",
        Scheme::Q8 => "q8",
    };
    check_parts(file, header, module, label, &parts, used)
}

/// Checks the stored parts (`suffix`, dtype, shape, required) of a quantized
/// `module` and marks them used.
fn check_parts(
    file: &Path,
    header: &SafetensorsHeader,
    module: &str,
    scheme: &str,
    parts: &[(&str, DType, Vec<u64>, bool)],
    used: &mut HashSet<String>,
) -> Result<()> {
    for (suffix, dtype, shape, required) in parts {
        let name = format!("{module}.{suffix}");
        let Some(t) = header.get(&name) else {
            if *required {
                return Err(PackError::MissingTensor { file: file.to_path_buf(), tensor: name });
            }
            continue;
        };
        if t.dtype != *dtype {
            return Err(PackError::BadTensor {
                file: file.to_path_buf(),
                tensor: name,
                reason: format!("{scheme} needs dtype {dtype}, found {}", t.dtype),
            });
        }
        if t.shape != *shape {
            return Err(PackError::ShapeMismatch {
                file: file.to_path_buf(),
                tensor: name,
                expected: shape.clone(),
                found: t.shape.clone(),
            });
        }
        used.insert(name);
    }
    Ok(())
}
