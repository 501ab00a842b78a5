//! Safetensors files on disk: mapped or hugepage-resident, read with the strict
//! parser of kore-pack-format (errors then name the file), and an aligned,
//! streaming safetensors writer. The writer pads the header
//! with spaces and fills gaps with explicit `__kore_pad_N` U8 tensors so that
//! every tensor's data starts on an `align`-byte boundary of the file while the
//! file stays loadable by the official safetensors libraries.

mod resident;
mod writer;

pub use kore_pack_format::safetensors::{
    parse_header, HeaderLimits, SafetensorsHeader, TensorIndex, TensorInfo, MAX_HEADER_BYTES,
};
pub use kore_pack_format::DType;
pub use resident::{anon_huge_bytes, mem_available, smaps_field, Residency};
pub(crate) use writer::hex as hex_digest;
pub use writer::{SafetensorsWriter, TensorSpec, PAD_PREFIX};

use crate::error::{PackError, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A borrowed view of one tensor's bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
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
pub fn to_f32(name: &str, dtype: DType, data: &[u8]) -> Result<Vec<f32>> {
    let out = match dtype {
        DType::F32 => {
            data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        }
        DType::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::F64 => data
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
    index: TensorIndex,
}

impl SafetensorsFile {
    /// Opens, maps and strictly validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let len = file_len(path)?;
        let file = File::open(path).map_err(|e| PackError::io(path, e))?;
        let map = resident::map_file(path, &file)?;
        let index = TensorIndex::parse(&map[..len]).map_err(|e| PackError::header(path, e))?;
        Ok(Self { path: path.to_path_buf(), map, len, residency: Residency::Mapped, index })
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
        self.index.header()
    }

    /// The engine's view of tensor `name`, if present.
    pub fn tensor_view(&self, name: &str) -> Option<kore_pack_format::TensorView<'_>> {
        self.index.view(self.bytes(), name)
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[..self.len]
    }

    /// A view of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let info = self.header().get(name)?;
        Some(self.view(info))
    }

    /// A view of the tensor described by `info` (which must come from this file's header).
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorRef<'a> {
        let start = (self.header().data_start + info.start) as usize;
        let end = (self.header().data_start + info.end) as usize;
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
