//! NVFP4 weight quantization in NVIDIA ModelOpt's layout and arithmetic.
//!
//! A quantized Linear `[N, K]` becomes `weight` U8 `[N, K/2]` (two E2M1 codes per
//! byte, the even column in the low nibble), `weight_scale` F8_E4M3 `[N, K/16]`
//! and `weight_scale_2` F32 scalar. Value = E2M1(code) × e4m3(block scale) ×
//! weight_scale_2.
//!
//! The recipe follows ModelOpt's `NVFP4QTensor` (dynamic weight path), in f32
//! and in the same order of operations:
//! 1. `s2 = amax(|W|) / (6 · 448)`;
//! 2. per block of 16: `s = block_amax / (6 · s2)`; `s == 0` becomes 1; `s` is
//!    clamped to `[2⁻⁹, 448]` and rounded to E4M3 (nearest, ties to even);
//! 3. `q = x / (f32(e4m3(s)) · s2)`, rounded to the nearest E2M1 value, ties to the
//!    even code (the bounds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 decide).
//!
//! One deliberate difference: for an all-zero weight (`s2 == 0`) ModelOpt divides
//! 0 by 0 and stores NaN block scales; here every code is 0, every block scale is
//! 1.0 and `s2` is 0, so the weight dequantizes to exact zeros.

use crate::error::{PackError, Result};
use crate::safetensors::DType;

/// Elements per block scale.
pub const GROUP: usize = 16;

pub use kore_pack_format::fp::{
    e2m1_code, e4m3_to_f32, f32_to_e4m3, E2M1_MAX, E2M1_VALUES, E4M3_MAX, E4M3_MIN_SUBNORMAL,
    E4M3_ONE,
};

/// One stored part of a quantized module: suffix, dtype, shape, required.
pub type StoredPart = (&'static str, DType, Vec<u64>, bool);

/// The tensors ModelOpt stores for an NVFP4 Linear `[n, k]` (module name +
/// `.` + suffix); `input_scale` is optional and unused by Kore.
pub fn stored_parts(n: u64, k: u64) -> [StoredPart; 4] {
    [
        ("weight", DType::U8, vec![n, k / 2], true),
        ("weight_scale", DType::F8E4M3, vec![n, k / GROUP as u64], true),
        ("weight_scale_2", DType::F32, vec![], true),
        ("input_scale", DType::F32, vec![], false),
    ]
}

/// A quantized Linear weight in ModelOpt's layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Weight {
    /// Rows (output features, N).
    pub rows: usize,
    /// Columns (input features, K).
    pub cols: usize,
    /// Packed codes, `[N, K/2]`.
    pub weight: Vec<u8>,
    /// E4M3 block scales, `[N, K/16]`.
    pub weight_scale: Vec<u8>,
    /// The per-tensor scale.
    pub weight_scale_2: f32,
}

/// The per-tensor scale ModelOpt derives from `amax`.
pub fn global_scale(amax: f32) -> f32 {
    amax / (E2M1_MAX * E4M3_MAX)
}

/// Quantizes a row-major `[rows, cols]` f32 weight. `name` labels errors.
pub fn quantize(name: &str, x: &[f32], rows: usize, cols: usize) -> Result<Nvfp4Weight> {
    check_shape(name, x.len(), rows, cols)?;
    let mut amax = 0.0f32;
    for (i, &v) in x.iter().enumerate() {
        if !v.is_finite() {
            return Err(PackError::Quant {
                tensor: name.to_string(),
                reason: format!(
                    "non-finite value {v} at row {}, column {}; fix the checkpoint",
                    i / cols,
                    i % cols
                ),
            });
        }
        amax = amax.max(v.abs());
    }
    let s2 = global_scale(amax);
    let mut weight = vec![0u8; x.len() / 2];
    let mut weight_scale = vec![E4M3_ONE; x.len() / GROUP];
    if s2 > 0.0 {
        for (b, block) in x.chunks_exact(GROUP).enumerate() {
            let (sb, packed) = quantize_block(block, s2);
            weight_scale[b] = sb;
            weight[b * GROUP / 2..(b + 1) * GROUP / 2].copy_from_slice(&packed);
        }
    }
    Ok(Nvfp4Weight { rows, cols, weight, weight_scale, weight_scale_2: s2 })
}

/// Quantizes one block of 16 values with global scale `s2 > 0`; returns the
/// E4M3 block scale and the 8 packed bytes.
pub fn quantize_block(block: &[f32], s2: f32) -> (u8, [u8; GROUP / 2]) {
    let bamax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut s = bamax / (E2M1_MAX * s2);
    if s == 0.0 {
        s = 1.0;
    }
    let sb = f32_to_e4m3(s.clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX));
    let d = e4m3_to_f32(sb) * s2;
    let mut packed = [0u8; GROUP / 2];
    for (i, pair) in block.chunks_exact(2).enumerate() {
        packed[i] = e2m1_code(pair[0] / d) | (e2m1_code(pair[1] / d) << 4);
    }
    (sb, packed)
}

fn check_shape(name: &str, len: usize, rows: usize, cols: usize) -> Result<()> {
    let bad = |reason: String| Err(PackError::Quant { tensor: name.to_string(), reason });
    if cols % GROUP != 0 {
        return bad(format!(
            "input dimension {cols} is not a multiple of {GROUP}; keep this tensor unquantized"
        ));
    }
    if rows.checked_mul(cols) != Some(len) {
        return bad(format!("{len} values do not form a [{rows}, {cols}] matrix"));
    }
    Ok(())
}

/// Dequantizes a whole weight to f32, row-major `[rows, cols]`.
pub fn dequantize(w: &Nvfp4Weight) -> Vec<f32> {
    let mut out = vec![0.0f32; w.rows * w.cols];
    for (b, chunk) in out.chunks_exact_mut(GROUP).enumerate() {
        dequantize_block(
            &w.weight[b * GROUP / 2..(b + 1) * GROUP / 2],
            w.weight_scale[b],
            w.weight_scale_2,
            chunk,
        );
    }
    out
}

/// Dequantizes one block: 8 packed bytes, its E4M3 scale and the global scale.
pub fn dequantize_block(packed: &[u8], scale: u8, s2: f32, out: &mut [f32]) {
    let d = e4m3_to_f32(scale) * s2;
    for (i, &byte) in packed.iter().enumerate() {
        out[2 * i] = E2M1_VALUES[(byte & 0xf) as usize] * d;
        out[2 * i + 1] = E2M1_VALUES[(byte >> 4) as usize] * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_puts_the_even_column_in_the_low_nibble() {
        let mut x = vec![0.0f32; 16];
        x[0] = 6.0; // code 7
        x[1] = -1.0; // code 0b1010
        let w = quantize("t", &x, 1, 16).unwrap();
        assert_eq!(w.weight[0], 0x07 | (0x0a << 4));
        assert_eq!(dequantize(&w)[..2], [6.0, -1.0]);
    }

    #[test]
    fn all_zero_weight_dequantizes_to_zero() {
        let w = quantize("z", &[0.0; 32], 2, 16).unwrap();
        assert_eq!(w.weight_scale_2, 0.0);
        assert!(w.weight.iter().all(|&b| b == 0));
        assert!(w.weight_scale.iter().all(|&b| b == E4M3_ONE));
        assert!(dequantize(&w).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(quantize("t", &[0.0; 24], 1, 24).is_err());
        assert!(quantize("t", &[0.0; 16], 2, 16).is_err());
        let mut x = [0.0f32; 16];
        x[3] = f32::NAN;
        let err = quantize("layer.w", &x, 1, 16).unwrap_err().to_string();
        assert!(err.contains("layer.w") && err.contains("column 3"), "{err}");
    }
}
