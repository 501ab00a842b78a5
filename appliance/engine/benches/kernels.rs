//! `cargo bench -p kore-engine --bench kernels`: plain timing (no criterion)
//! of the matrix kernels on every supported path, in Qwen3.5-2B shapes.
//! Prints GB/s of weights streamed for matvec and GFLOP/s for 16-token tiles.
//! `KORE_BENCH_THREADS` sets the pool size (default: all cores);
//! `KORE_BENCH_PATH` (`generic`, `avx2`, `avx512`, `avx512vnni`) runs one
//! path only; `KORE_BENCH_ROWS` sets the row count (small = in cache),
//! `KORE_BENCH_COLS` the column count (default 2048), `KORE_BENCH_WEIGHTS`
//! one weight type (`nvfp4`, `bf16`, `q8`), `KORE_BENCH_SPLIT=K` runs each
//! matrix as K products one after another, `KORE_BENCH_ROUNDS_PRINT=1`
//! prints every timed round's ms (the figure is the best of 5; on DRAM-sized
//! matrices the rounds here spread by 15-20%, so compare their means).

use std::time::Instant;

use kore_engine::kernels::matmul_with;
use kore_engine::pool::{Parallel, ThreadPool};
use kore_engine::simd::Path;
use kore_engine::{DType, Linear};

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`).
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Best time of one call over 5 timed rounds (each round repeats the call
/// until it has run at least 20 ms, so small in-cache cases time well).
/// With `KORE_BENCH_CPU_TIME=1` (and one thread) it is the thread's CPU
/// time instead of wall time: other load on the machine then barely moves
/// in-cache figures.
fn time(f: &mut dyn FnMut()) -> f64 {
    let cpu = std::env::var("KORE_BENCH_CPU_TIME").is_ok_and(|v| v == "1");
    let now =
        || if cpu { cpu_ns().unwrap_or(0) as f64 * 1e-9 } else { START.elapsed().as_secs_f64() };
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let (t, mut calls) = (now(), 0u32);
        while calls == 0 || now() - t < 0.02 {
            f();
            calls += 1;
        }
        best = best.min((now() - t) / f64::from(calls));
        if std::env::var("KORE_BENCH_ROUNDS_PRINT").is_ok() {
            eprint!("{:.3} ", (now() - t) / f64::from(calls) * 1e3);
        }
    }
    best
}

/// `w`'s rows as `k` consecutive weights of `rows / k` rows each.
fn parts<'a>(w: &Linear<'a>, k: usize) -> Vec<Linear<'a>> {
    let n = w.rows() / k;
    (0..k)
        .map(|i| match *w {
            Linear::Nvfp4 { packed, scales, global_scale, cols, .. } => Linear::Nvfp4 {
                packed: &packed[i * n * cols / 2..(i + 1) * n * cols / 2],
                scales: &scales[i * n * cols / 16..(i + 1) * n * cols / 16],
                global_scale,
                rows: n,
                cols,
            },
            Linear::Dense { dtype, data, cols, .. } => {
                let b = data.len() / (k * n * cols);
                let data = &data[i * n * cols * b..(i + 1) * n * cols * b];
                Linear::Dense { dtype, data, rows: n, cols }
            }
            Linear::Q8 { data, scales, cols, .. } => Linear::Q8 {
                data: &data[i * n * cols..(i + 1) * n * cols],
                scales: &scales[i * n * cols / 16..(i + 1) * n * cols / 16],
                rows: n,
                cols,
            },
        })
        .collect()
}

static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn main() {
    let threads = std::env::var("KORE_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let pool = ThreadPool::new(threads);
    // MLP gate of the 2B model (NVFP4) and a 64 Mi-element bf16 matrix (lm_head-like).
    // `KORE_BENCH_ROWS` shrinks the matrices until they sit in cache: then the
    // figures are the kernels' arithmetic throughput, not memory bandwidth.
    let rows =
        std::env::var("KORE_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(6144 * 8);
    // `KORE_BENCH_COLS` sets the column count (default 2048, the 2B hidden size).
    let cols = std::env::var("KORE_BENCH_COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
    let packed = bytes(rows * cols / 2, 1);
    // E4M3 block scales with exponent 4 or 6 (normal numbers, like a real export).
    let scales: Vec<u8> = bytes(rows * cols / 16, 2).iter().map(|b| (b & 0x17) | 0x20).collect();
    let nv = Linear::Nvfp4 { packed: &packed, scales: &scales, global_scale: 0.01, rows, cols };
    // bf16 weights of magnitude 2^-4..2^-2 with random signs (no denormals:
    // a denormal operand makes every FMA a microcode assist).
    let bf = bytes(rows * cols * 2, 3)
        .iter()
        .enumerate()
        .map(|(i, b)| if i % 2 == 1 { 0x3D | (b & 0x80) } else { *b })
        .collect::<Vec<u8>>();
    let bw = Linear::Dense { dtype: DType::BF16, data: &bf, rows, cols };
    // A q8 head: int8 with F16 block scales of 2^-8 (0x1C00).
    let q8 = bytes(rows * cols, 4);
    let q8_scales: Vec<u8> = [0x00, 0x1C].repeat(rows * cols / 32);
    let qw = Linear::Q8 { data: &q8, scales: &q8_scales, rows, cols };
    // `KORE_BENCH_TOKENS=1,4,8` picks the token counts (default 1, 4, 16).
    let token_counts: Vec<usize> = std::env::var("KORE_BENCH_TOKENS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16]);
    println!("threads {threads}");
    let mut probe = vec![0u64; rows * cols / 4];
    let clock = || START.elapsed().as_nanos() as u64;
    let gb = kore_engine::bench::read_bandwidth(&pool as &dyn Parallel, &mut probe, &clock, 5);
    println!("read probe {:.0} MB: {gb:6.2} GB/s", (probe.len() * 8) as f64 / 1e6);
    drop(probe);
    // `KORE_BENCH_SPLIT=K` runs each matrix as K products of rows/K rows one
    // after another (one pool run each), as a model's layers do: the cost of
    // starting and ending a product.
    let split: usize = std::env::var("KORE_BENCH_SPLIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|k| *k >= 1 && rows / k * k == rows)
        .unwrap_or(1);
    if split > 1 {
        println!("each matrix as {split} products of {} rows", rows / split);
    }
    let only = std::env::var("KORE_BENCH_PATH").ok().and_then(|v| Path::from_name(v.trim()));
    for path in Path::ALL.into_iter().filter(|p| p.supported() && only.is_none_or(|o| o == *p)) {
        for (name, w) in [("nvfp4", &nv), ("bf16", &bw), ("q8", &qw)]
            .into_iter()
            .filter(|(n, _)| std::env::var("KORE_BENCH_WEIGHTS").map_or(true, |w| w == *n))
        {
            for &tokens in &token_counts {
                let x = vec![0.5f32; tokens * cols];
                let mut y = vec![0.0f32; tokens * rows];
                let s = time(&mut || {
                    for (w, y) in parts(w, split).iter().zip(y.chunks_mut(tokens * rows / split)) {
                        matmul_with(path, &pool as &dyn Parallel, w, &x, tokens, y);
                    }
                });
                let gbps = w.weight_bytes() as f64 / s / 1e9;
                let gflops = 2.0 * (rows * cols * tokens) as f64 / s / 1e9;
                println!(
                    "{:8} {name:6} {rows}x{cols} tokens {tokens:2}: {:8.3} ms  {gbps:6.2} GB/s of weights  {gflops:7.1} GFLOP/s",
                    path.name(),
                    s * 1e3
                );
            }
        }
    }
}
