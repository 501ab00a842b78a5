//! Streaming safetensors writer with aligned tensor data.
//!
//! The header is computed up front from the tensor list, so tensors can be
//! streamed to disk one chunk at a time (a 9B pack never sits in memory). The
//! file's sha256 is computed while writing.

use super::DType;
use crate::error::{PackError, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

pub use kore_pack_format::safetensors::PAD_PREFIX;

/// A tensor to be written: name, dtype and shape (its data comes later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// Builds a spec.
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<u64>) -> Self {
        Self { name: name.into(), dtype, shape }
    }

    /// Data size in bytes, `None` on overflow.
    pub fn nbytes(&self) -> Option<u64> {
        self.shape.iter().try_fold(self.dtype.size() as u64, |acc, &d| acc.checked_mul(d))
    }
}

#[derive(Debug, Clone)]
struct Slot {
    name: String,
    len: u64,
    pad: bool,
}

/// Writes one safetensors file; call [`begin`](Self::begin) /
/// [`write`](Self::write) for every tensor in the order given, then
/// [`finish`](Self::finish).
#[derive(Debug)]
pub struct SafetensorsWriter<W: Write> {
    out: W,
    label: PathBuf,
    hasher: Sha256,
    slots: Vec<Slot>,
    next: usize,
    remaining: u64,
    current: Option<String>,
    total: u64,
}

impl<W: Write> SafetensorsWriter<W> {
    /// Writes the header for `specs` (data aligned to `align` bytes, a power of
    /// two) to `out`. `label` names the file in errors.
    pub fn new(
        out: W,
        label: &Path,
        specs: &[TensorSpec],
        align: u64,
        metadata: &[(String, String)],
    ) -> Result<Self> {
        let (header, slots) = build_header(label, specs, align, metadata)?;
        let mut w = Self {
            out,
            label: label.to_path_buf(),
            hasher: Sha256::new(),
            slots,
            next: 0,
            remaining: 0,
            current: None,
            total: 0,
        };
        w.emit(&header)?;
        Ok(w)
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| PackError::io(&self.label, e))?;
        self.hasher.update(bytes);
        self.total += bytes.len() as u64;
        Ok(())
    }

    fn misuse(&self, reason: String) -> PackError {
        PackError::BadTensor {
            file: self.label.clone(),
            tensor: self.current.clone().unwrap_or_default(),
            reason: format!("writer misuse: {reason}"),
        }
    }

    /// Starts tensor `name`, which must be the next one in the spec order.
    pub fn begin(&mut self, name: &str) -> Result<()> {
        if self.remaining != 0 {
            return Err(
                self.misuse(format!("{} bytes still missing before `{name}`", self.remaining))
            );
        }
        while let Some(slot) = self.slots.get(self.next).filter(|s| s.pad).cloned() {
            self.emit(&vec![0u8; slot.len as usize])?;
            self.next += 1;
        }
        let Some(slot) = self.slots.get(self.next).cloned() else {
            return Err(
                self.misuse(format!("`{name}` is not in the tensor list (or was already written)"))
            );
        };
        if slot.name != name {
            return Err(self.misuse(format!("expected `{}` next, got `{name}`", slot.name)));
        }
        self.next += 1;
        self.remaining = slot.len;
        self.current = Some(slot.name);
        Ok(())
    }

    /// Appends bytes to the current tensor.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        if chunk.len() as u64 > self.remaining {
            return Err(self.misuse(format!(
                "{} bytes written but only {} remain",
                chunk.len(),
                self.remaining
            )));
        }
        self.remaining -= chunk.len() as u64;
        self.emit(chunk)
    }

    /// Writes a whole tensor at once.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.begin(name)?;
        self.write(data)?;
        if self.remaining != 0 {
            return Err(self.misuse(format!("{} bytes short", self.remaining)));
        }
        Ok(())
    }

    /// Checks every tensor was written; returns the sink, the sha256 (hex) and the size.
    pub fn finish(mut self) -> Result<(W, String, u64)> {
        if self.remaining != 0 || self.slots[self.next..].iter().any(|s| !s.pad) {
            return Err(self.misuse("finish() before every tensor was written".into()));
        }
        self.out.flush().map_err(|e| PackError::io(&self.label, e))?;
        let digest = hex(&self.hasher.finalize());
        Ok((self.out, digest, self.total))
    }
}

/// Lowercase hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lays out the data area (inserting pads) and serialises the header,
/// padded with spaces so the data area starts on an `align` boundary.
fn build_header(
    label: &Path,
    specs: &[TensorSpec],
    align: u64,
    metadata: &[(String, String)],
) -> Result<(Vec<u8>, Vec<Slot>)> {
    if align == 0 || !align.is_power_of_two() || align > 1 << 21 {
        return Err(PackError::Invalid(format!(
            "alignment {align} must be a power of two up to 2 MiB"
        )));
    }
    let mut slots = Vec::with_capacity(specs.len());
    let mut json = String::from("{");
    if !metadata.is_empty() {
        let meta: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        json.push_str(&format!("\"__metadata__\":{}", serde_json::Value::Object(meta)));
    }
    let mut seen = std::collections::HashSet::new();
    let mut offset = 0u64;
    let mut pads = 0usize;
    for spec in specs {
        let bad = |reason: &str| PackError::BadTensor {
            file: label.to_path_buf(),
            tensor: spec.name.clone(),
            reason: reason.to_string(),
        };
        if spec.name.starts_with(PAD_PREFIX) || spec.name == "__metadata__" {
            return Err(bad("this name is reserved"));
        }
        if !seen.insert(spec.name.as_str()) {
            return Err(bad("listed twice"));
        }
        let len = spec.nbytes().ok_or_else(|| bad("shape overflows"))?;
        let aligned = offset.div_ceil(align) * align;
        if aligned > offset && len > 0 {
            let gap = aligned - offset;
            let name = format!("{PAD_PREFIX}{pads}");
            pads += 1;
            push_entry(&mut json, &name, DType::U8, &[gap], offset, aligned);
            slots.push(Slot { name, len: gap, pad: true });
            offset = aligned;
        }
        push_entry(&mut json, &spec.name, spec.dtype, &spec.shape, offset, offset + len);
        slots.push(Slot { name: spec.name.clone(), len, pad: false });
        offset += len;
    }
    json.push('}');
    let mut header = json.into_bytes();
    let target = (8 + header.len() as u64).div_ceil(align) * align - 8;
    header.resize(target as usize, b' ');
    let mut out = Vec::with_capacity(8 + header.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    Ok((out, slots))
}

fn push_entry(json: &mut String, name: &str, dtype: DType, shape: &[u64], start: u64, end: u64) {
    if json.len() > 1 {
        json.push(',');
    }
    let key = serde_json::Value::String(name.to_string());
    json.push_str(&format!(
        "{key}:{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{start},{end}]}}",
        dtype.name(),
        shape
    ));
}
