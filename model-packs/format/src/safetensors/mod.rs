//! The one strict safetensors reader of Kore, over a byte slice (a memory-mapped
//! file on the host, a region of guest memory in the appliance); nothing is copied.
//!
//! Layout: an 8-byte little-endian header length `n`, `n` bytes of JSON
//! (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {…}}`),
//! then the data area the offsets index. The reader rejects everything the format
//! forbids: truncation, offsets that lie, overlap, gaps, trailing bytes, sizes that
//! disagree with dtype × shape, unknown dtypes, duplicate names.

mod header;
mod raw;
#[cfg(test)]
mod tests;

use alloc::string::String;
use alloc::vec::Vec;

use crate::view::TensorView;
pub use header::{parse_header, HeaderLimits, SafetensorsHeader, TensorInfo, MAX_HEADER_BYTES};

/// Name prefix of the U8 padding tensors Kore's writer puts between tensors to
/// align their data; readers skip them.
pub const PAD_PREFIX: &str = "__kore_pad_";

/// What is wrong with a safetensors buffer (the caller adds the file name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The buffer ends before the data its header promises.
    #[error(
        "truncated: {what} needs {needed} bytes but the file has {actual}; re-copy or re-create it"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Bytes required.
        needed: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The header is malformed (bad length, bad JSON, duplicate names...).
    #[error("bad safetensors header: {0}")]
    BadHeader(String),
    /// One tensor entry is inconsistent.
    #[error("tensor `{tensor}`: {reason}")]
    BadTensor {
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// Two tensors claim the same bytes.
    #[error("tensors `{tensor}` and `{other}` overlap in the data area (header offsets lie)")]
    Overlap {
        /// One tensor.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
    },
}

/// A validated header with each tensor's shape as `usize`: what a view needs,
/// kept apart from the bytes so an owner of a memory map can hold it.
#[derive(Debug, Clone)]
pub struct TensorIndex {
    header: SafetensorsHeader,
    /// Each tensor's shape as `usize`, parallel to `header.tensors`.
    dims: Vec<Vec<usize>>,
}

impl TensorIndex {
    /// Parses and strictly validates the buffer `bytes` with the default limits.
    pub fn parse(bytes: &[u8]) -> Result<Self, HeaderError> {
        Ok(Self::new(parse_header(bytes, HeaderLimits::default())?))
    }

    /// Indexes an already validated header.
    pub fn new(header: SafetensorsHeader) -> Self {
        // The parser checked that every tensor's byte size fits usize, so each dimension does.
        let dims =
            header.tensors.iter().map(|t| t.shape.iter().map(|&d| d as usize).collect()).collect();
        TensorIndex { header, dims }
    }

    /// The validated header.
    pub fn header(&self) -> &SafetensorsHeader {
        &self.header
    }

    /// Tensor names, in file (offset) order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.header.tensors.iter().map(|t| t.name.as_str())
    }

    /// A view of tensor `name` inside `bytes`, the buffer this index was parsed
    /// from (`None` when absent, or when `bytes` is too short to be that buffer).
    pub fn view<'a>(&'a self, bytes: &'a [u8], name: &str) -> Option<TensorView<'a>> {
        let i = self.header.position(name)?;
        let t = &self.header.tensors[i];
        let start = usize::try_from(self.header.data_start + t.start).ok()?;
        let end = usize::try_from(self.header.data_start + t.end).ok()?;
        Some(TensorView { dtype: t.dtype, shape: &self.dims[i], data: bytes.get(start..end)? })
    }
}

/// A validated safetensors buffer, borrowed: zero-copy views of its tensors.
#[derive(Debug)]
pub struct Safetensors<'a> {
    bytes: &'a [u8],
    index: TensorIndex,
}

impl<'a> Safetensors<'a> {
    /// Parses and strictly validates `bytes` with the default limits.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, HeaderError> {
        Ok(Safetensors { bytes, index: TensorIndex::parse(bytes)? })
    }

    /// The validated header.
    pub fn header(&self) -> &SafetensorsHeader {
        self.index.header()
    }

    /// The whole buffer.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Tensor names, in file (offset) order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.names()
    }

    /// A view of the named tensor.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.index.view(self.bytes, name)
    }
}
