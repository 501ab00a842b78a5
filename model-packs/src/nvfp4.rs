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

/// Elements per block scale.
pub const GROUP: usize = 16;

/// E2M1 magnitudes of codes 0–7; bit 3 is the sign.
pub const E2M1_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Rounding bounds between consecutive E2M1 magnitudes.
const BOUNDS: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];

/// Largest finite E4M3 (`float8_e4m3fn`) value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// Smallest positive E4M3 value (a subnormal), the lower clamp for block scales.
pub const E4M3_MIN_SUBNORMAL: f32 = 1.0 / 512.0;
/// E4M3 encoding of 1.0.
pub const E4M3_ONE: u8 = 0x38;

/// Decodes an E4M3 (`float8_e4m3fn`) byte. `0x7f`/`0xff` are NaN.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0xf) as i32;
    let mant = (b & 7) as f32;
    if exp == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 { mant / 512.0 } else { (1.0 + mant / 8.0) * f32::powi(2.0, exp - 7) };
    sign * mag
}

/// Encodes `x` as E4M3, rounding to nearest with ties to even and saturating
/// at ±448 (NaN becomes `0x7f`).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal range: multiples of 2^-9 (scaling by 512 is exact).
        let n = (a * 512.0).round_ties_even() as u8; // 0..=8; 8 is the smallest normal, 0x08
        return sign | n;
    }
    let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127; // a is normal in f32 here
    let m = a / f32::powi(2.0, e); // in [1, 2), exact
    let mut mant = ((m - 1.0) * 8.0).round_ties_even() as i32; // exact scaling
    let mut exp = e + 7;
    if mant == 8 {
        mant = 0;
        exp += 1;
    }
    if exp > 15 || (exp == 15 && mant == 7) {
        return sign | 0x7e;
    }
    sign | ((exp as u8) << 3) | mant as u8
}

/// The E2M1 code of an already scaled value, exactly as ModelOpt's cast:
/// sign bit from `q < 0`, magnitude index = number of bounds below `|q|`,
/// plus one at the odd bounds 0.75, 1.75 and 3.5 (so ties go to the even code).
pub fn e2m1_code(q: f32) -> u8 {
    let sign = u8::from(q < 0.0) << 3;
    let a = q.abs();
    let ord = BOUNDS.iter().filter(|&&b| b < a).count() as u8;
    let tie_up = u8::from(a == 0.75 || a == 1.75 || a == 3.5);
    sign + ord + tie_up
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
    fn e4m3_round_trips_every_finite_code() {
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                assert!(b & 0x7f == 0x7f);
                continue;
            }
            // -0.0 encodes with the sign bit; everything else maps back to itself.
            assert_eq!(f32_to_e4m3(v), b, "code {b:#04x} value {v}");
        }
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // 1.0625 lies halfway between 1.0 (mantissa 0, even) and 1.125 (mantissa 1).
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.1875 lies halfway between 1.125 (odd) and 1.25 (even).
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        // Subnormal halfway 1.5 * 2^-9 rounds to 2 * 2^-9.
        assert_eq!(f32_to_e4m3(1.5 / 512.0), 2);
        assert_eq!(f32_to_e4m3(1000.0), 0x7e);
        assert_eq!(f32_to_e4m3(-1000.0), 0xfe);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
    }

    #[test]
    fn e2m1_ties_go_to_the_even_code() {
        let cases = [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
            (5.01, 7),
            (100.0, 7),
        ];
        for (q, code) in cases {
            assert_eq!(e2m1_code(q), code, "q = {q}");
            assert_eq!(e2m1_code(-q), code | 8, "q = -{q}");
        }
        assert_eq!(e2m1_code(0.2), 0);
        assert_eq!(e2m1_code(0.26), 1);
        assert_eq!(e2m1_code(-0.0), 0);
    }

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
