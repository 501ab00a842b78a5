//! The small float formats of NVFP4 weights: FP4 E2M1 codes (the values) and
//! FP8 E4M3 (`float8_e4m3fn`, the block scales), decoded and encoded exactly as
//! NVIDIA ModelOpt does. The one home of these tables: the engine, the SIMD
//! kernels and the pack tools import them from here.

/// E2M1 value of each 4-bit code (bit 3 is the sign; `-0.0` for code 8).
pub const E2M1_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Twice each E2M1 value, as integers (code order as [`E2M1_VALUES`]): every
/// E2M1 value times 2 is an integer in -12..=12, so int8 kernels multiply
/// these exactly and halve the activation scale instead.
pub const E2M1_DOUBLED: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (E2M1_VALUES[i] * 2.0) as i8;
        i += 1;
    }
    t
};

/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Rounding bounds between consecutive E2M1 magnitudes.
const E2M1_BOUNDS: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];

/// Largest finite E4M3 (`float8_e4m3fn`) value.
pub const E4M3_MAX: f32 = 448.0;
/// Smallest positive E4M3 value (a subnormal), the lower clamp for block scales.
pub const E4M3_MIN_SUBNORMAL: f32 = 1.0 / 512.0;
/// E4M3 encoding of 1.0.
pub const E4M3_ONE: u8 = 0x38;

/// Decodes one E2M1 code (the low 4 bits of `code`).
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_VALUES[(code & 0x0F) as usize]
}

/// The E2M1 code of an already scaled value, exactly as ModelOpt's cast:
/// sign bit from `q < 0`, magnitude index = number of bounds below `|q|`,
/// plus one at the odd bounds 0.75, 1.75 and 3.5 (so ties go to the even code).
pub fn e2m1_code(q: f32) -> u8 {
    let sign = u8::from(q < 0.0) << 3;
    let a = libm::fabsf(q);
    let ord = E2M1_BOUNDS.iter().filter(|&&b| b < a).count() as u8;
    let tie_up = u8::from(a == 0.75 || a == 1.75 || a == 3.5);
    sign + ord + tie_up
}

/// Decodes an E4M3 (`float8_e4m3fn`: no infinities, `0x7f`/`0xff` are NaN) byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let mant = (b & 0x07) as f32;
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * mant * libm::ldexpf(1.0, -9)
    } else {
        sign * (1.0 + mant / 8.0) * libm::ldexpf(1.0, exp - 7)
    }
}

/// Encodes `x` as E4M3, rounding to nearest with ties to even and saturating
/// at ±448 (NaN becomes `0x7f`).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = libm::fabsf(x);
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal range: multiples of 2^-9 (scaling by 512 is exact); rintf ties to even.
        let n = libm::rintf(a * 512.0) as u8; // 0..=8; 8 is the smallest normal, 0x08
        return sign | n;
    }
    let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127; // a is normal in f32 here
    let m = a / libm::ldexpf(1.0, e); // in [1, 2), exact
    let mut mant = libm::rintf((m - 1.0) * 8.0) as i32; // exact scaling, ties to even
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_table_is_the_ocp_spec() {
        // OCP MX spec, FP4 E2M1: exponent bias 1, one mantissa bit, no inf/NaN.
        for code in 0u8..16 {
            let (s, e, m) = (code >> 3, (code >> 1) & 3, code & 1);
            let mag = if e == 0 {
                0.5 * m as f32
            } else {
                (1.0 + 0.5 * m as f32) * (1 << (e - 1)) as f32
            };
            let want = if s == 1 { -mag } else { mag };
            assert_eq!(e2m1_to_f32(code).to_bits(), want.to_bits(), "code {code}");
        }
        assert_eq!(E2M1_VALUES[7], E2M1_MAX);
    }

    #[test]
    fn doubled_e2m1_is_twice_the_values() {
        for code in 0..16 {
            assert_eq!(f32::from(E2M1_DOUBLED[code]), 2.0 * E2M1_VALUES[code], "code {code}");
        }
        assert_eq!(E2M1_DOUBLED[7], 12);
        assert_eq!(E2M1_DOUBLED[15], -12);
    }

    #[test]
    fn e4m3_matches_known_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(E4M3_ONE), 1.0); // e=7, m=0
        assert_eq!(e4m3_to_f32(0x7E), E4M3_MAX); // largest finite
        assert_eq!(e4m3_to_f32(0x01), E4M3_MIN_SUBNORMAL); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0); // smallest normal
        assert_eq!(e4m3_to_f32(0xC0), -2.0);
        assert!(e4m3_to_f32(0x7F).is_nan());
        assert!(e4m3_to_f32(0xFF).is_nan());
    }

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
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    }

    #[test]
    fn e2m1_ties_go_to_the_even_code() {
        let cases =
            [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (5.01, 7)];
        for (q, code) in cases {
            assert_eq!(e2m1_code(q), code, "q = {q}");
            assert_eq!(e2m1_code(-q), code | 8, "q = -{q}");
        }
        assert_eq!(e2m1_code(100.0), 7);
        assert_eq!(e2m1_code(0.2), 0);
        assert_eq!(e2m1_code(0.26), 1);
        assert_eq!(e2m1_code(-0.0), 0);
    }
}
