//! A strict, allocation-light parser of the safetensors format over a byte
//! slice (a memory-mapped file on the host, a region of guest memory in the
//! appliance). Every offset and size is checked; nothing is copied.
//!
//! Layout: an 8-byte little-endian header length `n`, `n` bytes of JSON
//! (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {…}}`),
//! then the data area that the offsets index.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::tensor::{DType, TensorView};

/// Largest header accepted (the reference implementation's limit).
const MAX_HEADER: u64 = 100 * 1024 * 1024;

/// What is wrong with a safetensors buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SafetensorsError {
    /// Shorter than the 8-byte header length.
    TooShort,
    /// The header length runs past the end of the file or over the limit.
    BadHeaderLength(u64),
    /// The header is not UTF-8 JSON of the right shape.
    BadHeader(String),
    /// One tensor's entry is malformed or points outside the data area.
    BadTensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for SafetensorsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SafetensorsError::TooShort => write!(f, "file too short for a safetensors header"),
            SafetensorsError::BadHeaderLength(n) => {
                write!(
                    f,
                    "safetensors header length {n} is larger than the file or the 100 MiB limit"
                )
            }
            SafetensorsError::BadHeader(why) => write!(f, "malformed safetensors header: {why}"),
            SafetensorsError::BadTensor { name, reason } => {
                write!(f, "malformed safetensors entry for tensor `{name}`: {reason}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SafetensorsError {}

/// One tensor's entry: dtype, shape and the byte range in the data area.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Byte range relative to the whole buffer (already offset past the header).
    pub start: usize,
    /// End of the byte range (exclusive).
    pub end: usize,
}

/// A parsed safetensors buffer borrowing its bytes.
#[derive(Debug)]
pub struct Safetensors<'a> {
    bytes: &'a [u8],
    entries: BTreeMap<String, Entry>,
}

impl<'a> Safetensors<'a> {
    /// Parses and validates the header of `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, SafetensorsError> {
        let entries = parse_header(bytes)?;
        Ok(Safetensors { bytes, entries })
    }

    /// All tensor entries by name.
    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// A view of the named tensor.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let e = self.entries.get(name)?;
        Some(view_of(self.bytes, e))
    }
}

/// The view of `e` inside `bytes` (ranges were validated at parse time).
pub fn view_of<'a>(bytes: &'a [u8], e: &'a Entry) -> TensorView<'a> {
    TensorView { dtype: e.dtype, shape: &e.shape, data: &bytes[e.start..e.end] }
}

/// Parses the header of a safetensors buffer into checked entries.
pub fn parse_header(bytes: &[u8]) -> Result<BTreeMap<String, Entry>, SafetensorsError> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .ok_or(SafetensorsError::TooShort)?
        .try_into()
        .map_err(|_| SafetensorsError::TooShort)?;
    let n = u64::from_le_bytes(len_bytes);
    let avail = (bytes.len() - 8) as u64;
    if n > MAX_HEADER || n > avail {
        return Err(SafetensorsError::BadHeaderLength(n));
    }
    let header = &bytes[8..8 + n as usize];
    let text = core::str::from_utf8(header)
        .map_err(|_| SafetensorsError::BadHeader("not UTF-8".into()))?;
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| SafetensorsError::BadHeader(e.to_string()))?;
    let obj =
        json.as_object().ok_or_else(|| SafetensorsError::BadHeader("not a JSON object".into()))?;
    let data_start = 8 + n as usize;
    let data_len = bytes.len() - data_start;
    let mut entries = BTreeMap::new();
    for (name, value) in obj {
        if name == "__metadata__" {
            continue;
        }
        let entry = parse_entry(name, value, data_start, data_len)?;
        entries.insert(name.clone(), entry);
    }
    Ok(entries)
}

fn parse_entry(
    name: &str,
    v: &serde_json::Value,
    data_start: usize,
    data_len: usize,
) -> Result<Entry, SafetensorsError> {
    let bad = |reason: &str| SafetensorsError::BadTensor {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    let obj = v.as_object().ok_or_else(|| bad("entry is not an object"))?;
    let dtype_name =
        obj.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("missing dtype"))?;
    let dtype = DType::from_safetensors(dtype_name);
    let shape_json =
        obj.get("shape").and_then(|s| s.as_array()).ok_or_else(|| bad("missing shape"))?;
    let mut shape = Vec::with_capacity(shape_json.len());
    for d in shape_json {
        let d = d.as_u64().ok_or_else(|| bad("shape entries must be non-negative integers"))?;
        shape.push(usize::try_from(d).map_err(|_| bad("dimension too large"))?);
    }
    let offs = obj
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .ok_or_else(|| bad("missing data_offsets"))?;
    if offs.len() != 2 {
        return Err(bad("data_offsets must have two entries"));
    }
    let begin = offs[0].as_u64().ok_or_else(|| bad("bad data_offsets"))?;
    let end = offs[1].as_u64().ok_or_else(|| bad("bad data_offsets"))?;
    if begin > end || end > data_len as u64 {
        return Err(bad("data_offsets outside the data area"));
    }
    let nbytes = (end - begin) as usize;
    if let Some(size) = dtype.size() {
        let numel = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad("shape overflows"))?;
        let want = numel.checked_mul(size).ok_or_else(|| bad("shape overflows"))?;
        if want != nbytes {
            return Err(bad("byte length does not match dtype and shape"));
        }
    }
    Ok(Entry { dtype, shape, start: data_start + begin as usize, end: data_start + end as usize })
}

impl crate::tensor::TensorSource for Safetensors<'_> {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.get(name)
    }

    fn location(&self, _name: &str) -> String {
        "safetensors buffer".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn parses_a_tensor() {
        let f = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}"#,
            &[0, 0, 128, 63, 0, 0, 0, 64],
        );
        let st = Safetensors::parse(&f).unwrap();
        let t = st.get("a").unwrap();
        assert_eq!(t.shape, &[2]);
        assert_eq!(t.get_f32(1), Some(2.0));
        assert_eq!(t.get_f32(2), None);
    }

    #[test]
    fn rejects_bad_inputs() {
        assert_eq!(Safetensors::parse(&[1, 2, 3]).unwrap_err(), SafetensorsError::TooShort);
        let mut f = file("{}", &[]);
        f[0] = 200;
        assert!(matches!(Safetensors::parse(&f), Err(SafetensorsError::BadHeaderLength(200))));
        let f = file("[1]", &[]);
        assert!(matches!(Safetensors::parse(&f), Err(SafetensorsError::BadHeader(_))));
        let f = file(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &[0; 8]);
        assert!(matches!(Safetensors::parse(&f), Err(SafetensorsError::BadTensor { .. })));
        let f = file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}"#, &[0; 8]);
        assert!(matches!(Safetensors::parse(&f), Err(SafetensorsError::BadTensor { .. })));
        let f = file(r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#, &[0; 8]);
        assert!(matches!(Safetensors::parse(&f), Err(SafetensorsError::BadTensor { .. })));
        let f = file(
            r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        assert!(matches!(Safetensors::parse(&f), Err(SafetensorsError::BadTensor { .. })));
        let _ = vec![0u8];
    }
}
