//! `cargo bench -p kore-engine --bench attention`: the decode attention
//! kernels over a long KV cache, one thread, every supported path: the
//! scores of a GQA group against every key, the weighted value sums, and
//! both with the exp between them in blocks of 256 keys (what one work item
//! of a decode step does per KV head). Prints GB/s of K/V read, timed on
//! the thread's CPU time (best of 5 rounds of 200 ms).
//!
//! Shapes of Qwen3.5-2B/9B attention: `KORE_BENCH_HD` (default 256),
//! `KORE_BENCH_G` query heads per KV head (4), `KORE_BENCH_KV_HEADS` (2, the
//! row stride), `KORE_BENCH_KEYS` (8192), `KORE_BENCH_PATH` one path only.

use std::time::Instant;

use kore_engine::kernels::attn::{accumulate, exp_shift_sum, scores};
use kore_engine::kernels::KvElem;
use kore_engine::simd::Path;

fn env(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`).
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Best seconds per call of `f` over 5 rounds, each repeating it for at
/// least 200 ms: the thread's CPU time where Linux tells it (so other load
/// on the machine counts less; it is updated at scheduler events, hence the
/// long rounds), else wall time.
fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_ns());
            let mut reps = 0;
            while reps == 0 || t.elapsed().as_secs_f64() < 0.2 {
                f();
                reps += 1;
            }
            let secs = match (c, cpu_ns()) {
                (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
                _ => t.elapsed().as_secs_f64(),
            };
            secs / reps as f64
        })
        .fold(f64::MAX, f64::min)
}

struct Shape {
    hd: usize,
    g: usize,
    stride: usize,
    n: usize,
}

fn run<E: KvElem>(path: Path, sh: &Shape, label: &str) {
    let Shape { hd, g, stride, n } = *sh;
    let mut s = 0x9E37_79B9u32;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        (s >> 8) as f32 / (1 << 24) as f32 - 0.5
    };
    let keys: Vec<E> = (0..n * stride).map(|_| E::from_f32(rnd())).collect();
    let values: Vec<E> = (0..n * stride).map(|_| E::from_f32(rnd())).collect();
    let q: Vec<f32> = (0..g * hd).map(|_| rnd()).collect();
    const BLOCK: usize = 256;
    let mut sc = vec![0.0f32; g * BLOCK];
    let mut o = vec![0.0f32; g * hd];
    let kv_bytes = (n * hd * std::mem::size_of::<E>()) as f64;
    let t_scores = best(|| {
        for b in (0..n).step_by(BLOCK) {
            let m = BLOCK.min(n - b);
            scores(path, &q, g, hd, &keys[b * stride..], stride, m, &mut sc, BLOCK, 0.06);
        }
    });
    let p: Vec<f32> = (0..g * BLOCK).map(|_| rnd().abs()).collect();
    let t_acc = best(|| {
        for b in (0..n).step_by(BLOCK) {
            let m = BLOCK.min(n - b);
            accumulate(path, &p, BLOCK, g, hd, &values[b * stride..], stride, m, &mut o);
        }
    });
    let t_all = best(|| {
        o.fill(0.0);
        for b in (0..n).step_by(BLOCK) {
            let m = BLOCK.min(n - b);
            scores(path, &q, g, hd, &keys[b * stride..], stride, m, &mut sc, BLOCK, 0.06);
            for gi in 0..g {
                exp_shift_sum(path, &mut sc[gi * BLOCK..gi * BLOCK + m], 1.0);
            }
            accumulate(path, &sc, BLOCK, g, hd, &values[b * stride..], stride, m, &mut o);
        }
    });
    println!(
        "| {} | {label} | {:.1} | {:.1} | {:.1} | {:.2} |",
        path.name(),
        kv_bytes / t_scores / 1e9,
        kv_bytes / t_acc / 1e9,
        2.0 * kv_bytes / t_all / 1e9,
        t_all * 1e3
    );
}

fn main() {
    let sh = Shape {
        hd: env("KORE_BENCH_HD", 256),
        g: env("KORE_BENCH_G", 4),
        stride: env("KORE_BENCH_KV_HEADS", 2) * env("KORE_BENCH_HD", 256),
        n: env("KORE_BENCH_KEYS", 8192),
    };
    let only = std::env::var("KORE_BENCH_PATH").ok().and_then(|p| Path::from_name(&p));
    println!(
        "head dim {}, {} query heads per KV head, row stride {}, {} keys, one thread",
        sh.hd, sh.g, sh.stride, sh.n
    );
    println!(
        "| path | KV | scores GB/s | value sums GB/s | block loop GB/s (K+V) | block loop ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for path in Path::ALL.into_iter().filter(|p| p.supported() && only.is_none_or(|o| o == *p)) {
        run::<f32>(path, &sh, "f32");
        run::<u16>(path, &sh, "f16");
    }
}
