//! Strict header validation: every offset is checked against the buffer before
//! any tensor byte is touched, and the tensors must tile the data area exactly.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use super::raw::{RawEntry, RawHeader};
use super::HeaderError;
use crate::dtype::DType;

/// The largest header accepted (the official libraries use the same bound).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Bounds applied while parsing.
#[derive(Debug, Clone, Copy)]
pub struct HeaderLimits {
    /// Largest JSON header in bytes.
    pub max_header_bytes: u64,
    /// Most tensors accepted.
    pub max_tensors: usize,
    /// Most dimensions per tensor.
    pub max_rank: usize,
}

impl Default for HeaderLimits {
    fn default() -> Self {
        Self { max_header_bytes: MAX_HEADER_BYTES, max_tensors: 1 << 20, max_rank: 8 }
    }
}

/// One tensor entry of a validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Start offset, relative to the data area.
    pub start: u64,
    /// End offset (exclusive), relative to the data area.
    pub end: u64,
}

impl TensorInfo {
    /// Bytes of data.
    pub fn nbytes(&self) -> u64 {
        self.end - self.start
    }
}

/// A validated header: tensors sorted by offset, plus the `__metadata__` map.
#[derive(Debug, Clone)]
pub struct SafetensorsHeader {
    /// Absolute offset of the data area (8 + header length).
    pub data_start: u64,
    /// Tensors sorted by start offset.
    pub tensors: Vec<TensorInfo>,
    /// `__metadata__` entries, in file order.
    pub metadata: Vec<(String, String)>,
    index: BTreeMap<String, usize>,
}

impl SafetensorsHeader {
    /// Looks a tensor up by name.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The position of tensor `name` in [`SafetensorsHeader::tensors`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The metadata value for `key`.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Parses and validates the header of the safetensors buffer whose complete
/// contents are `bytes`.
pub fn parse_header(bytes: &[u8], limits: HeaderLimits) -> Result<SafetensorsHeader, HeaderError> {
    let total = bytes.len() as u64;
    let Some(len_bytes) = bytes.first_chunk::<8>() else {
        return Err(truncated("the 8-byte header length", 8, total));
    };
    let n = u64::from_le_bytes(*len_bytes);
    if n > limits.max_header_bytes {
        let max = limits.max_header_bytes;
        return Err(HeaderError::BadHeader(format!(
            "header length {n} exceeds the {max} byte limit"
        )));
    }
    let data_start = 8 + n;
    if data_start > total {
        return Err(truncated("the JSON header", data_start, total));
    }
    let text = core::str::from_utf8(&bytes[8..data_start as usize])
        .map_err(|e| HeaderError::BadHeader(format!("header is not UTF-8 ({e})")))?;
    if !text.starts_with('{') {
        return Err(HeaderError::BadHeader("header does not start with `{`".into()));
    }
    let raw: RawHeader = serde_json::from_str(text)
        .map_err(|e| HeaderError::BadHeader(format!("header is not a valid JSON object ({e})")))?;
    if let Some(name) = raw.duplicate {
        return Err(HeaderError::BadHeader(format!("tensor name `{name}` appears twice")));
    }
    if raw.entries.len() > limits.max_tensors {
        let (n, max) = (raw.entries.len(), limits.max_tensors);
        return Err(HeaderError::BadHeader(format!("{n} tensors exceed the limit of {max}")));
    }
    let data_len = total - data_start;
    let mut tensors = Vec::with_capacity(raw.entries.len());
    for (name, entry) in raw.entries {
        tensors.push(validate_entry(name, entry, data_len, data_start, limits)?);
    }
    check_layout(&mut tensors, data_len)?;
    let index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
    Ok(SafetensorsHeader { data_start, tensors, metadata: raw.metadata, index })
}

fn truncated(what: &str, needed: u64, actual: u64) -> HeaderError {
    HeaderError::Truncated { what: what.to_string(), needed, actual }
}

fn validate_entry(
    name: String,
    entry: RawEntry,
    data_len: u64,
    data_start: u64,
    limits: HeaderLimits,
) -> Result<TensorInfo, HeaderError> {
    let bad = |reason: String| HeaderError::BadTensor { tensor: name.clone(), reason };
    let dtype = DType::parse(&entry.dtype)
        .ok_or_else(|| bad(format!("unsupported dtype `{}`", entry.dtype)))?;
    let shape = entry.shape;
    if shape.len() > limits.max_rank {
        return Err(bad(format!("rank {} exceeds the limit of {}", shape.len(), limits.max_rank)));
    }
    let nbytes = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .filter(|&b| usize::try_from(b).is_ok())
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    let [start, end] = entry.data_offsets;
    if end < start {
        return Err(bad(format!("data_offsets [{start}, {end}] run backwards")));
    }
    if end - start != nbytes {
        let held = end - start;
        return Err(bad(format!(
            "data_offsets [{start}, {end}] hold {held} bytes but {dtype} × {shape:?} needs {nbytes}"
        )));
    }
    if end > data_len {
        return Err(HeaderError::Truncated {
            what: format!("tensor `{name}`"),
            needed: data_start.saturating_add(end),
            actual: data_start + data_len,
        });
    }
    Ok(TensorInfo { name, dtype, shape, start, end })
}

/// Sorts by offset and requires the tensors to tile the data area exactly.
fn check_layout(tensors: &mut [TensorInfo], data_len: u64) -> Result<(), HeaderError> {
    tensors.sort_by_key(|t| (t.start, t.end));
    let mut cursor = 0u64;
    let mut prev: Option<&TensorInfo> = None;
    for t in tensors.iter() {
        if t.start < cursor {
            let other = prev.map(|p| p.name.clone()).unwrap_or_default();
            return Err(HeaderError::Overlap { tensor: t.name.clone(), other });
        }
        if t.start > cursor {
            return Err(HeaderError::BadTensor {
                tensor: t.name.clone(),
                reason: format!(
                    "{} unused bytes precede it (the data area must be contiguous)",
                    t.start - cursor
                ),
            });
        }
        cursor = t.end;
        if t.end > t.start {
            prev = Some(t);
        }
    }
    if cursor != data_len {
        return Err(HeaderError::BadHeader(format!(
            "{} bytes follow the last tensor (the header does not describe them)",
            data_len - cursor
        )));
    }
    Ok(())
}
