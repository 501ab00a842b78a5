//! SiLU and the floored exp over a slice on a kernel path, bit-identical to
//! the scalar `exp::silu` and `exp::expf_floored` on every path (the DeltaNet
//! conv, the gated norm and the sampler use them, so their results do not
//! depend on the path).

use super::dispatch::{self, Isa};
use crate::simd::Path;

/// `x = silu(x)` for every element, with `path`'s vectors where it has them.
///
/// # Panics
/// If `path` is not supported by this CPU.
pub fn silu_in_place(path: Path, x: &mut [f32]) {
    dispatch::silu_in_place(Isa::new(path), x);
}

/// `x = expf_floored(x)` for every element (0 below -80), with `path`'s
/// vectors where it has them.
///
/// # Panics
/// If `path` is not supported by this CPU.
pub fn exp_in_place(path: Path, x: &mut [f32]) {
    dispatch::exp_in_place(Isa::new(path), x);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exp::{expf_floored, silu};
    use alloc::vec::Vec;

    /// Inputs over the whole range the conv produces and past it: every
    /// branch of libm's `expf` (tiny, near 0.5 and 1.5 ln 2, large, beyond
    /// the safe range, NaN, infinities, -0.0, subnormals).
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = Vec::new();
        let mut s = 0x2545_f491u32;
        for i in 0..200_000u32 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let u = (s >> 8) as f32 / (1 << 24) as f32 - 0.5;
            v.push(match i % 6 {
                0 => u * 2.0,
                1 => u * 24.0,
                2 => u * 180.0,
                3 => u * 1e-3,
                4 => f32::from_bits((s & 0x807f_ffff) | (0x3e00_0000 + (s % 3) * 0x0080_0000)),
                _ => u * 3e-5,
            });
        }
        for b in [0x3eb1_7218u32, 0x3eb1_7219, 0x3f85_1592, 0x3f85_1593, 0x3900_0000, 0x3900_0001] {
            v.extend([f32::from_bits(b), -f32::from_bits(b)]);
        }
        v.extend([0.0, -0.0, 80.0, -80.0, 80.00001, 88.8, -104.0, 1e-40, -1e-40]);
        v.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE]);
        v
    }

    #[test]
    fn every_path_matches_scalar_floored_exp_bit_for_bit() {
        let mut x = inputs();
        // Softmax inputs: logits minus the largest, over the whole floor.
        x.extend((0..4000).map(|i| -(i as f32) * 0.031));
        x.extend([-80.0, -80.00001, -87.0, -103.0, -1e30]);
        let want: Vec<u32> = x.iter().map(|v| expf_floored(*v).to_bits()).collect();
        assert_eq!(expf_floored(-80.00001), 0.0);
        assert_eq!(expf_floored(-80.0), libm::expf(-80.0));
        for path in Path::ALL.into_iter().filter(|p| p.supported()) {
            for skip in [0, 3] {
                let mut got = x[skip..].to_vec();
                exp_in_place(path, &mut got);
                for (i, (g, w)) in got.iter().zip(&want[skip..]).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        *w,
                        "{}: exp({:e}) = {g:e}, scalar {:e}",
                        path.name(),
                        x[skip + i],
                        f32::from_bits(*w)
                    );
                }
            }
        }
    }

    #[test]
    fn every_path_matches_scalar_silu_bit_for_bit() {
        let x = inputs();
        let want: Vec<u32> = x.iter().map(|v| silu(*v).to_bits()).collect();
        for path in Path::ALL.into_iter().filter(|p| p.supported()) {
            // Odd offsets and lengths exercise the remainders.
            for skip in [0, 3] {
                let mut got = x[skip..].to_vec();
                silu_in_place(path, &mut got);
                for (i, (g, w)) in got.iter().zip(&want[skip..]).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        *w,
                        "{}: silu({:e}) = {g:e}, scalar {:e}",
                        path.name(),
                        x[skip + i],
                        f32::from_bits(*w)
                    );
                }
            }
        }
    }
}
