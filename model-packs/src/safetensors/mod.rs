//! A strict safetensors reader and an aligned, streaming safetensors writer.
//!
//! The layout is the standard one (8-byte little-endian header length, a JSON
//! header, then the data area, offsets relative to the data area). The reader
//! rejects everything the format forbids — truncation, offsets that lie, overlap,
//! gaps, trailing bytes, sizes that disagree with dtype × shape, duplicate names —
//! with a typed error naming the file and the tensor. The writer pads the header
//! with spaces and fills gaps with explicit `__kore_pad_N` U8 tensors so that
//! every tensor's data starts on an `align`-byte boundary of the file while the
//! file stays loadable by the official safetensors libraries.

mod header;
mod resident;
mod writer;

pub use header::{parse_header, HeaderLimits, SafetensorsHeader, TensorInfo, MAX_HEADER_BYTES};
pub use resident::{anon_huge_bytes, Residency};
pub(crate) use writer::hex as hex_digest;
pub use writer::{SafetensorsWriter, TensorSpec, PAD_PREFIX};

use crate::error::{PackError, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Element types a safetensors header can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean, one byte.
    Bool,
    /// Unsigned byte (NVFP4 packed codes use this).
    U8,
    /// Signed byte.
    I8,
    /// FP8 E5M2.
    F8E5M2,
    /// FP8 E4M3 (`float8_e4m3fn`; NVFP4 block scales).
    F8E4M3,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single.
    F32,
    /// IEEE double.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// Parses the header spelling (`"BF16"`, `"F8_E4M3"`...).
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E4M3" => Dtype::F8E4M3,
            "I16" => Dtype::I16,
            "U16" => Dtype::U16,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "I32" => Dtype::I32,
            "U32" => Dtype::U32,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            "I64" => Dtype::I64,
            "U64" => Dtype::U64,
            _ => return None,
        })
    }

    /// The header spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E5M2 | Dtype::F8E4M3 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// True for the floating-point types a model's plain weights may use.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A borrowed view of one tensor's bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major).
    pub shape: &'a [u64],
    /// The raw little-endian bytes, exactly `numel × dtype.size()` long.
    pub data: &'a [u8],
}

impl TensorRef<'_> {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Converts a float tensor to f32 values (exact for F16/BF16/F32).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        to_f32(self.name, self.dtype, self.data)
    }
}

/// Converts little-endian float bytes of `dtype` to f32.
pub fn to_f32(name: &str, dtype: Dtype, data: &[u8]) -> Result<Vec<f32>> {
    let out = match dtype {
        Dtype::F32 => {
            data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        }
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F64 => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        other => {
            return Err(PackError::Quant {
                tensor: name.to_string(),
                reason: format!("dtype {other} is not a floating-point weight type"),
            })
        }
    };
    Ok(out)
}

/// A safetensors file whose header passed strict validation, mapped or copied
/// into hugepage-backed memory ([`SafetensorsFile::open_resident`]).
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// The file's length (a resident copy's mapping is longer, padded to 2 MiB).
    len: usize,
    residency: Residency,
    header: SafetensorsHeader,
}

impl SafetensorsFile {
    /// Opens, maps and strictly validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let len = file_len(path)?;
        let file = File::open(path).map_err(|e| PackError::io(path, e))?;
        let map = resident::map_file(path, &file)?;
        let header = parse_header(path, &map[..len], HeaderLimits::default())?;
        Ok(Self { path: path.to_path_buf(), map, len, residency: Residency::Mapped, header })
    }

    /// Opens and strictly validates `path` as [`SafetensorsFile::open`], then
    /// copies it into hugepage-backed memory ([`SafetensorsFile::into_resident`]).
    pub fn open_resident(path: &Path, progress: &dyn crate::progress::Progress) -> Result<Self> {
        Self::open(path)?.into_resident(progress)
    }

    /// This file's bytes copied into hugepage-backed memory (see [`Residency`]),
    /// after validation, so a bad file is rejected before anything is copied;
    /// `progress` sees the copy.
    pub fn into_resident(self, progress: &dyn crate::progress::Progress) -> Result<Self> {
        let (map, residency) = resident::load(&self.path, self.len as u64, progress)?;
        Ok(Self { map, residency, ..self })
    }

    /// Where the bytes live.
    pub fn residency(&self) -> Residency {
        self.residency
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated header.
    pub fn header(&self) -> &SafetensorsHeader {
        &self.header
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[..self.len]
    }

    /// A view of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let info = self.header.get(name)?;
        Some(self.view(info))
    }

    /// A view of the tensor described by `info` (which must come from this file's header).
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorRef<'a> {
        let start = (self.header.data_start + info.start) as usize;
        let end = (self.header.data_start + info.end) as usize;
        TensorRef {
            name: &info.name,
            dtype: info.dtype,
            shape: &info.shape,
            data: &self.bytes()[start..end],
        }
    }
}

/// The length of `path`, which must hold at least the 8-byte header length.
fn file_len(path: &Path) -> Result<usize> {
    let len = std::fs::metadata(path).map_err(|e| PackError::io(path, e))?.len();
    if len < 8 {
        return Err(PackError::Truncated {
            file: path.to_path_buf(),
            what: "the 8-byte header length".into(),
            needed: 8,
            actual: len,
        });
    }
    Ok(len as usize)
}
