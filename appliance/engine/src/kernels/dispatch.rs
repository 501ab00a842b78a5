//! The one dispatch table: every kernel the engine runs, per [`Path`], mapped
//! to its per-ISA function (`simd::*`) or its portable twin ([`generic`]).
//! No other module names a per-ISA module; callers name a path and an entry
//! here (through the `kernels` API), the way llama.cpp's CPU backend picks a
//! type's `vec_dot` from its traits table.
//!
//! An [`Isa`] is a path this CPU can run (checked when it is made), so the
//! entries below may call the path's `unsafe` kernels: each call's remaining
//! preconditions (shapes) are checked by the `kernels` API before it gets
//! here and cited at the call.

use crate::simd::types::{DeltaToken, Dense, KvElem, Mat, MatMut, Q8In, TILE, TILE_ROWS};
use crate::simd::Path;
use crate::weights::Linear;

use super::generic;

#[cfg(target_arch = "x86_64")]
use crate::simd::{amx, attn_x86, avx2, avx2_q8, avx512, avx512vnni, q8, silu, vnni_q8, vnni_tile};

/// A kernel path this CPU supports: only [`Isa::new`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Isa(Path);

impl Isa {
    /// `path`, checked.
    ///
    /// # Panics
    /// If this CPU (or the XCR0 it was limited to) cannot run `path`.
    pub(crate) fn new(path: Path) -> Isa {
        assert!(path.supported(), "kernel path {} is not supported by this CPU", path.name());
        Isa(path)
    }

    /// The path.
    pub(crate) fn path(self) -> Path {
        self.0
    }
}

/// Whether `isa` runs the x86 SIMD kernels (every path but the generic one).
#[cfg(target_arch = "x86_64")]
fn simd(isa: Isa) -> bool {
    isa.0 != Path::Generic
}

/// Expands `$f::<N>(args)` for the runtime `n` in 1..=TILE.
#[cfg(target_arch = "x86_64")]
macro_rules! by_n {
    ($n:expr, $($f:ident)::+, $($a:expr),*) => {
        match $n {
            1 => $($f)::+::<1>($($a),*), 2 => $($f)::+::<2>($($a),*), 3 => $($f)::+::<3>($($a),*),
            4 => $($f)::+::<4>($($a),*), 5 => $($f)::+::<5>($($a),*), 6 => $($f)::+::<6>($($a),*),
            7 => $($f)::+::<7>($($a),*), _ => $($f)::+::<8>($($a),*),
        }
    };
}

/// `$f::<R, n>(args)` for the runtime token count `n` in 1..=4.
#[cfg(target_arch = "x86_64")]
macro_rules! by_tokens4 {
    ($($f:ident)::+, $r:literal, $n:expr, $($a:expr),*) => {
        match $n {
            1 => $($f)::+::<$r, 1>($($a),*),
            2 => $($f)::+::<$r, 2>($($a),*),
            3 => $($f)::+::<$r, 3>($($a),*),
            _ => $($f)::+::<$r, 4>($($a),*),
        }
    };
}

/// `$f::<R, n>(args)` (or `$f::<n>(args)` after `one_row`) for the runtime
/// token count `n` in 1..=8.
#[cfg(target_arch = "x86_64")]
macro_rules! by_tokens8 {
    ($($f:ident)::+, $r:literal, $n:expr, $($a:expr),*) => {
        by_tokens8!(@n $n, N => $($f)::+::<$r, N>($($a),*))
    };
    (one_row $($f:ident)::+, $n:expr, $($a:expr),*) => {
        by_tokens8!(@n $n, N => $($f)::+::<N>($($a),*))
    };
    (@n $n:expr, $c:ident => $call:expr) => {
        match $n {
            1 => { const $c: usize = 1; $call }
            2 => { const $c: usize = 2; $call }
            3 => { const $c: usize = 3; $call }
            4 => { const $c: usize = 4; $call }
            5 => { const $c: usize = 5; $call }
            6 => { const $c: usize = 6; $call }
            7 => { const $c: usize = 7; $call }
            _ => { const $c: usize = 8; $call }
        }
    };
}

/// The dense element type of `w`'s kernels (`None` for other dtypes).
fn dense(w: &Linear<'_>) -> Option<Dense> {
    match w {
        Linear::Dense { dtype: crate::tensor::DType::BF16, .. } => Some(Dense::Bf16),
        Linear::Dense { dtype: crate::tensor::DType::F16, .. } => Some(Dense::F16),
        Linear::Dense { dtype: crate::tensor::DType::F32, .. } => Some(Dense::F32),
        _ => None,
    }
}

/// One weight row `r` against `n <= TILE` tokens of f32 activations `x`
/// (`[n, cols]`, prepared as `kernels::form` says for `isa`): `out[..n]`.
/// `scratch` holds at least `cols` floats on the generic path.
pub(super) fn f32_row(
    isa: Isa,
    w: &Linear<'_>,
    r: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32; TILE],
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        return simd_row(isa.0, w, r, x, n, out);
    }
    let _ = isa;
    generic::row(w, r, x, n, out, scratch)
}

#[cfg(target_arch = "x86_64")]
fn simd_row(path: Path, w: &Linear<'_>, r: usize, x: &[f32], n: usize, out: &mut [f32; TILE]) {
    let wide = path.avx512();
    match *w {
        Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. } => {
            let p = &packed[r * cols / 2..(r + 1) * cols / 2];
            let s = &scales[r * cols / 16..(r + 1) * cols / 16];
            // AVX2 NVFP4 products take int8 activations (`kernels::form`).
            assert!(wide, "NVFP4 rows on f32 activations need AVX-512");
            // SAFETY: the path is supported (an `Isa`); slice lengths match the
            // kernel's preconditions (cols % 16 == 0 by load), `x` was permuted
            // per 128 columns for this kernel (`kernels::prepare`).
            unsafe { by_n!(n, avx512::nvfp4_row, p, s, gs, cols, x, out) }
        }
        Linear::Q8 { data, scales, cols, .. } => {
            let d = &data[r * cols..(r + 1) * cols];
            let s = &scales[r * cols / 16..(r + 1) * cols / 16]; // cols / 32 F16 scales
            if wide {
                // SAFETY: the path is supported (AVX-512 implies F16C here);
                // `d` holds `cols` int8, `s` cols / 32 F16 scales; x is [n,
                // cols] unpermuted.
                unsafe { by_n!(n, q8::row_avx512, d, s, cols, x, out) }
            } else {
                // SAFETY: as above for AVX2 (+FMA, F16C).
                unsafe { by_n!(n, q8::row_avx2, d, s, cols, x, out) }
            }
        }
        Linear::Dense { data, cols, .. } => {
            let Some(dt) = dense(w) else {
                out[..n].fill(f32::NAN);
                return;
            };
            let d = &data[r * cols * dt.bytes()..(r + 1) * cols * dt.bytes()];
            if dt == Dense::Bf16 && wide {
                // SAFETY: the path is supported; `d` holds `cols` bf16 values;
                // `kernels::prepare` permuted x per 32 columns for this case.
                unsafe { by_n!(n, avx512::bf16_row, d, cols, x, out) }
            } else if wide {
                // SAFETY: the path is supported; `d` holds `cols` elements; x is
                // [n, cols].
                unsafe { by_n!(n, avx512::dense_row, dt, d, cols, x, out) }
            } else {
                // SAFETY: as above for AVX2.
                unsafe { by_n!(n, avx2::dense_row, dt, d, cols, x, out) }
            }
        }
    }
}

/// The shape of `isa`'s int8 tile kernel for `w`: (most tokens, most rows).
#[cfg(target_arch = "x86_64")]
pub(super) fn q8_tile_shape(isa: Isa, w: &Linear<'_>) -> (usize, usize) {
    match (isa.0, w) {
        (Path::Avx2, _) => (avx2_q8::TOKENS, 1),
        (_, Linear::Nvfp4 { .. }) => (vnni_tile::TOKENS, vnni_tile::ROWS),
        (_, Linear::Q8 { .. }) => (vnni_q8::TOKENS, vnni_q8::ROWS),
        (_, Linear::Dense { .. }) => unreachable!("dense weights take f32 activations"),
    }
}

/// The NVFP4 block scales of `rows` decoded once into `buf` for `isa`'s
/// int8 tile kernel, when the rows pass several token tiles (`many`);
/// empty otherwise. `buf` is only zeroed where it grows: a decode
/// overwrites what it returns.
#[cfg(target_arch = "x86_64")]
pub(super) fn pre_scales<'b>(
    isa: Isa,
    w: &Linear<'_>,
    rows: core::ops::Range<usize>,
    many: bool,
    buf: &'b mut alloc::vec::Vec<f32>,
) -> &'b [f32] {
    let Linear::Nvfp4 { scales, global_scale: gs, cols, .. } = *w else { return &[] };
    let s = &scales[rows.start * cols / 16..rows.end * cols / 16];
    let grown = |buf: &'b mut alloc::vec::Vec<f32>, n: usize| {
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
        &mut buf[..n]
    };
    if many && cols >= avx2_q8::CHUNK && isa.0 == Path::Avx2 {
        let out = grown(buf, rows.len() * (cols / avx2_q8::CHUNK) * 8);
        // SAFETY: the path (AVX2 + FMA) is supported; `s` holds
        // `rows.len()` rows of scales, `out` 8 floats per 128-column chunk.
        unsafe { avx2_q8::decode_scales(s, gs, cols, out) };
        out
    } else if many && cols >= vnni_tile::CHUNK && isa.0.vnni() {
        let out = grown(buf, rows.len() * (cols / vnni_tile::CHUNK) * 16);
        // SAFETY: the path (VNNI) has AVX-512 F/BW/VL; `s` holds
        // `rows.len()` rows of scales, `out` 16 floats per chunk.
        unsafe { vnni_tile::decode_scales(s, gs, cols, out) };
        out
    } else {
        &[]
    }
}

/// Rows `r0..r0 + nr` of `w` (`nr` is 1 or the kernel's row count from
/// [`q8_tile_shape`]) against the `n` tokens of `x` (int8, laid out for
/// `isa`'s kernel), `pre` their pre-decoded scales or empty: `out[r][..n]`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn q8_tile(
    isa: Isa,
    w: &Linear<'_>,
    r0: usize,
    nr: usize,
    n: usize,
    x: Q8In<'_>,
    pre: &[f32],
    out: &mut [[f32; TILE]; TILE_ROWS],
) {
    match (*w, isa.0) {
        (Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. }, Path::Avx2) => {
            debug_assert_eq!(nr, 1, "the AVX2 tile takes one row");
            let p = &packed[r0 * cols / 2..(r0 + 1) * cols / 2];
            let s = &scales[r0 * cols / 16..(r0 + 1) * cols / 16];
            // SAFETY: AVX2 (+FMA) is supported; `p` and `s` hold one row,
            // `cols % 16 == 0` (by load), the tile holds `n <= 8` tokens
            // quantized in 128-column chunks (`q8act`).
            unsafe {
                by_tokens8!(one_row avx2_q8::nvfp4_tile, n, p, s, gs, cols, x, pre, &mut out[0])
            }
        }
        (Linear::Nvfp4 { packed, scales, global_scale: gs, cols, .. }, p) if p.vnni() => {
            let pk = &packed[r0 * cols / 2..(r0 + nr) * cols / 2];
            let s = &scales[r0 * cols / 16..(r0 + nr) * cols / 16];
            // SAFETY: the path (VNNI + VBMI) is supported; `pk` and `s` hold
            // `nr` rows, `cols % 16 == 0` (by load), the tile holds `n <= 8`
            // tokens quantized for this kernel.
            unsafe {
                if nr == vnni_tile::ROWS {
                    by_tokens8!(vnni_tile::nvfp4_tile, 2, n, pk, s, gs, cols, x, pre, out)
                } else {
                    by_tokens8!(vnni_tile::nvfp4_tile, 1, n, pk, s, gs, cols, x, pre, out)
                }
            }
        }
        (Linear::Q8 { data, scales, cols, .. }, p) if p.vnni() => {
            let d = &data[r0 * cols..(r0 + nr) * cols];
            let s = &scales[r0 * cols / 16..(r0 + nr) * cols / 16];
            // SAFETY: as above (the path implies F16C: `detect` requires it
            // for AVX2); `d` and `s` hold `nr` rows, `cols % 32 == 0` (by
            // load), the activations were quantized per 4-column lane.
            unsafe {
                if nr == vnni_q8::ROWS {
                    by_tokens4!(vnni_q8::q8_tile, 4, n, d, s, cols, x, out)
                } else {
                    by_tokens4!(vnni_q8::q8_tile, 1, n, d, s, cols, x, out)
                }
            }
        }
        _ => unreachable!("{} has no int8 tile kernel for this weight", isa.0.name()),
    }
}

/// One 256-column chunk quantized by the AVX-512 quantizer (`isa` must be
/// a VNNI path); false if the scalar rule must take it.
#[cfg(target_arch = "x86_64")]
pub(super) fn q8_chunk256(
    isa: Isa,
    x: &[f32; 256],
    q: &mut [i8; 256],
    corr: &mut [i32; 16],
    scale: &mut [f32; 16],
) -> bool {
    assert!(isa.0.vnni(), "the SIMD quantizer runs on VNNI paths");
    // SAFETY: a VNNI path is supported, which has AVX-512 F/BW/VL and VNNI.
    unsafe { avx512vnni::q8_chunk256(x, q, corr, scale) }
}

/// One 128-column chunk quantized by the AVX2 quantizer (`isa` must run
/// AVX2); false if the scalar rule must take it.
#[cfg(target_arch = "x86_64")]
pub(super) fn q8_chunk128(
    isa: Isa,
    x: &[f32; 128],
    q: &mut [i8; 128],
    corr: &mut [i32; 8],
    scale: &mut [f32; 8],
) -> bool {
    assert!(isa.0 != Path::Generic, "the AVX2 quantizer runs on SIMD paths");
    // SAFETY: every path but the generic one has AVX2 and FMA.
    unsafe { avx2_q8::q8_chunk128(x, q, corr, scale) }
}

/// Whether `isa` takes an NVFP4 product of `rows x cols` over `tokens`
/// tokens on AMX tiles (whole tiles, at least `min_tokens`).
pub(super) fn amx_takes(isa: Isa, rows: usize, cols: usize, tokens: usize, min: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa.0 == Path::Amx && tokens >= min && amx::fits(rows, cols);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, rows, cols, tokens, min);
        false
    }
}

/// Activations `[tokens, cols]` as AMX B tiles (`isa` is [`Path::Amx`],
/// `cols` whole 32-column steps).
#[cfg(target_arch = "x86_64")]
pub(super) fn amx_pack(isa: Isa, x: &[f32], tokens: usize, cols: usize) -> alloc::vec::Vec<u32> {
    assert!(isa.0 == Path::Amx && x.len() == tokens * cols && amx::fits(16, cols));
    // SAFETY: the AMX path is supported, which has AVX-512 BW; the shape is
    // asserted above.
    unsafe { amx::pack(x, tokens, cols) }
}

/// Rows `rows` (whole 16-row strips) of the NVFP4 `w` against its `tokens`
/// bf16 tokens `b` ([`amx_pack`]) on AMX tiles: the rows decoded to bf16
/// once into `scratch`, then every token; `y` is the product's output
/// (`[tokens, w.rows()]`) from row `rows.start` on.
///
/// # Safety
/// `y` is valid for writes at `t * w.rows() + r` for `t < tokens`, `r <
/// rows.len()`, and nothing else accesses those elements during the call.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn amx_rows(
    isa: Isa,
    w: &Linear<'_>,
    b: &[u32],
    rows: core::ops::Range<usize>,
    tokens: usize,
    scratch: &mut alloc::vec::Vec<f32>,
    y: *mut f32,
) {
    let Linear::Nvfp4 { packed, scales, global_scale: gs, rows: ld, cols } = *w else {
        unreachable!("bf16 pairs are prepared for NVFP4 weights only");
    };
    let n = rows.len();
    assert!(isa.0 == Path::Amx && rows.start % amx::ROWS == 0 && amx::fits(n, cols));
    assert!(b.len() == tokens.div_ceil(amx::TOKENS) * cols / 2 * amx::TOKENS);
    if scratch.len() < n * cols / 2 {
        scratch.resize(n * cols / 2, 0.0);
    }
    // SAFETY: the first n * cols / 2 floats of `scratch` are n * cols u16
    // (u16 needs less alignment than f32), used only as this view below.
    let a =
        unsafe { core::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u16>(), n * cols) };
    let p = &packed[rows.start * cols / 2..rows.end * cols / 2];
    let s = &scales[rows.start * cols / 16..rows.end * cols / 16];
    // SAFETY: the AMX path is supported, which implies AVX-512 BW and the
    // granted tile state; `p`, `s` and `a` hold `n` rows (a multiple of 16)
    // of `cols` (a multiple of 32) columns, `b` was packed for `tokens`
    // tokens of `cols` columns (asserted), and `y` is the caller's.
    unsafe {
        amx::decode(p, s, n, cols, a);
        amx::gemm(a, b, n, cols, tokens, gs, y, ld);
    }
}

/// [`generic::delta_step`] on `isa` (AVX-512 for `dv % 16 == 0`, AVX2 for
/// `dv % 8 == 0`).
pub(super) fn delta_step(
    isa: Isa,
    s: &mut [f32],
    t: &DeltaToken<'_>,
    u: &mut [f32],
    o: &mut [f32],
) {
    let dv = t.v.len();
    #[cfg(target_arch = "x86_64")]
    if isa.0.avx512() && dv % 16 == 0 {
        use avx512::delta_step as d;
        // SAFETY: AVX-512 is supported (an `Isa`); shapes were checked by
        // `kernels::delta_step_with` and each `C` divides dv / 16.
        unsafe {
            match dv / 16 {
                n if n % 8 == 0 => d::<8>(s, t, o),
                n if n % 4 == 0 => d::<4>(s, t, o),
                n if n % 2 == 0 => d::<2>(s, t, o),
                _ => d::<1>(s, t, o),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.0 == Path::Avx2 && dv % 8 == 0 {
        use avx2::delta_step as d;
        // SAFETY: AVX2 and FMA are supported (an `Isa` of the AVX2 path);
        // shapes were checked by `kernels::delta_step_with` and each `C`
        // divides dv / 8.
        unsafe {
            match dv / 8 {
                n if n % 4 == 0 => d::<4>(s, t, o),
                n if n % 2 == 0 => d::<2>(s, t, o),
                _ => d::<1>(s, t, o),
            }
        }
        return;
    }
    let _ = isa;
    generic::delta_step(s, t, &mut u[..dv], o);
}

/// [`generic::gemm_acc`] on `isa` (AVX-512 tiles of 8 x 32).
pub(super) fn gemm_acc(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: MatMut<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.0.avx512() {
        // SAFETY: AVX-512 is supported; every view holds its shape (checked
        // by `kernels::gemm_acc_with`).
        unsafe { avx512::gemm_acc(m, n, k, a, b, c) };
        return;
    }
    let _ = isa;
    generic::gemm_acc(m, n, k, a, b, c);
}

/// Attention scores on `isa` (see `kernels::attn::scores`; shapes checked there).
#[allow(clippy::too_many_arguments)]
pub(super) fn scores<E: KvElem>(
    isa: Isa,
    q: &[f32],
    g: usize,
    hd: usize,
    keys: &[E],
    stride: usize,
    n: usize,
    out: &mut [f32],
    ostride: usize,
    scale: f32,
) {
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        let wide = isa.0.avx512();
        // SAFETY: the path is supported and the shapes were checked by the caller.
        unsafe {
            if wide {
                attn_x86::scores_avx512(q, g, hd, keys, stride, n, out, ostride, scale)
            } else {
                attn_x86::scores_avx2(q, g, hd, keys, stride, n, out, ostride, scale)
            }
        }
        return;
    }
    let _ = isa;
    generic::scores(q, g, hd, keys, stride, n, out, ostride, scale);
}

/// Weighted value sums on `isa` (see `kernels::attn::accumulate`; shapes
/// checked there).
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate<E: KvElem>(
    isa: Isa,
    p: &[f32],
    pstride: usize,
    g: usize,
    hd: usize,
    values: &[E],
    stride: usize,
    n: usize,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        let wide = isa.0.avx512();
        // SAFETY: the path is supported and the shapes were checked by the caller.
        unsafe {
            if wide {
                attn_x86::accumulate_avx512(p, pstride, g, hd, values, stride, n, o)
            } else {
                attn_x86::accumulate_avx2(p, pstride, g, hd, values, stride, n, o)
            }
        }
        return;
    }
    let _ = isa;
    generic::accumulate(p, pstride, g, hd, values, stride, n, o);
}

/// `x = exp(x - m)` (the polynomial of `exp::exp`, or `libm::expf` on the
/// generic path), returning the sum.
pub(super) fn exp_shift_sum(isa: Isa, x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        // SAFETY: the path is supported (AVX2 or an AVX-512 path).
        return unsafe {
            if isa.0.avx512() {
                attn_x86::exp_shift_sum_avx512(x, m)
            } else {
                attn_x86::exp_shift_sum_avx2(x, m)
            }
        };
    }
    let _ = isa;
    generic::exp_shift_sum(x, m)
}

/// `x = silu(x)`, bit for bit `exp::silu` on every path.
pub(super) fn silu_in_place(isa: Isa, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        // SAFETY: the path is supported, and the kernels touch only `x`.
        unsafe {
            if isa.0.avx512() {
                silu::silu512(x)
            } else {
                silu::silu256(x)
            }
        }
        return;
    }
    let _ = isa;
    x.iter_mut().for_each(|v| *v = crate::exp::silu(*v));
}

/// `x = expf_floored(x)`, bit for bit `exp::expf_floored` on every path.
pub(super) fn exp_in_place(isa: Isa, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd(isa) {
        // SAFETY: the path is supported, and the kernels touch only `x`.
        unsafe {
            if isa.0.avx512() {
                silu::exp512(x)
            } else {
                silu::exp256(x)
            }
        }
        return;
    }
    let _ = isa;
    x.iter_mut().for_each(|v| *v = crate::exp::expf_floored(*v));
}

/// Wrapping sum of `buf` with `isa`'s loads (the read-bandwidth probe).
pub(super) fn read_sum(isa: Isa, buf: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if isa.0.avx512() {
        // SAFETY: AVX-512 is supported.
        return unsafe { avx512::read_sum(buf) };
    }
    let _ = isa;
    generic::read_sum(buf)
}
