//! `cargo bench -p kore-launch --bench long_context`: decode step time at increasing
//! context depth on a pack, without prefilling the context (a benchmark: it prints a
//! table for docs/benchmarks.md and checks nothing).
//! Every attention layer's KV cache gets `depth` synthetic positions
//! (`State::push_synthetic_context`, the position moves with them), then
//! decode steps are timed, for an f32 and an f16 cache alternately. Prints
//! ms per step, the KV bytes each step reads, and the step time beyond the
//! shortest depth per KV byte (flat = linear in the context).
//!
//! ```text
//! KORE_LONGCTX_PACK=/work/packs/2b KORE_LONGCTX_THREADS=2 \
//!   cargo bench -p kore-launch --bench long_context
//! ```
//! `KORE_LONGCTX_DEPTHS` (default `1024,8192,32768,65536`) and
//! `KORE_LONGCTX_STEPS` (default 8) set the depths and timed steps.

use std::time::Instant;

use kore_engine::pool::ThreadPool;
use kore_engine::state::KvPrecision;
use kore_engine::{Logits, State};
use kore_pack::Pack;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() {
    let dir =
        env_or("KORE_LONGCTX_PACK", concat!(env!("CARGO_MANIFEST_DIR"), "/../model-packs/tiny"));
    let threads: usize = env_or("KORE_LONGCTX_THREADS", "2").parse().unwrap();
    let steps: usize = env_or("KORE_LONGCTX_STEPS", "8").parse().unwrap();
    let depths: Vec<usize> = env_or("KORE_LONGCTX_DEPTHS", "1024,8192,32768,65536")
        .split(',')
        .map(|d| d.trim().parse().unwrap())
        .collect();
    let pack = Pack::open(&dir).unwrap();
    let mut model = pack.model().unwrap();
    let pool = ThreadPool::new(threads);
    model.set_pool(&pool);
    let cfg = model.config.clone();
    println!("pack {dir}, {threads} threads, {steps} steps, kernels {}", model.kernels().name());
    println!("| KV | depth | ms/step | KV MB read/step | extra ms per KV GB |");
    println!("| --- | --- | --- | --- | --- |");
    let mut first: [Option<(f64, f64)>; 2] = [None, None];
    for &depth in &depths {
        for (i, kv) in [KvPrecision::F32, KvPrecision::F16].into_iter().enumerate() {
            let mut st = State::with_kv(&cfg, kv);
            st.push_synthetic_context(&cfg, depth, 1);
            model.forward(&mut st, &[1], Logits::Last).unwrap(); // warm-up
            let t = Instant::now();
            for s in 0..steps {
                model.forward(&mut st, &[(s as u32 * 13 + 2) % 1000], Logits::Last).unwrap();
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
            let gb = st.kv_bytes() as f64 / 1e9;
            let (ms0, gb0) = *first[i].get_or_insert((ms, gb));
            let per_gb =
                if gb > gb0 { format!("{:.1}", (ms - ms0) / (gb - gb0)) } else { "-".into() };
            println!("| {kv:?} | {depth} | {ms:.1} | {:.0} | {per_gb} |", gb * 1e3);
        }
    }
}
