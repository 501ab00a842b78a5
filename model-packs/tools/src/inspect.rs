//! `pack inspect`: a pack's tensors, sizes and quantization, with totals.

use crate::manifest::Scheme;
use crate::pack::Pack;
use crate::safetensors::PAD_PREFIX;
use serde::Serialize;
use std::collections::BTreeMap;

/// One tensor row.
#[derive(Debug, Clone, Serialize)]
pub struct TensorRow {
    /// Name.
    pub name: String,
    /// Stored dtype.
    pub dtype: String,
    /// Stored shape.
    pub shape: Vec<u64>,
    /// Bytes of data.
    pub bytes: u64,
    /// Absolute file offset of the data.
    pub offset: u64,
    /// `nvfp4` for parts of an NVFP4 module, `none` otherwise.
    pub quant: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// Model name.
    pub name: String,
    /// Architecture.
    pub architecture: String,
    /// Pack format version.
    pub format_version: u32,
    /// Context length.
    pub context_length: u64,
    /// MTP head present.
    pub mtp: bool,
    /// Decoder layers.
    pub layers: u64,
    /// Residual width.
    pub hidden_size: u64,
    /// Vocabulary.
    pub vocab_size: u64,
    /// Tensors (padding excluded).
    pub tensors: Vec<TensorRow>,
    /// Model parameters (an NVFP4 Linear counts its unquantized elements).
    pub parameters: u64,
    /// NVFP4 modules.
    pub nvfp4_modules: usize,
    /// Bytes of tensor data by quantization (`nvfp4`, `none`).
    pub bytes_by_quant: BTreeMap<String, u64>,
    /// Bytes of tensor data by dtype.
    pub bytes_by_dtype: BTreeMap<String, u64>,
    /// Alignment padding bytes.
    pub padding_bytes: u64,
    /// weights.safetensors size.
    pub file_bytes: u64,
}

/// Builds the report for an opened pack.
pub fn inspect(pack: &Pack) -> Inspection {
    let m = pack.manifest();
    let header = pack.weights().header();
    let mut rows = Vec::new();
    let (mut params, mut padding) = (0u64, 0u64);
    let mut by_quant = BTreeMap::new();
    let mut by_dtype = BTreeMap::new();
    for t in &header.tensors {
        if t.name.starts_with(PAD_PREFIX) {
            padding += t.nbytes();
            continue;
        }
        let module = t.name.rsplit_once('.').map(|(m, _)| m).unwrap_or("");
        let scheme = m.quantization.modules.get(module);
        let numel: u64 = t.shape.iter().product();
        let weight = t.name.ends_with(".weight");
        params += match (scheme, weight) {
            (Some(Scheme::Nvfp4), true) => numel * 2,
            (Some(_), false) => 0,
            (_, _) => numel,
        };
        let quant = match scheme {
            Some(Scheme::Nvfp4) => "nvfp4",
            Some(Scheme::Q8) => "q8",
            None => "none",
        };
        *by_quant.entry(quant.to_string()).or_insert(0) += t.nbytes();
        *by_dtype.entry(t.dtype.to_string()).or_insert(0) += t.nbytes();
        rows.push(TensorRow {
            name: t.name.clone(),
            dtype: t.dtype.to_string(),
            shape: t.shape.clone(),
            bytes: t.nbytes(),
            offset: header.data_start + t.start,
            quant: quant.into(),
        });
    }
    Inspection {
        name: m.name.clone(),
        architecture: m.architecture.clone(),
        format_version: m.format_version,
        context_length: m.context_length,
        mtp: m.mtp,
        layers: m.config.num_hidden_layers,
        hidden_size: m.config.hidden_size,
        vocab_size: m.config.vocab_size,
        tensors: rows,
        parameters: params,
        nvfp4_modules: m.quantization.modules.values().filter(|s| **s == Scheme::Nvfp4).count(),
        bytes_by_quant: by_quant,
        bytes_by_dtype: by_dtype,
        padding_bytes: padding,
        file_bytes: pack.weights().bytes().len() as u64,
    }
}
