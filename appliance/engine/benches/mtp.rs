//! `cargo bench -p kore-engine --bench mtp [-- decode|verify]`: two measurements of MTP
//! speculative decoding on the trained tiny model (a benchmark, not a test: it prints tables
//! for docs/benchmarks.md and checks nothing; the MTP tests are in tests/).
//! - `decode`: decode speed and tokens per step for each draft count, draft vocabulary and
//!   restore method, alternating with plain decoding in one run
//!   (`KORE_MTP_BENCH_TOKENS` sets the tokens per run, default 160);
//! - `verify`: where a verify step's time goes (`KORE_MTP_BENCH_THREADS`, default 2).
//!
//! Without an argument both run.

use std::path::Path;
use std::time::Instant;

use kore_engine::hf::HfModelDir;
use kore_engine::pool::ThreadPool;
use kore_engine::state::Checkpoints;
use kore_engine::{
    generate, generate_spec, GenerateOptions, Model, Restore, SamplingParams, SpecOptions,
};

const PROMPTS: [&[u32]; 2] = [
    // "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    &[1767, 36, 46, 393, 470, 2566, 11, 479, 1238, 1559, 285, 1598, 1378, 303, 1373, 82, 559],
    // "KING HENRY:\nOnce more unto the breach, dear friends,"
    &[601, 1516, 393, 46, 828, 515, 1242, 268, 727, 937, 11, 1050, 1042, 11],
];

/// Seconds of a `max_tokens = 1` generation of `p` (prefill and one pick).
fn prefill_secs(model: &Model<'_>, p: &[u32], opts: &GenerateOptions) -> f64 {
    let one = GenerateOptions { max_tokens: 1, ..opts.clone() };
    let t = Instant::now();
    generate(model, &mut model.new_state(), p, &one, |_| true).unwrap();
    t.elapsed().as_secs_f64()
}

fn main() {
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|a| a == name);
    if wanted("decode") {
        mtp_decode_speed();
    }
    if wanted("verify") {
        verify_cost();
    }
}

fn mtp_decode_speed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf");
    let hf = HfModelDir::open(&dir).unwrap();
    let model = hf.model().unwrap();
    let v = model.config.vocab_size;
    let tokens: usize =
        std::env::var("KORE_MTP_BENCH_TOKENS").ok().and_then(|s| s.parse().ok()).unwrap_or(160);
    let opts = GenerateOptions {
        max_tokens: tokens,
        stop_tokens: vec![],
        sampling: SamplingParams::greedy(),
    };
    // Decode times exclude the prefill: a max_tokens = 1 run is subtracted.
    let plain = |p: &[u32]| {
        let pre = prefill_secs(&model, p, &opts);
        let t = Instant::now();
        generate(&model, &mut model.new_state(), p, &opts, |_| true).unwrap();
        t.elapsed().as_secs_f64() - pre
    };
    let spec = |p: &[u32], s: &SpecOptions| {
        let pre = prefill_secs(&model, p, &opts);
        let t = Instant::now();
        let (_, st) = generate_spec(&model, &mut model.new_state(), p, &opts, s, |_| true).unwrap();
        (t.elapsed().as_secs_f64() - pre, st)
    };
    println!("| drafts | adaptive | draft vocab | restore | tokens/step | acceptance per position | decode speedup |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut configs = vec![];
    for n in 1..=7 {
        configs.push(SpecOptions { adaptive: false, ..SpecOptions::new(n) });
    }
    for n in [2, 3, 4] {
        configs.push(SpecOptions { adaptive: false, draft_vocab: v / 4, ..SpecOptions::new(n) });
        configs.push(SpecOptions {
            adaptive: false,
            restore: Restore::Recompute,
            ..SpecOptions::new(n)
        });
    }
    for n in [3, 5, 7] {
        configs.push(SpecOptions { draft_vocab: v / 4, ..SpecOptions::new(n) });
    }
    for s in &configs {
        let (mut t_plain, mut t_spec, mut steps, mut step_tokens) = (0.0, 0.0, 0, 0);
        let (mut drafted, mut accepted) = ([0u64; 7], [0u64; 7]);
        for p in PROMPTS {
            t_plain += plain(p);
            let (t, st) = spec(p, s);
            t_spec += t;
            steps += st.steps;
            step_tokens += st.step_tokens;
            for j in 0..7 {
                drafted[j] += st.drafted[j];
                accepted[j] += st.accepted[j];
            }
        }
        let acc: Vec<String> = drafted
            .iter()
            .zip(&accepted)
            .take_while(|(d, _)| **d > 0)
            .map(|(d, a)| format!("{:.2}", *a as f64 / *d as f64))
            .collect();
        println!(
            "| {} | {} | {} | {:?} | {:.2} | {} | {:.2}x |",
            s.max_drafts,
            s.adaptive,
            if s.draft_vocab == 0 { v } else { s.draft_vocab },
            s.restore,
            step_tokens as f64 / steps as f64,
            acc.join(" "),
            t_plain / t_spec
        );
    }
}

/// Where a verify step's time goes: one trunk forward of `T` tokens at
/// position ~200 (plain and checkpointed) against `T` single-token forwards,
/// on `KORE_MTP_BENCH_THREADS` threads (default 2). Prints ms per call.
fn verify_cost() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf");
    let hf = HfModelDir::open(&dir).unwrap();
    let threads =
        std::env::var("KORE_MTP_BENCH_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let mut model = hf.model().unwrap();
    model.set_pool(&pool);
    let prompt: Vec<u32> =
        PROMPTS.iter().flat_map(|p| p.iter().copied()).cycle().take(200).collect();
    let mut base = model.new_state();
    model.forward_hidden(&mut base, &prompt).unwrap();
    let reps = 40;
    let time = |f: &mut dyn FnMut()| {
        f();
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() * 1e3 / reps as f64
    };
    println!(
        "| tokens | batched ms | checkpointed ms | T single-token ms | lm_head over T rows ms |"
    );
    println!("| --- | --- | --- | --- | --- |");
    let mut ckpt = Checkpoints::new();
    for t in 1..=8usize {
        let toks = &prompt[..t];
        let batched = time(&mut || {
            model.forward_hidden(&mut base.clone(), toks).unwrap();
        });
        let checkpointed = time(&mut || {
            model.forward_hidden_checkpointed(&mut base.clone(), toks, &mut ckpt).unwrap();
        });
        let single = time(&mut || {
            let mut s = base.clone();
            for &x in toks {
                model.forward_hidden(&mut s, &[x]).unwrap();
            }
        });
        let h = vec![0.1f32; t * model.config.hidden_size];
        let head = time(&mut || {
            model.logits(&h);
        });
        println!("| {t} | {batched:.3} | {checkpointed:.3} | {single:.3} | {head:.3} |");
    }
}
