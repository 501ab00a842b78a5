//! Every SIMD kernel path agrees with the generic twin across odd shapes,
//! token counts (tiles of 16 and their remainders) and pool sizes.

use kore_engine::kernels::{
    bf16_activations, delta_step_with, gemm_acc_with, matmul_with, matmuls_with, permute_nvfp4,
    permute_nvfp4_x8, q8_activations, read_sum, round_bf16, round_q8, DeltaToken, Mat, MatMut,
    Product,
};
use kore_engine::pool::{Parallel, Serial, ThreadPool};
use kore_engine::simd::Path;
use kore_engine::{DType, Linear};

mod common;

use common::{Paths, Rng};

fn dense_bytes(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n {
        let v = rng.f();
        match dtype {
            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
            _ => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
        }
    }
    out
}

/// E4M3 scales without the NaN codes, over the whole exponent range.
fn scales(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| (rng.next() as u8) & 0xF7)
        .map(|b| if b & 0x7F == 0x7F { 0x7E } else { b })
        .collect()
}

/// Generic-vs-path check of `y` for a weight with elementwise `|W|`. A path
/// that quantizes activations to int8 is checked against the generic path
/// on the dequantized activations (its twin), with the same tight tolerance;
/// one that rounds them to bf16 (`amx`) on the rounded activations.
fn check(path: Path, pool: &dyn Parallel, w: &Linear<'_>, rng: &mut Rng, tokens: usize) {
    let (rows, cols) = (w.rows(), w.cols());
    let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f()).collect();
    let mut want = vec![0.0; tokens * rows];
    let mut got = vec![f32::NAN; tokens * rows];
    matmul_with(path, pool, w, &x, tokens, &mut got);
    let x = if bf16_activations(path, w, tokens) {
        round_bf16(&x)
    } else if q8_activations(path, w) {
        x.chunks(cols).flat_map(round_q8).collect()
    } else {
        x
    };
    matmul_with(Path::Generic, &Serial, w, &x, tokens, &mut want);
    let mut row = vec![0.0; cols];
    for r in 0..rows {
        w.decode_row(r, &mut row);
        for t in 0..tokens {
            let mag: f32 = row.iter().zip(&x[t * cols..]).map(|(a, b)| (a * b).abs()).sum();
            let (a, b) = (want[t * rows + r], got[t * rows + r]);
            assert!(
                (a - b).abs() <= 2e-6 * mag + 1e-30,
                "{} {rows}x{cols} tokens {tokens} row {r} token {t}: generic {a} vs {b} (mag {mag})",
                path.name()
            );
        }
    }
}

#[test]
fn nvfp4_paths_agree_with_generic() {
    let mut rec = Paths::new("kernels_agree::nvfp4_paths_agree_with_generic", true);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let pool = ThreadPool::new(3);
    for path in rec.list() {
        for &(rows, cols) in &[
            (1, 16),
            (3, 48),
            (17, 64),
            (5, 80),
            (33, 272),
            (6, 384),
            (2, 400),
            (9, 1040),
            (4, 2064),
            (7, 192),
            (3, 336),
            // Whole AMX tiles (16-row strips, 32-column steps), one and
            // several strips and steps, odd strip and step counts.
            (16, 32),
            (48, 96),
            (32, 2048),
            (80, 1056),
        ] {
            let packed = rng.bytes(rows * cols / 2);
            let sc = scales(&mut rng, rows * cols / 16);
            let gs = 0.37f32;
            let w = Linear::Nvfp4 { packed: &packed, scales: &sc, global_scale: gs, rows, cols };
            for tokens in [1, 2, 5, 16, 17, 35] {
                check(path, &Serial, &w, &mut rng, tokens);
                check(path, &pool, &w, &mut rng, tokens);
            }
        }
        rec.ran(path);
    }
    rec.finish();
}

#[test]
fn dense_paths_agree_with_generic() {
    let mut rec = Paths::new("kernels_agree::dense_paths_agree_with_generic", true);
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let pool = ThreadPool::new(2);
    for path in rec.list() {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for &(rows, cols) in
                &[(1, 1), (3, 7), (17, 16), (5, 33), (40, 100), (7, 1031), (9, 64), (12, 256)]
            {
                let data = dense_bytes(&mut rng, dtype, rows * cols);
                let w = Linear::Dense { dtype, data: &data, rows, cols };
                for tokens in [1, 3, 16, 19] {
                    check(path, &Serial, &w, &mut rng, tokens);
                    check(path, &pool, &w, &mut rng, tokens);
                }
            }
        }
        rec.ran(path);
    }
    rec.finish();
}

/// F16 block scales over a wide range (finite, both signs).
fn f16_scales(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| {
            let v = rng.f() * 2f32.powi((rng.next() % 24) as i32 - 16);
            half::f16::from_f32(v).to_le_bytes()
        })
        .collect()
}

#[test]
fn q8_paths_agree_with_generic() {
    let mut rec = Paths::new("kernels_agree::q8_paths_agree_with_generic", true);
    let mut rng = Rng(0x5151_2727_9898_0303);
    let pool = ThreadPool::new(3);
    for path in rec.list() {
        for &(rows, cols) in &[(1, 32), (3, 64), (17, 96), (5, 256), (33, 288), (9, 1056)] {
            let data = rng.bytes(rows * cols);
            let sc = f16_scales(&mut rng, rows * cols / kore_engine::Q8_GROUP);
            let w = Linear::Q8 { data: &data, scales: &sc, rows, cols };
            for tokens in [1, 2, 5, 16, 17, 35] {
                check(path, &Serial, &w, &mut rng, tokens);
                check(path, &pool, &w, &mut rng, tokens);
            }
        }
        rec.ran(path);
    }
    rec.finish();
}

#[test]
fn q8_draft_head_is_a_row_prefix() {
    let mut rng = Rng(77);
    let (rows, cols) = (10, 64);
    let data = rng.bytes(rows * cols);
    let sc = f16_scales(&mut rng, rows * cols / kore_engine::Q8_GROUP);
    let w = Linear::Q8 { data: &data, scales: &sc, rows, cols };
    let head = w.first_rows(4);
    assert_eq!((head.rows(), head.cols()), (4, cols));
    let (mut a, mut b) = (vec![0.0; cols], vec![0.0; cols]);
    for r in 0..4 {
        w.decode_row(r, &mut a);
        head.decode_row(r, &mut b);
        assert_eq!(a, b, "row {r}");
    }
}

#[test]
fn pool_split_is_exact() {
    // Rows split across workers are computed by the same kernel: identical bits.
    let mut rng = Rng(42);
    let (rows, cols, tokens) = (300, 512, 3);
    let packed = rng.bytes(rows * cols / 2);
    let sc = scales(&mut rng, rows * cols / 16);
    let w = Linear::Nvfp4 { packed: &packed, scales: &sc, global_scale: 1.0, rows, cols };
    let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f()).collect();
    let path = kore_engine::simd::best();
    let mut a = vec![0.0; tokens * rows];
    let mut b = vec![0.0; tokens * rows];
    matmul_with(path, &Serial, &w, &x, tokens, &mut a);
    matmul_with(path, &ThreadPool::new(4), &w, &x, tokens, &mut b);
    assert_eq!(a, b);
}

#[test]
fn q8_rounding_is_per_block_absmax() {
    let mut x = vec![0.0f32; 32];
    x[0] = 1.0;
    x[1] = 0.5;
    x[2] = -0.25;
    x[3] = 1.0 / 254.0 + 1e-6; // just above half a step: rounds to one step
    x[16] = -3.0; // the second block has its own scale
    x[17] = 1e-3;
    let r = round_q8(&x);
    let step = 1.0 / 127.0;
    assert_eq!(r[0], 1.0);
    assert!((r[1] - 64.0 * step).abs() < 1e-7, "{}", r[1]);
    assert!((r[2] + 32.0 * step).abs() < 1e-7, "{}", r[2]);
    assert!((r[3] - step).abs() < 1e-7, "{}", r[3]);
    assert_eq!(r[16], -3.0);
    assert_eq!(r[17], 0.0, "below half a step of the block's scale");
    assert!(round_q8(&[0.0; 16]).iter().all(|v| *v == 0.0));
}

#[test]
fn x8_permutation_keeps_each_lane_in_one_block() {
    let x: Vec<f32> = (0..272).map(|i| i as f32).collect();
    let mut out = vec![0.0; 272];
    permute_nvfp4_x8(&x, &mut out);
    // Value 16k + L is column 8L + k (nibble k of dword L): lane L of every
    // vector k is inside 16-column block L / 2.
    assert_eq!(&out[..4], &[0., 8., 16., 24.]);
    assert_eq!(&out[16..19], &[1., 9., 17.]);
    assert_eq!(&out[127], &127.);
    let mut seen = out[..256].to_vec();
    seen.sort_by(f32::total_cmp);
    assert_eq!(seen, x[..256].to_vec(), "a permutation of each chunk");
    assert_eq!(&out[256..], &x[256..], "the partial chunk is unchanged");
}

#[test]
fn permutation_is_even_then_odd() {
    let x: Vec<f32> = (0..40).map(|i| i as f32).collect();
    let mut out = vec![0.0; 40];
    permute_nvfp4(&x, &mut out, 16);
    assert_eq!(&out[..16], &[0., 2., 4., 6., 8., 10., 12., 14., 1., 3., 5., 7., 9., 11., 13., 15.]);
    assert_eq!(&out[32..], &x[32..]);
}

#[test]
fn chunked_batches_equal_single_products() {
    let mut rec = Paths::new("kernels_agree::chunked_batches_equal_single_products", false);
    // Large enough for many chunks per product; one batch of products of
    // different shapes and dtypes gives the bits of separate calls. Several
    // read the same activations (prepared once for each kernel form they
    // need), one reads a prefix of them with fewer columns (prepared apart).
    let mut rng = Rng(7);
    let (cols, tokens) = (1024, 3);
    let (r1, r2) = (2000, 700);
    let packed = rng.bytes(r1 * cols / 2);
    let sc = scales(&mut rng, r1 * cols / 16);
    let a = Linear::Nvfp4 { packed: &packed, scales: &sc, global_scale: 0.5, rows: r1, cols };
    let a2 = Linear::Nvfp4 {
        packed: &packed[..300 * cols / 2],
        scales: &sc[..300 * cols / 16],
        global_scale: 0.25,
        rows: 300,
        cols,
    };
    // 96 columns: no whole chunk of any kernel's layout, so the prefix's
    // prepared form differs from the full rows' over the same memory.
    let part = Linear::Nvfp4 {
        packed: &packed[..600 * 48],
        scales: &sc[..600 * 6],
        global_scale: 0.5,
        rows: 600,
        cols: 96,
    };
    let data = dense_bytes(&mut rng, DType::BF16, r2 * cols);
    let b = Linear::Dense { dtype: DType::BF16, data: &data, rows: r2, cols };
    let tiny = Linear::Dense { dtype: DType::BF16, data: &data[..2 * cols * 4], rows: 4, cols };
    let q8 = rng.bytes(100 * cols);
    let q8_scales = f16_scales(&mut rng, 100 * cols / kore_engine::Q8_GROUP);
    let q = Linear::Q8 { data: &q8, scales: &q8_scales, rows: 100, cols };
    let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f()).collect();
    let prefix = &x[..tokens * 96];
    let pool = ThreadPool::new(3);
    for path in rec.list() {
        let mut ys: Vec<Vec<f32>> =
            [r1, 300, 600, r2, 4, 100].iter().map(|r| vec![0.0; tokens * r]).collect();
        let [ya, ya2, yh, yb, yt, yq] = &mut ys[..] else { unreachable!() };
        matmuls_with(
            path,
            &pool,
            tokens,
            &mut [
                Product::new(&a, &x, ya),
                Product::new(&a2, &x, ya2),
                Product::new(&part, prefix, yh),
                Product::new(&b, &x, yb),
                Product::new(&tiny, &x, yt),
                Product::new(&q, &x, yq),
            ],
        );
        let ws = [(&a, &x[..]), (&a2, &x[..]), (&part, prefix), (&b, &x[..]), (&tiny, &x[..])];
        for ((w, x), y) in ws.into_iter().chain([(&q, &x[..])]).zip(&ys) {
            let mut want = vec![f32::NAN; y.len()];
            matmul_with(path, &Serial, w, x, tokens, &mut want);
            assert_eq!(&want, y, "{} {} rows", path.name(), w.rows());
        }
        rec.ran(path);
    }
    rec.finish();
}

#[test]
fn read_sum_paths_agree_with_generic() {
    let mut rec = Paths::new("kernels_agree::read_sum_paths_agree_with_generic", true);
    let buf: Vec<u64> = (1..=1000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    for path in rec.list() {
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 100, 1000] {
            let want = read_sum(Path::Generic, &buf[..n]);
            assert_eq!(read_sum(path, &buf[..n]), want, "{} over {n} words", path.name());
        }
        rec.ran(path);
    }
    rec.finish();
}

#[test]
fn delta_step_paths_agree_with_generic() {
    let mut rec = Paths::new("kernels_agree::delta_step_paths_agree_with_generic", true);
    let mut rng = Rng(0xD317A);
    for path in rec.list() {
        for &(dk, dv) in &[(1, 16), (3, 32), (5, 48), (16, 64), (128, 128), (7, 256), (4, 8)] {
            let mut s0: Vec<f32> = (0..dk * dv).map(|_| rng.f()).collect();
            let mut s1 = s0.clone();
            let (mut o0, mut o1, mut u) = (vec![0.0; dv], vec![0.0; dv], vec![0.0; dv]);
            for step in 0..3 {
                let k: Vec<f32> = (0..dk).map(|_| rng.f()).collect();
                let q: Vec<f32> = (0..dk).map(|_| rng.f()).collect();
                let v: Vec<f32> = (0..dv).map(|_| rng.f()).collect();
                let (g, beta) = (0.5 + 0.5 * rng.f().abs(), rng.f().abs());
                let t = DeltaToken { k: &k, q: &q, v: &v, g, beta };
                delta_step_with(Path::Generic, &mut s0, &t, &mut u, &mut o0);
                delta_step_with(path, &mut s1, &t, &mut u, &mut o1);
                // Magnitudes are O(dk): compare with a tolerance relative to them.
                let tol = 1e-5 * (dk as f32 + 1.0);
                for (i, (a, b)) in s0.iter().zip(&s1).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{} dk {dk} dv {dv} step {step} S[{i}]: {a} vs {b}",
                        path.name()
                    );
                }
                for (i, (a, b)) in o0.iter().zip(&o1).enumerate() {
                    assert!(
                        (a - b).abs() <= tol * dk as f32,
                        "{} dk {dk} dv {dv} step {step} o[{i}]: {a} vs {b}",
                        path.name()
                    );
                }
            }
        }
        rec.ran(path);
    }
    rec.finish();
}

#[test]
fn delta_step_is_the_reference_rule() {
    let mut rec = Paths::new("kernels_agree::delta_step_is_the_reference_rule", false);
    // The two-pass form against the rule as written in FACTS/transformers:
    // S *= g; d = beta (v - S^T k); S += k d^T; o = S^T q.
    let mut rng = Rng(99);
    let (dk, dv) = (6, 16);
    let s_init: Vec<f32> = (0..dk * dv).map(|_| rng.f()).collect();
    let k: Vec<f32> = (0..dk).map(|_| rng.f()).collect();
    let q: Vec<f32> = (0..dk).map(|_| rng.f()).collect();
    let v: Vec<f32> = (0..dv).map(|_| rng.f()).collect();
    let (g, beta) = (0.8f32, 0.3f32);
    let mut s: Vec<f64> = s_init.iter().map(|&x| x as f64 * g as f64).collect();
    let mut want_o = vec![0.0f64; dv];
    let mut d = vec![0.0f64; dv];
    for j in 0..dv {
        let stk: f64 = (0..dk).map(|i| s[i * dv + j] * k[i] as f64).sum();
        d[j] = beta as f64 * (v[j] as f64 - stk);
    }
    for i in 0..dk {
        for j in 0..dv {
            s[i * dv + j] += k[i] as f64 * d[j];
            want_o[j] += s[i * dv + j] * q[i] as f64;
        }
    }
    for path in rec.list() {
        let mut st = s_init.clone();
        let (mut o, mut u) = (vec![0.0; dv], vec![0.0; dv]);
        let t = DeltaToken { k: &k, q: &q, v: &v, g, beta };
        delta_step_with(path, &mut st, &t, &mut u, &mut o);
        for (a, b) in st.iter().zip(&s) {
            assert!((*a as f64 - b).abs() < 1e-5, "{}: state {a} vs {b}", path.name());
        }
        for (a, b) in o.iter().zip(&want_o) {
            assert!((*a as f64 - b).abs() < 1e-5, "{}: output {a} vs {b}", path.name());
        }
        rec.ran(path);
    }
    rec.finish();
}

#[test]
fn gemm_acc_paths_agree_with_generic() {
    let mut rec = Paths::new("kernels_agree::gemm_acc_paths_agree_with_generic", true);
    // Odd shapes around the 8-row x 32-column tiles, row strides wider than
    // the rows, accumulating into a non-zero C.
    let mut rng = Rng(0x6E33);
    let shapes = [(1, 1, 1), (3, 5, 7), (8, 32, 16), (9, 33, 64), (17, 16, 1), (64, 128, 128)];
    for path in rec.list() {
        for &(m, n, k) in &shapes {
            for k in [k, 0] {
                let (lda, ldb, ldc) = (k + 3, n + 5, n + 1);
                let a: Vec<f32> = (0..m * lda).map(|_| rng.f()).collect();
                let b: Vec<f32> = (0..k.max(1) * ldb).map(|_| rng.f()).collect();
                let c0: Vec<f32> = (0..m * ldc).map(|_| rng.f()).collect();
                let (mut want, mut got) = (c0.clone(), c0.clone());
                let (av, bv) = (Mat { data: &a, ld: lda }, Mat { data: &b, ld: ldb });
                gemm_acc_with(Path::Generic, m, n, k, av, bv, MatMut { data: &mut want, ld: ldc });
                gemm_acc_with(path, m, n, k, av, bv, MatMut { data: &mut got, ld: ldc });
                for i in 0..m {
                    for j in 0..ldc {
                        let (w, g) = (want[i * ldc + j], got[i * ldc + j]);
                        if j >= n {
                            assert_eq!(g, c0[i * ldc + j], "{} wrote past column {n}", path.name());
                        }
                        assert!(
                            (w - g).abs() <= 1e-5 * (k as f32 + 1.0),
                            "{} {m}x{n}x{k} C[{i},{j}]: {w} vs {g}",
                            path.name()
                        );
                    }
                }
            }
        }
        rec.ran(path);
    }
    rec.finish();
}
