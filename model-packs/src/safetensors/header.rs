//! Strict safetensors header parsing: every offset is checked against the
//! file before any tensor byte is touched.

use super::Dtype;
use crate::error::{PackError, Result};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

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
    pub dtype: Dtype,
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
    /// Absolute file offset of the data area (8 + header length).
    pub data_start: u64,
    /// Tensors sorted by start offset.
    pub tensors: Vec<TensorInfo>,
    /// `__metadata__` entries, in file order.
    pub metadata: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl SafetensorsHeader {
    /// Looks a tensor up by name.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The metadata value for `key`.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Parses and validates the header of the safetensors file whose complete
/// contents are `bytes`. `file` only labels errors.
pub fn parse_header(file: &Path, bytes: &[u8], limits: HeaderLimits) -> Result<SafetensorsHeader> {
    let bad = |reason: String| PackError::BadHeader { file: file.to_path_buf(), reason };
    let total = bytes.len() as u64;
    if total < 8 {
        return Err(truncated(file, "the 8-byte header length", 8, total));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]));
    if n > limits.max_header_bytes {
        return Err(bad(format!(
            "header length {n} exceeds the {} byte limit",
            limits.max_header_bytes
        )));
    }
    let data_start = 8 + n;
    if data_start > total {
        return Err(truncated(file, "the JSON header", data_start, total));
    }
    let text = std::str::from_utf8(&bytes[8..data_start as usize])
        .map_err(|e| bad(format!("header is not UTF-8 ({e})")))?;
    if !text.starts_with('{') {
        return Err(bad("header does not start with `{`".into()));
    }
    let raw: RawHeader = serde_json::from_str(text)
        .map_err(|e| bad(format!("header is not a valid JSON object ({e})")))?;
    if let Some(name) = raw.duplicate {
        return Err(bad(format!("tensor name `{name}` appears twice")));
    }
    if raw.entries.len() > limits.max_tensors {
        return Err(bad(format!(
            "{} tensors exceed the limit of {}",
            raw.entries.len(),
            limits.max_tensors
        )));
    }
    let data_len = total - data_start;
    let mut tensors = Vec::with_capacity(raw.entries.len());
    for (name, entry) in raw.entries {
        tensors.push(validate_entry(file, name, entry, data_len, data_start, limits)?);
    }
    check_layout(file, &mut tensors, data_len)?;
    let index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
    Ok(SafetensorsHeader { data_start, tensors, metadata: raw.metadata, index })
}

fn truncated(file: &Path, what: &str, needed: u64, actual: u64) -> PackError {
    PackError::Truncated { file: file.to_path_buf(), what: what.to_string(), needed, actual }
}

fn validate_entry(
    file: &Path,
    name: String,
    entry: RawEntry,
    data_len: u64,
    data_start: u64,
    limits: HeaderLimits,
) -> Result<TensorInfo> {
    let bad = |reason: String| PackError::BadTensor {
        file: file.to_path_buf(),
        tensor: name.clone(),
        reason,
    };
    let dtype = Dtype::parse(&entry.dtype)
        .ok_or_else(|| bad(format!("unsupported dtype `{}`", entry.dtype)))?;
    if entry.shape.len() > limits.max_rank {
        return Err(bad(format!(
            "rank {} exceeds the limit of {}",
            entry.shape.len(),
            limits.max_rank
        )));
    }
    let numel = entry
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {:?} overflows", entry.shape)))?;
    let nbytes = numel
        .checked_mul(dtype.size())
        .ok_or_else(|| bad(format!("shape {:?} overflows", entry.shape)))?;
    let [start, end] = entry.data_offsets;
    if end < start {
        return Err(bad(format!("data_offsets [{start}, {end}] run backwards")));
    }
    if end - start != nbytes {
        return Err(bad(format!(
            "data_offsets [{start}, {end}] hold {} bytes but {dtype} × {:?} needs {nbytes}",
            end - start,
            entry.shape
        )));
    }
    if end > data_len {
        return Err(PackError::Truncated {
            file: file.to_path_buf(),
            what: format!("tensor `{name}`"),
            needed: data_start.saturating_add(end),
            actual: data_start + data_len,
        });
    }
    Ok(TensorInfo { name, dtype, shape: entry.shape, start, end })
}

/// Sorts by offset and requires the tensors to tile the data area exactly.
fn check_layout(file: &Path, tensors: &mut [TensorInfo], data_len: u64) -> Result<()> {
    tensors.sort_by_key(|t| (t.start, t.end));
    let mut cursor = 0u64;
    let mut prev: Option<&TensorInfo> = None;
    for t in tensors.iter() {
        if t.start < cursor {
            let other = prev.map(|p| p.name.clone()).unwrap_or_default();
            return Err(PackError::Overlap {
                file: file.to_path_buf(),
                tensor: t.name.clone(),
                other,
            });
        }
        if t.start > cursor {
            return Err(PackError::BadTensor {
                file: file.to_path_buf(),
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
        return Err(PackError::BadHeader {
            file: file.to_path_buf(),
            reason: format!(
                "{} bytes follow the last tensor (the header does not describe them)",
                data_len - cursor
            ),
        });
    }
    Ok(())
}

/// One raw header entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The header object, read in file order with duplicates detected.
#[derive(Debug, Default)]
struct RawHeader {
    entries: Vec<(String, RawEntry)>,
    metadata: Vec<(String, String)>,
    duplicate: Option<String>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(RawHeaderVisitor)
    }
}

struct RawHeaderVisitor;

impl<'de> Visitor<'de> for RawHeaderVisitor {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawHeader, A::Error> {
        let mut out = RawHeader::default();
        let mut seen = std::collections::HashSet::new();
        let mut seen_meta = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                if seen_meta {
                    return Err(de::Error::custom("`__metadata__` appears twice"));
                }
                seen_meta = true;
                let m: Option<Metadata> = map.next_value()?;
                out.metadata = m.map(|m| m.0).unwrap_or_default();
                continue;
            }
            let entry: RawEntry = map.next_value()?;
            if !seen.insert(key.clone()) && out.duplicate.is_none() {
                out.duplicate = Some(key.clone());
            }
            out.entries.push((key, entry));
        }
        Ok(out)
    }
}

/// `__metadata__`: string to string, order kept.
struct Metadata(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string-to-string map")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Metadata, A::Error> {
                let mut v = Vec::new();
                let mut seen = std::collections::HashSet::new();
                while let Some((k, val)) = map.next_entry::<String, String>()? {
                    if !seen.insert(k.clone()) {
                        return Err(de::Error::custom(format!("metadata key `{k}` appears twice")));
                    }
                    v.push((k, val));
                }
                Ok(Metadata(v))
            }
        }
        d.deserialize_map(V)
    }
}
