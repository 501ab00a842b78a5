//! A borrowed tensor: dtype, shape and raw little-endian bytes, and element reads.

use crate::dtype::DType;

/// A borrowed tensor: dtype, shape and its raw little-endian bytes.
/// Invariant (checked by every constructor in Kore):
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

impl TensorView<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Element `i` of a float tensor (F32/BF16/F16) as f32, or `None` when
    /// out of range or not one of those dtypes.
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        read_float(self.dtype, self.data, i)
    }
}

/// Reads element `i` of a float buffer of the given dtype as f32
/// (F32, BF16 and F16; `None` for other dtypes or out of range).
pub fn read_float(dtype: DType, data: &[u8], i: usize) -> Option<f32> {
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
