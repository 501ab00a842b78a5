//! Small element-wise and per-row operations of the Qwen3.5 model, in f32.
//!
//! [`exp`] (from [`crate::exp`]) is the engine's one `e^x`: the attention
//! kernels (`kernels::attn`) run the same algorithm on whole slices with
//! AVX2 and AVX-512 ([`silu_mul`], [`sigmoid_in_place`], [`softmax`]). The
//! scalar [`silu`] and [`sigmoid`] keep `libm::expf`; `kernels::silu_in_place`
//! runs that same `expf` on vectors, bit for bit (the DeltaNet conv and
//! output gate). The slice operations take the kernel path of the model
//! that runs them.

pub use crate::exp::{exp, silu};
use crate::kernels::{attn::exp_shift_sum, silu_in_place};
use crate::simd::Path;

/// Logistic sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + libm::expf(-x))
}

/// `g = silu(g) * u` elementwise, with `path`'s vectorised exp (the SwiGLU
/// of an MLP).
pub fn silu_mul(path: Path, g: &mut [f32], u: &[f32]) {
    for (gc, uc) in g.chunks_mut(256).zip(u.chunks(256)) {
        let mut e = [0.0f32; 256];
        let e = &mut e[..gc.len()];
        e.iter_mut().zip(gc.iter()).for_each(|(e, x)| *e = -x);
        exp_shift_sum(path, e, 0.0);
        for ((x, e), u) in gc.iter_mut().zip(e.iter()).zip(uc) {
            *x = *x / (1.0 + e) * u;
        }
    }
}

/// `x = sigmoid(x)` elementwise, with `path`'s vectorised exp.
pub fn sigmoid_in_place(path: Path, x: &mut [f32]) {
    for c in x.chunks_mut(256) {
        c.iter_mut().for_each(|v| *v = -*v);
        exp_shift_sum(path, c, 0.0);
        c.iter_mut().for_each(|v| *v = 1.0 / (1.0 + *v));
    }
}

/// Softplus as torch computes it (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::log1pf(libm::expf(x))
    }
}

/// `1 / sqrt(mean(x^2) + eps)`.
pub fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / libm::sqrtf(ss / x.len() as f32 + eps)
}

/// Qwen3.5's zero-centred RMSNorm in place: `x * rsqrt(mean(x^2)+eps) * (1 + w)`.
pub fn rms_norm_1p(x: &mut [f32], w: &[f32], eps: f32) {
    let s = inv_rms(x, eps);
    for (v, w) in x.iter_mut().zip(w) {
        *v = *v * s * (1.0 + w);
    }
}

/// [`rms_norm_1p`] applied to each `w.len()`-wide row of `x`.
pub fn rms_norm_1p_rows(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        rms_norm_1p(row, w, eps);
    }
}

/// The DeltaNet output norm in place: `w * rmsnorm(x) * silu(z)` (plain
/// `w`), the SiLU on `path`'s vectors (bit for bit the scalar [`silu`]).
pub fn rms_norm_gated(path: Path, x: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let s = inv_rms(x, eps);
    for ((xc, zc), wc) in x.chunks_mut(256).zip(z.chunks(256)).zip(w.chunks(256)) {
        let mut g = [0.0f32; 256];
        let g = &mut g[..zc.len()];
        g.copy_from_slice(zc);
        silu_in_place(path, g);
        for ((v, w), g) in xc.iter_mut().zip(wc).zip(g.iter()) {
            *v = w * (*v * s) * g;
        }
    }
}

/// L2-normalises `x` in place: `x / sqrt(sum(x^2) + eps)`.
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let s = 1.0 / libm::sqrtf(ss + eps);
    for v in x {
        *v *= s;
    }
}

/// Softmax in place (numerically stable), with `path`'s exp.
pub fn softmax(path: Path, x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_shift_sum(path, x, max);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Rotary position embedding, rotate-half convention, on the first
/// `2 * inv_freq.len()` dims of `x` (the rest pass through).
pub fn rope(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    let p = pos as f32;
    for (i, f) in inv_freq.iter().enumerate() {
        let angle = p * f;
        let (s, c) = (libm::sinf(angle), libm::cosf(angle));
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/// RoPE inverse frequencies for `rotary_dim` dims: `1 / theta^(2i / rotary_dim)`.
pub fn rope_inv_freq(theta: f64, rotary_dim: usize) -> alloc::vec::Vec<f32> {
    (0..rotary_dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / rotary_dim as f32;
            (1.0 / libm::pow(theta, e as f64)) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gated_norm_equals_the_scalar_formula_bit_for_bit() {
        // 300 values: a full 256-value run and a partial one, gates from -90 to 90.
        let z: alloc::vec::Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.6).collect();
        let x0: alloc::vec::Vec<f32> =
            (0..300).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let w: alloc::vec::Vec<f32> = (0..300).map(|i| 0.5 + (i % 7) as f32 / 8.0).collect();
        let s = inv_rms(&x0, 1e-6);
        for path in Path::ALL.into_iter().filter(|p| p.supported()) {
            let mut x = x0.clone();
            rms_norm_gated(path, &mut x, &z, &w, 1e-6);
            for i in 0..300 {
                let want = w[i] * (x0[i] * s) * silu(z[i]);
                assert_eq!(x[i].to_bits(), want.to_bits(), "{} value {i}", path.name());
            }
        }
    }
}
