//! Weight types borrowed in place from a `TensorSource`: `Linear` (dense
//! F32/BF16/F16, or NVFP4 in NVIDIA ModelOpt layout) and small f32 vectors
//! (norms, gates, conv taps) that are converted once at load.
//!
//! NVFP4 (ModelOpt): `weight` U8 [N, K/2] with the even column in the low
//! nibble, `weight_scale` F8_E4M3 [N, K/16], `weight_scale_2` F32 scalar;
//! value = e2m1(code) * e4m3(block scale) * scale_2.
//!
//! Q8 (`pack --head q8`): `weight` I8 [N, K], `weight_scale` F16 [N, K/32];
//! value = int8 * f16(block scale).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::tensor::{read_float, DType, TensorSource, TensorView};

/// What is wrong with one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightErrorKind {
    /// The tensor is absent.
    Missing,
    /// The tensor has the wrong shape.
    Shape {
        /// What the config implies.
        expected: Vec<usize>,
        /// What the file holds.
        found: Vec<usize>,
    },
    /// The tensor has a dtype the engine cannot use here.
    DType {
        /// Accepted dtypes.
        expected: &'static str,
        /// What the file holds.
        found: DType,
    },
}

/// A tensor the model needs is missing or unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightError {
    /// Canonical tensor name.
    pub tensor: String,
    /// File (or source) it was looked up in.
    pub location: String,
    /// What is wrong.
    pub kind: WeightErrorKind,
}

impl fmt::Display for WeightError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (t, l) = (&self.tensor, &self.location);
        match &self.kind {
            WeightErrorKind::Missing => write!(f, "tensor `{t}` is missing from {l}"),
            WeightErrorKind::Shape { expected, found } => {
                write!(
                    f,
                    "tensor `{t}` in {l} has shape {found:?}, but the config implies {expected:?}"
                )
            }
            WeightErrorKind::DType { expected, found } => {
                write!(f, "tensor `{t}` in {l} has dtype {}, expected {expected}", found.name())
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for WeightError {}

/// A linear layer's weight `W [rows = out features, cols = in features]`,
/// borrowed from the source. `y = W x`.
#[derive(Clone, Copy, Debug)]
pub enum Linear<'a> {
    /// Dense row-major F32, BF16 or F16.
    Dense {
        /// F32, BF16 or F16.
        dtype: DType,
        /// rows * cols elements.
        data: &'a [u8],
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
    },
    /// NVFP4, ModelOpt layout.
    Nvfp4 {
        /// [rows, cols/2] packed E2M1 codes, even column in the low nibble.
        packed: &'a [u8],
        /// [rows, cols/16] E4M3 block scales.
        scales: &'a [u8],
        /// The per-tensor `weight_scale_2`.
        global_scale: f32,
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 16).
        cols: usize,
    },
    /// int8 with one F16 scale per [`Q8_GROUP`] columns (output heads).
    Q8 {
        /// [rows, cols] int8 values.
        data: &'a [u8],
        /// [rows, cols / Q8_GROUP] F16 block scales, little-endian.
        scales: &'a [u8],
        /// Output features.
        rows: usize,
        /// Input features (a multiple of [`Q8_GROUP`]).
        cols: usize,
    },
}

/// Columns per F16 scale of a [`Linear::Q8`] weight.
pub const Q8_GROUP: usize = 32;

/// Block `b`'s scale of a Q8 row (`scales` = F16 little-endian bytes).
#[inline]
pub(crate) fn q8_scale(scales: &[u8], b: usize) -> f32 {
    half::f16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]).to_f32()
}

/// The FP4/FP8 decoders live with the formats; re-exported for the kernels.
pub use kore_pack_format::fp::{e2m1_to_f32, e4m3_to_f32};

/// Every E4M3 byte decoded by the bit trick the SIMD kernels use (checked
/// against [`e4m3_to_f32`] in the tests).
#[cfg(test)]
static E4M3_TABLE: [f32; 256] = e4m3_table();

/// E4M3 by moving exponent and mantissa into f32 bit positions and scaling by
/// 2^120 (exact for normals and subnormals alike).
#[cfg(test)]
const fn e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        let bits = ((b as u32 & 0x7F) << 20) | ((b as u32 & 0x80) << 24);
        t[b] = if b & 0x7F == 0x7F {
            f32::NAN
        } else {
            f32::from_bits(bits) * f32::from_bits(0x7B80_0000)
        };
        b += 1;
    }
    t
}

impl<'a> Linear<'a> {
    /// Output features.
    pub fn rows(&self) -> usize {
        match *self {
            Linear::Dense { rows, .. } | Linear::Nvfp4 { rows, .. } | Linear::Q8 { rows, .. } => {
                rows
            }
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match *self {
            Linear::Dense { cols, .. } | Linear::Nvfp4 { cols, .. } | Linear::Q8 { cols, .. } => {
                cols
            }
        }
    }

    /// Bytes of weight data read for one full pass over this matrix.
    pub fn weight_bytes(&self) -> usize {
        match *self {
            Linear::Dense { data, .. } => data.len(),
            Linear::Nvfp4 { packed, scales, .. } => packed.len() + scales.len(),
            Linear::Q8 { data, scales, .. } => data.len() + scales.len(),
        }
    }

    /// The first `k` rows (all of them when `k` is 0 or at least `rows`),
    /// borrowed: a draft head over the most frequent token ids.
    pub fn first_rows(&self, k: usize) -> Linear<'a> {
        if k == 0 || k >= self.rows() {
            return *self;
        }
        match *self {
            Linear::Dense { dtype, data, cols, .. } => {
                let es = dtype.size();
                Linear::Dense { dtype, data: &data[..k * cols * es], rows: k, cols }
            }
            Linear::Nvfp4 { packed, scales, global_scale, cols, .. } => Linear::Nvfp4 {
                packed: &packed[..k * cols / 2],
                scales: &scales[..k * cols / 16],
                global_scale,
                rows: k,
                cols,
            },
            Linear::Q8 { data, scales, cols, .. } => Linear::Q8 {
                data: &data[..k * cols],
                scales: &scales[..k * cols / Q8_GROUP * 2],
                rows: k,
                cols,
            },
        }
    }

    /// Writes row `r` as f32 into `out[..cols]`.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        match *self {
            Linear::Dense { dtype, data, cols, .. } => {
                let es = dtype.size();
                let row = &data[r * cols * es..(r + 1) * cols * es];
                decode_dense(dtype, row, &mut out[..cols]);
            }
            Linear::Nvfp4 { packed, scales, global_scale, cols, .. } => {
                let row = &packed[r * cols / 2..(r + 1) * cols / 2];
                let sc = &scales[r * cols / 16..(r + 1) * cols / 16];
                for (g, (bytes, o)) in
                    row.chunks_exact(8).zip(out[..cols].chunks_exact_mut(16)).enumerate()
                {
                    let s = e4m3_to_f32(sc[g]) * global_scale;
                    for (i, &b) in bytes.iter().enumerate() {
                        o[2 * i] = e2m1_to_f32(b & 0x0F) * s;
                        o[2 * i + 1] = e2m1_to_f32(b >> 4) * s;
                    }
                }
            }
            Linear::Q8 { data, scales, cols, .. } => {
                let row = &data[r * cols..(r + 1) * cols];
                let sc = &scales[r * cols / Q8_GROUP * 2..(r + 1) * cols / Q8_GROUP * 2];
                let blocks = row.chunks_exact(Q8_GROUP).zip(out[..cols].chunks_exact_mut(Q8_GROUP));
                for (b, (q, o)) in blocks.enumerate() {
                    let s = q8_scale(sc, b);
                    for (v, &c) in o.iter_mut().zip(q) {
                        *v = f32::from(c as i8) * s;
                    }
                }
            }
        }
    }
}

/// Converts a dense float buffer to f32 (`out.len()` elements).
pub(crate) fn decode_dense(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => out.fill(f32::NAN),
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::BF16 | DType::F16)
}

/// Looks tensors up in a source with shape and dtype checks.
pub struct WeightLoader<'a, S: ?Sized> {
    src: &'a S,
}

impl<'a, S: TensorSource + ?Sized> WeightLoader<'a, S> {
    /// A loader over `src`.
    pub fn new(src: &'a S) -> Self {
        WeightLoader { src }
    }

    fn err(&self, name: &str, kind: WeightErrorKind) -> WeightError {
        WeightError { tensor: name.to_string(), location: self.src.location(name), kind }
    }

    /// Whether the source has this tensor.
    pub fn has(&self, name: &str) -> bool {
        self.src.tensor(name).is_some()
    }

    /// The tensor, or a `Missing` error.
    pub fn get(&self, name: &str) -> Result<TensorView<'a>, WeightError> {
        self.src.tensor(name).ok_or_else(|| self.err(name, WeightErrorKind::Missing))
    }

    fn get_shaped(&self, name: &str, shape: &[usize]) -> Result<TensorView<'a>, WeightError> {
        let t = self.get(name)?;
        if t.shape != shape {
            let kind = WeightErrorKind::Shape { expected: shape.to_vec(), found: t.shape.to_vec() };
            return Err(self.err(name, kind));
        }
        Ok(t)
    }

    fn float(&self, name: &str, t: &TensorView<'a>) -> Result<(), WeightError> {
        if is_float(t.dtype) {
            Ok(())
        } else {
            Err(self
                .err(name, WeightErrorKind::DType { expected: "F32, BF16 or F16", found: t.dtype }))
        }
    }

    /// A float vector of `len` elements, converted to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, WeightError> {
        let t = self.get_shaped(name, &[len])?;
        self.float(name, &t)?;
        Ok((0..len).map(|i| read_float(t.dtype, t.data, i).unwrap_or(f32::NAN)).collect())
    }

    /// Depthwise conv taps `[channels, 1, k]` (or `[channels, k]`) as f32.
    pub fn conv(&self, name: &str, channels: usize, k: usize) -> Result<Vec<f32>, WeightError> {
        let t = self.get(name)?;
        if t.shape != [channels, 1, k] && t.shape != [channels, k] {
            let kind = WeightErrorKind::Shape {
                expected: alloc::vec![channels, 1, k],
                found: t.shape.to_vec(),
            };
            return Err(self.err(name, kind));
        }
        self.float(name, &t)?;
        Ok((0..channels * k).map(|i| read_float(t.dtype, t.data, i).unwrap_or(f32::NAN)).collect())
    }

    /// A dense float matrix `[rows, cols]` (embeddings), borrowed.
    pub fn dense(&self, name: &str, rows: usize, cols: usize) -> Result<Linear<'a>, WeightError> {
        let t = self.get_shaped(name, &[rows, cols])?;
        self.float(name, &t)?;
        Ok(Linear::Dense { dtype: t.dtype, data: t.data, rows, cols })
    }

    /// `n` dense float matrices `[rows, cols]` stacked in one tensor
    /// `[n, rows, cols]` (transformers' fused MoE experts), borrowed.
    pub fn stacked(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Linear<'a>>, WeightError> {
        let t = self.get_shaped(name, &[n, rows, cols])?;
        self.float(name, &t)?;
        let each = rows * cols * t.dtype.size();
        Ok(t.data
            .chunks_exact(each.max(1))
            .take(n)
            .map(|data| Linear::Dense { dtype: t.dtype, data, rows, cols })
            .collect())
    }

    /// The Linear `<prefix>.weight` of shape `[rows, cols]`: dense, or NVFP4
    /// when the weight is U8 with `weight_scale` / `weight_scale_2` beside it.
    pub fn linear(
        &self,
        prefix: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Linear<'a>, WeightError> {
        let wname = format!("{prefix}.weight");
        let w = self.get(&wname)?;
        if w.dtype == DType::I8 {
            return self.q8(prefix, rows, cols);
        }
        if w.dtype != DType::U8 {
            return self.dense(&wname, rows, cols);
        }
        if cols % 16 != 0 {
            let kind = WeightErrorKind::Shape {
                expected: alloc::vec![rows, cols],
                found: w.shape.to_vec(),
            };
            return Err(self.err(&wname, kind));
        }
        let packed = self.get_shaped(&wname, &[rows, cols / 2])?;
        let sname = format!("{prefix}.weight_scale");
        let scales = self.get_shaped(&sname, &[rows, cols / 16])?;
        if scales.dtype != DType::F8E4M3 {
            return Err(self
                .err(&sname, WeightErrorKind::DType { expected: "F8_E4M3", found: scales.dtype }));
        }
        let gname = format!("{prefix}.weight_scale_2");
        let g = self.get(&gname)?;
        if g.numel() != 1 {
            let kind = WeightErrorKind::Shape { expected: alloc::vec![], found: g.shape.to_vec() };
            return Err(self.err(&gname, kind));
        }
        if g.dtype != DType::F32 {
            return Err(
                self.err(&gname, WeightErrorKind::DType { expected: "F32", found: g.dtype })
            );
        }
        let global_scale = read_float(DType::F32, g.data, 0).unwrap_or(f32::NAN);
        Ok(Linear::Nvfp4 { packed: packed.data, scales: scales.data, global_scale, rows, cols })
    }

    /// The Q8 Linear `<prefix>.weight` (I8 `[rows, cols]`) with its F16
    /// `weight_scale` `[rows, cols / Q8_GROUP]`.
    fn q8(&self, prefix: &str, rows: usize, cols: usize) -> Result<Linear<'a>, WeightError> {
        let wname = format!("{prefix}.weight");
        if cols % Q8_GROUP != 0 {
            let found = self.get(&wname)?.shape.to_vec();
            return Err(self
                .err(&wname, WeightErrorKind::Shape { expected: alloc::vec![rows, cols], found }));
        }
        let data = self.get_shaped(&wname, &[rows, cols])?;
        let sname = format!("{prefix}.weight_scale");
        let scales = self.get_shaped(&sname, &[rows, cols / Q8_GROUP])?;
        if scales.dtype != DType::F16 {
            return Err(
                self.err(&sname, WeightErrorKind::DType { expected: "F16", found: scales.dtype })
            );
        }
        Ok(Linear::Q8 { data: data.data, scales: scales.data, rows, cols })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_table_matches_decoder() {
        for b in 0..=255u8 {
            let (t, d) = (E4M3_TABLE[b as usize], e4m3_to_f32(b));
            assert!(t.to_bits() == d.to_bits() || (t.is_nan() && d.is_nan()), "byte {b:#x}");
        }
    }
}
