//! A token's product does not depend on the batch it runs in: on every
//! kernel path, each token of a multi-token product (tiles of rows x
//! tokens, remainders, pools of workers) is bit-for-bit the one-token
//! product of that token alone. This is what keeps batched decode and
//! chunked prefill exact (greedy tokens identical alone and batched).
//! The opt-in `amx` path keeps this among its AMX products (32 tokens or
//! more, whole tiles); a token alone runs there on the VNNI kernel, so its
//! reference is the token repeated.

use kore_engine::kernels::{bf16_activations, matmul_with};
use kore_engine::pool::{Parallel, Serial, ThreadPool};
use kore_engine::simd::Path;
use kore_engine::{DType, Linear};

mod common;

use common::{Paths, Rng};

/// Checks every token of `tokens`-token products of `w` (serial and on
/// `pool`) against the same token's one-token product.
fn check(path: Path, pool: &dyn Parallel, w: &Linear<'_>, rng: &mut Rng, tokens: usize) {
    let (rows, cols) = (w.rows(), w.cols());
    // Tokens of very different magnitudes, so per-block scales differ.
    let x: Vec<f32> =
        (0..tokens * cols).map(|i| rng.f() * [1.0, 1e-3, 40.0][(i / cols) % 3]).collect();
    let (mut serial, mut pooled) = (vec![f32::NAN; tokens * rows], vec![f32::NAN; tokens * rows]);
    matmul_with(path, &Serial, w, &x, tokens, &mut serial);
    matmul_with(path, pool, w, &x, tokens, &mut pooled);
    let mut one = vec![f32::NAN; rows];
    let mut copies = vec![f32::NAN; tokens * rows];
    for t in 0..tokens {
        let xt = &x[t * cols..(t + 1) * cols];
        if bf16_activations(path, w, tokens) {
            // AMX tiles: the token repeated as often is its reference batch.
            matmul_with(path, &Serial, w, &xt.repeat(tokens), tokens, &mut copies);
            one.copy_from_slice(&copies[..rows]);
        } else {
            matmul_with(path, &Serial, w, xt, 1, &mut one);
        }
        let at = format!("{} {rows}x{cols} token {t} of {tokens}", path.name());
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&serial[t * rows..(t + 1) * rows]), bits(&one), "{at}, serial");
        assert_eq!(bits(&pooled[t * rows..(t + 1) * rows]), bits(&one), "{at}, pool");
    }
}

const TOKENS: [usize; 11] = [2, 3, 4, 5, 7, 8, 9, 12, 17, 33, 48];

#[test]
fn nvfp4_tokens_are_exact_in_any_tile() {
    let mut rng = Rng(0xC0FF_EE12_3456_789B);
    let pool = ThreadPool::new(3);
    let mut rec = Paths::new("gemm_tiles::nvfp4", false);
    for path in rec.list() {
        rec.ran(path);
        // Row counts that leave every remainder of a 4-row tile; columns
        // with and without a partial 128-column chunk.
        // (16, 32), (48, 2048) and (80, 96) are whole AMX tiles.
        for &(rows, cols) in &[
            (1, 128),
            (6, 256),
            (7, 272),
            (13, 2048),
            (70, 640),
            (5, 48),
            (16, 32),
            (48, 2048),
            (80, 96),
        ] {
            let packed = rng.bytes(rows * cols / 2);
            let sc: Vec<u8> =
                (0..rows * cols / 16).map(|_| (rng.next() as u8 & 0x77) | 0x30).collect();
            let w = Linear::Nvfp4 { packed: &packed, scales: &sc, global_scale: 0.61, rows, cols };
            for tokens in TOKENS {
                check(path, &pool, &w, &mut rng, tokens);
            }
        }
    }
    rec.finish();
}

#[test]
fn dense_and_q8_tokens_are_exact_in_any_tile() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let pool = ThreadPool::new(2);
    let mut rec = Paths::new("gemm_tiles::dense_and_q8", false);
    for path in rec.list() {
        rec.ran(path);
        let (rows, cols) = (37, 256);
        let data = rng.bytes(rows * cols);
        let sc: Vec<u8> = (0..rows * cols / kore_engine::Q8_GROUP)
            .flat_map(|_| {
                half::f16::from_f32(0.01 + (rng.next() % 100) as f32 * 1e-3).to_le_bytes()
            })
            .collect();
        let q8 = Linear::Q8 { data: &data, scales: &sc, rows, cols };
        let bf: Vec<u8> = (0..rows * cols)
            .flat_map(|_| ((rng.f().to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let bf16 = Linear::Dense { dtype: DType::BF16, data: &bf, rows, cols };
        for tokens in TOKENS {
            check(path, &pool, &q8, &mut rng, tokens);
            check(path, &pool, &bf16, &mut rng, tokens);
        }
    }
    rec.finish();
}
