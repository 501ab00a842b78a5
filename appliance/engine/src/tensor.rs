//! Borrowed tensors: element types, a `TensorView` over raw little-endian
//! bytes, and the `TensorSource` trait through which the engine finds its
//! weights (memory-mapped Hugging Face files, model packs, or a pack already
//! in guest memory).

use alloc::string::String;

/// Element type of a stored tensor (the safetensors dtype names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary64.
    F64,
    /// FP8 E4M3 (NVFP4 block scales).
    F8E4M3,
    /// FP8 E5M2.
    F8E5M2,
    /// Unsigned bytes (packed NVFP4 codes).
    U8,
    /// Signed bytes.
    I8,
    /// 16-bit signed integers.
    I16,
    /// 16-bit unsigned integers.
    U16,
    /// 32-bit signed integers.
    I32,
    /// 32-bit unsigned integers.
    U32,
    /// 64-bit signed integers.
    I64,
    /// 64-bit unsigned integers.
    U64,
    /// Booleans, one byte each.
    Bool,
    /// A dtype this engine does not know (e.g. sub-byte types of vision
    /// towers); such tensors can be listed but not used.
    Other,
}

impl DType {
    /// Parses a safetensors dtype name; unknown names give `DType::Other`.
    pub fn from_safetensors(name: &str) -> DType {
        match name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            "F8_E4M3" => DType::F8E4M3,
            "F8_E5M2" => DType::F8E5M2,
            "U8" => DType::U8,
            "I8" => DType::I8,
            "I16" => DType::I16,
            "U16" => DType::U16,
            "I32" => DType::I32,
            "U32" => DType::U32,
            "I64" => DType::I64,
            "U64" => DType::U64,
            "BOOL" => DType::Bool,
            _ => DType::Other,
        }
    }

    /// Bytes per element, or `None` for `Other`.
    pub fn size(self) -> Option<usize> {
        Some(match self {
            DType::F8E4M3 | DType::F8E5M2 | DType::U8 | DType::I8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::Other => return None,
        })
    }

    /// The safetensors name of this dtype.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::I64 => "I64",
            DType::U64 => "U64",
            DType::Bool => "BOOL",
            DType::Other => "unknown",
        }
    }
}

/// A borrowed tensor: dtype, shape and its raw little-endian bytes.
/// Invariant (checked by every constructor in this crate): for a known dtype,
/// `data.len() == shape.iter().product() * dtype.size()`.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: &'a [usize],
    /// Raw bytes, row-major, little-endian.
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Element `i` of a float tensor (F32/BF16/F16) as f32, or `None` when
    /// out of range or not a float dtype.
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        read_float(self.dtype, self.data, i)
    }
}

/// Reads element `i` of a float buffer of the given dtype as f32.
pub(crate) fn read_float(dtype: DType, data: &[u8], i: usize) -> Option<f32> {
    match dtype {
        DType::F32 => {
            let b = data.get(i * 4..i * 4 + 4)?;
            Some(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        DType::BF16 => {
            let b = data.get(i * 2..i * 2 + 2)?;
            Some(half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        DType::F16 => {
            let b = data.get(i * 2..i * 2 + 2)?;
            Some(half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        _ => None,
    }
}

/// Where the engine gets its weights from, by canonical tensor name
/// (`model.embed_tokens.weight`, `model.layers.N.…`, `model.norm.weight`,
/// `lm_head.weight`, `mtp.…`).
pub trait TensorSource {
    /// The tensor with this canonical name, if present.
    fn tensor(&self, name: &str) -> Option<TensorView<'_>>;

    /// Human-readable location of a tensor (file name) or of the whole source
    /// when the tensor is absent, used in error messages.
    fn location(&self, name: &str) -> String;
}
