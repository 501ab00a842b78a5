//! Storage of the output head (`pack import|synth --head bf16|q8|nvfp4`).
//!
//! - `bf16`: the head as BF16 (for a tied model: no copy, the embedding is
//!   the head);
//! - `q8`: int8 with one F16 scale per 32 columns (`weight` I8 `[V, H]`,
//!   `weight_scale` F16 `[V, H/32]`), listed as `q8` in
//!   `[quantization.modules]`; 1.0625 bytes per weight;
//! - `nvfp4`: the NVFP4 layout of every other Linear; 0.5625 bytes per weight,
//!   read in full each step as a screen whose best candidates exact weights
//!   rescore (the engine's `RESCORE_ROWS`).
//!
//! A tied model with a `q8` or `nvfp4` head gets a separate `lm_head` copy
//! quantized from the embedding, which stays BF16, is read one row per token
//! and rescores the copy's candidates. An untied model with an `nvfp4` head
//! also stores [`LM_HEAD_EXACT`], a `q8` copy that only rescores. The default
//! ([`DEFAULT_HEAD`]) is chosen in docs/pack-format.md from the measured top-1
//! agreement with the bf16 head and the bytes a step reads.

use crate::config::{ExpectedTensor, LinearGroup, PackConfig, TensorKind};
use crate::error::{PackError, Result};
use crate::manifest::Scheme;
use crate::output::WeightsWriter;
use crate::progress::Progress;
use crate::safetensors::{to_f32, TensorRef};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Columns per scale of a `q8` head: the engine's group, which decodes it.
pub use kore_engine::Q8_GROUP;

/// The module name of the output head.
pub const LM_HEAD: &str = "lm_head";

/// The module name of an untied model's `q8` head copy that rescores an
/// `nvfp4` head's best candidates.
pub const LM_HEAD_EXACT: &str = "lm_head_exact";

/// How a pack stores its output head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadFormat {
    /// BF16 (tied models: the embedding itself).
    Bf16,
    /// int8, one F16 scale per [`Q8_GROUP`] columns.
    Q8,
    /// NVFP4 (E2M1 codes, E4M3 scale per 16 columns, F32 global scale).
    Nvfp4,
}

/// The head `pack import` (when quantizing) and `pack synth` write by default.
pub const DEFAULT_HEAD: HeadFormat = HeadFormat::Nvfp4;

impl HeadFormat {
    /// The flag value (`bf16`, `q8`, `nvfp4`).
    pub fn name(self) -> &'static str {
        match self {
            HeadFormat::Bf16 => "bf16",
            HeadFormat::Q8 => "q8",
            HeadFormat::Nvfp4 => "nvfp4",
        }
    }
}

impl fmt::Display for HeadFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for HeadFormat {
    type Err = PackError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bf16" => Ok(HeadFormat::Bf16),
            "q8" => Ok(HeadFormat::Q8),
            "nvfp4" => Ok(HeadFormat::Nvfp4),
            other => Err(PackError::Invalid(format!(
                "unknown head format `{other}`; choose bf16, q8 or nvfp4"
            ))),
        }
    }
}

/// The tensors a pack must hold: the config's, plus a separate `lm_head`
/// when the model is tied and `modules` lists a quantized head, plus
/// [`LM_HEAD_EXACT`] when the model is untied and `modules` lists it.
pub fn expected_tensors(
    config: &PackConfig,
    modules: &BTreeMap<String, Scheme>,
) -> Vec<ExpectedTensor> {
    let mut v = config.expected_tensors();
    if config.tie_word_embeddings && modules.contains_key(LM_HEAD) {
        v.push(separate_head(config));
    }
    if !config.tie_word_embeddings && modules.contains_key(LM_HEAD_EXACT) {
        v.push(exact_head(config));
    }
    v
}

/// Whether a pack of `config` whose head is stored as `head` carries an
/// [`LM_HEAD_EXACT`] copy: an untied `nvfp4` head (a tied one is rescored by
/// the embedding).
pub fn stores_exact_copy(config: &PackConfig, head: HeadFormat) -> bool {
    !config.tie_word_embeddings
        && head == HeadFormat::Nvfp4
        && config.hidden_size % Q8_GROUP as u64 == 0
}

/// The `lm_head_exact.weight` entry of an untied model's rescoring copy.
pub fn exact_head(config: &PackConfig) -> ExpectedTensor {
    ExpectedTensor {
        name: format!("{LM_HEAD_EXACT}.weight"),
        shape: vec![config.vocab_size, config.hidden_size],
        kind: TensorKind::Linear(LinearGroup::LmHead),
    }
}

/// The `lm_head.weight` entry of a tied model's separate head copy.
pub fn separate_head(config: &PackConfig) -> ExpectedTensor {
    ExpectedTensor {
        name: format!("{LM_HEAD}.weight"),
        shape: vec![config.vocab_size, config.hidden_size],
        kind: TensorKind::Linear(LinearGroup::LmHead),
    }
}

/// Quantizes `row` (length a multiple of [`Q8_GROUP`]) to int8 with one F16
/// scale per block: `scale = f16(amax / 127)`, `q = round(x / scale)`
/// clamped to ±127 (the scale rounded to F16 first, so `q * scale` is what
/// the engine computes). Appends to `q` and `scales` (little-endian F16).
///
/// # Errors
/// A non-finite value (the block and row are named by the caller).
pub fn quantize_q8_row(row: &[f32], q: &mut Vec<u8>, scales: &mut Vec<u8>) -> Result<()> {
    for block in row.chunks(Q8_GROUP) {
        if block.iter().any(|v| !v.is_finite()) {
            return Err(PackError::Invalid("non-finite value in the head".into()));
        }
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = half::f16::from_f32(amax / 127.0);
        let sf = s.to_f32();
        let inv = if sf > 0.0 { 1.0 / sf } else { 0.0 };
        q.extend(block.iter().map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8));
        scales.extend_from_slice(&s.to_le_bytes());
    }
    Ok(())
}

/// `q * scale` for every value of a Q8 row (the engine's decoding).
pub fn dequantize_q8_row(q: &[u8], scales: &[u8], out: &mut [f32]) {
    for (b, (blk, o)) in q.chunks(Q8_GROUP).zip(out.chunks_mut(Q8_GROUP)).enumerate() {
        let s = half::f16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]).to_f32();
        for (v, &c) in o.iter_mut().zip(blk) {
            *v = f32::from(c as i8) * s;
        }
    }
}

/// Elements converted per chunk when streaming a head.
const CHUNK_ELEMS: usize = 1 << 20;

/// Streams a `q8` quantization row by row ([`quantize_q8_row`]).
pub(crate) fn write_q8(
    w: &mut WeightsWriter,
    module: &str,
    src: &TensorRef<'_>,
    cols: usize,
    progress: &dyn Progress,
) -> Result<()> {
    let size = src.dtype.size();
    let rows_per_chunk = (CHUNK_ELEMS / cols).max(1);
    let (mut q, mut scales) = (Vec::new(), Vec::new());
    w.begin(&format!("{module}.weight"))?;
    for (c, chunk) in src.data.chunks(rows_per_chunk * cols * size).enumerate() {
        let vals = to_f32(src.name, src.dtype, chunk)?;
        q.clear();
        for (r, row) in vals.chunks_exact(cols).enumerate() {
            quantize_q8_row(row, &mut q, &mut scales).map_err(|_| PackError::Quant {
                tensor: src.name.to_string(),
                reason: format!(
                    "non-finite value in row {}; fix the checkpoint",
                    c * rows_per_chunk + r
                ),
            })?;
        }
        w.write(&q)?;
        progress.inc(q.len() as u64);
    }
    w.write_tensor(&format!("{module}.weight_scale"), &scales)?;
    progress.inc(scales.len() as u64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_round_trip_is_within_half_a_step() {
        let row: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let (mut q, mut s) = (Vec::new(), Vec::new());
        quantize_q8_row(&row, &mut q, &mut s).unwrap();
        assert_eq!((q.len(), s.len()), (96, 6));
        let mut back = vec![0.0; 96];
        dequantize_q8_row(&q, &s, &mut back);
        for (b, blk) in row.chunks(32).enumerate() {
            let step = half::f16::from_le_bytes([s[2 * b], s[2 * b + 1]]).to_f32();
            for (i, v) in blk.iter().enumerate() {
                assert!((back[32 * b + i] - v).abs() <= 0.5 * step * 1.001 + 1e-9, "{b} {i}");
            }
        }
    }

    #[test]
    fn zero_block_and_bad_values() {
        let (mut q, mut s) = (Vec::new(), Vec::new());
        quantize_q8_row(&[0.0; 32], &mut q, &mut s).unwrap();
        assert!(q.iter().all(|&v| v == 0) && s == [0, 0]);
        let mut bad = [1.0f32; 32];
        bad[3] = f32::NAN;
        assert!(quantize_q8_row(&bad, &mut q, &mut s).is_err());
        assert_eq!("q8".parse::<HeadFormat>().unwrap(), HeadFormat::Q8);
        assert!("fp8".parse::<HeadFormat>().is_err());
    }
}
