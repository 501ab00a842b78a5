//! Speculative decoding with the MTP head changes nothing but speed: greedy
//! output is token-for-token that of plain decoding (reference fixtures with
//! an MTP head and the trained tiny model), the trunk state after rewinding
//! is the plain state, and sampled output follows the target distribution
//! (chi-square against the exact distribution computed with the trunk alone).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::sampling::argmax;
use kore_engine::{
    generate, generate_spec, GenerateOptions, Logits, Model, Restore, Sampler, SamplingParams,
    SpecOptions, Speculator,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn open(rel: &str) -> HfModelDir {
    let p = root().join(rel);
    HfModelDir::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Models with an MTP head and prompts for them.
fn cases() -> Vec<(&'static str, Vec<Vec<u32>>)> {
    vec![
        ("tests/fixtures/mtp_f32_untied", vec![vec![5, 77, 200, 31], vec![9]]),
        ("tests/fixtures/mixed_bf16_mm_sharded_mtp", vec![vec![1, 2, 3, 4, 5, 6, 7]]),
        ("tests/fixtures/moe_mtp_bf16_untied", vec![vec![3, 141, 59, 26, 5], vec![250]]),
        (
            "../../model-packs/tiny-hf",
            vec![
                // "ROMEO:\nBut soft, what light through yonder window breaks?\n"
                vec![
                    1767, 36, 46, 393, 470, 2566, 11, 479, 1238, 1559, 285, 1598, 1378, 303, 1373,
                    82, 559,
                ],
                // "KING HENRY:\nOnce more unto the breach, dear friends,"
                vec![601, 1516, 393, 46, 828, 515, 1242, 268, 727, 937, 11, 1050, 1042, 11],
            ],
        ),
    ]
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, stop_tokens: vec![], sampling: SamplingParams::greedy() }
}

#[test]
fn greedy_with_mtp_equals_greedy_without() {
    for (dir, prompts) in cases() {
        let hf = open(dir);
        let model = hf.model().unwrap();
        assert!(model.has_mtp(), "{dir}: no MTP head");
        let vocab = model.config.vocab_size;
        for prompt in &prompts {
            let opts = greedy(48);
            let plain = generate(&model, &mut model.new_state(), prompt, &opts, |_| true).unwrap();
            let variants = [
                (1, false, 0, Restore::Checkpoint),
                (2, false, 0, Restore::Checkpoint),
                (3, false, 0, Restore::Recompute),
                (4, true, 0, Restore::Checkpoint),
                (5, false, vocab / 4, Restore::Checkpoint),
                (7, false, 0, Restore::Checkpoint),
                (7, true, vocab / 2, Restore::Recompute),
            ];
            for (n, adaptive, draft_vocab, restore) in variants {
                let spec = SpecOptions { adaptive, draft_vocab, restore, ..SpecOptions::new(n) };
                let (out, stats) =
                    generate_spec(&model, &mut model.new_state(), prompt, &opts, &spec, |_| true)
                        .unwrap();
                assert_eq!(
                    out.tokens, plain.tokens,
                    "{dir} prompt {prompt:?}: --mtp {n} adaptive {adaptive} draft_vocab {draft_vocab} {restore:?}"
                );
                assert_eq!(out.stop, plain.stop);
                assert!(stats.steps > 0 && stats.tokens_per_step() >= 1.0);
                // Every output token but the first came from a verify step.
                assert!(stats.step_tokens + 1 >= out.tokens.len(), "{stats:?}");
            }
        }
    }
}

#[test]
fn stop_tokens_and_budget_end_speculative_generation_like_plain() {
    let hf = open("../../model-packs/tiny-hf");
    let model = hf.model().unwrap();
    let prompt = &cases()[2].1[0];
    let plain = generate(&model, &mut model.new_state(), prompt, &greedy(30), |_| true).unwrap();
    // Stop at the 11th generated token, wherever it falls inside a step.
    let mut opts = greedy(30);
    opts.stop_tokens = vec![plain.tokens[10]];
    let want = generate(&model, &mut model.new_state(), prompt, &opts, |_| true).unwrap();
    for n in [1, 3, 7] {
        let spec = SpecOptions { adaptive: false, ..SpecOptions::new(n) };
        let (got, _) =
            generate_spec(&model, &mut model.new_state(), prompt, &opts, &spec, |_| true).unwrap();
        assert_eq!((got.tokens, got.stop), (want.tokens.clone(), want.stop), "--mtp {n}");
        for max in [1, 2, 5] {
            let (got, _) =
                generate_spec(&model, &mut model.new_state(), prompt, &greedy(max), &spec, |_| {
                    true
                })
                .unwrap();
            assert_eq!(got.tokens, plain.tokens[..max], "--mtp {n} max {max}");
        }
    }
}

#[test]
fn the_trained_mtp_head_drafts_accepted_tokens() {
    // A wrongly wired head (order of the concat, pre-norm hidden, position
    // offset) drafts junk; the trained one agrees with the trunk often.
    let hf = open("../../model-packs/tiny-hf");
    let model = hf.model().unwrap();
    let spec = SpecOptions { adaptive: false, ..SpecOptions::new(3) };
    let (mut drafted, mut accepted) = (0u64, 0u64);
    for prompt in &cases()[2].1 {
        let (_, stats) =
            generate_spec(&model, &mut model.new_state(), prompt, &greedy(64), &spec, |_| true)
                .unwrap();
        drafted += stats.drafted[0];
        accepted += stats.accepted[0];
        assert!(stats.tokens_per_step() > 1.0, "{stats:?}");
    }
    let rate = accepted as f64 / drafted as f64;
    assert!(rate > 0.3, "first-draft acceptance {rate}");
}

#[test]
fn rewound_state_equals_the_plain_state() {
    let hf = open("../../model-packs/tiny-hf");
    let model = hf.model().unwrap();
    let prompt = &cases()[2].1[1];
    for restore in [Restore::Checkpoint, Restore::Recompute] {
        let spec = SpecOptions { adaptive: false, restore, ..SpecOptions::new(4) };
        let mut st = model.new_state();
        let mut sp = Speculator::start(
            &model,
            &mut st,
            prompt,
            Sampler::new(SamplingParams::greedy()),
            spec,
        )
        .unwrap();
        let mut seq = prompt.clone();
        for _ in 0..6 {
            let pending = sp.pending();
            let new = sp.step(&mut st, 7).unwrap();
            seq.push(pending);
            seq.extend_from_slice(&new[..new.len() - 1]);
            assert_eq!(st.position(), seq.len());
        }
        let mut plain = model.new_state();
        model.forward(&mut plain, &seq, Logits::Last).unwrap();
        let a = model.forward(&mut plain, &[sp.pending()], Logits::Last).unwrap();
        let b = model.forward(&mut st, &[sp.pending()], Logits::Last).unwrap();
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{restore:?}: logits differ by {worst}");
        assert_eq!(argmax(&a), argmax(&b));
    }
}

/// Exact probability of every 3-token continuation under the filtered target.
fn exact_joint(
    model: &Model<'_>,
    prompt: &[u32],
    params: SamplingParams,
) -> HashMap<Vec<u32>, f64> {
    let s = Sampler::new(params);
    let mut out = HashMap::new();
    let mut stack = vec![(prompt.to_vec(), vec![], 1.0f64)];
    while let Some((ctx, gen, p)) = stack.pop() {
        if gen.len() == 3 {
            out.insert(gen, p);
            continue;
        }
        let logits = model.forward(&mut model.new_state(), &ctx, Logits::Last).unwrap();
        for (t, q) in s.distribution(&logits) {
            let mut c = ctx.clone();
            c.push(t);
            let mut g = gen.clone();
            g.push(t);
            stack.push((c, g, p * q));
        }
    }
    out
}

#[test]
fn speculative_sampling_keeps_the_target_distribution() {
    let hf = open("../../model-packs/tiny-hf");
    let model = hf.model().unwrap();
    let prompt = &cases()[2].1[0][..4]; // "ROMEO:\n"
    let base = SamplingParams { temperature: 1.3, top_k: 4, top_p: 1.0, min_p: 0.0, seed: 0 };
    let exact = exact_joint(&model, prompt, base);
    let total: f64 = exact.values().sum();
    assert!((total - 1.0).abs() < 1e-9, "{total}");
    let samples = 2500;
    let spec = SpecOptions { adaptive: false, draft_vocab: 2048, ..SpecOptions::new(2) };
    let mut counts: HashMap<Vec<u32>, u64> = HashMap::new();
    let (mut drafted, mut accepted, mut second) = (0, 0, 0);
    for seed in 0..samples {
        // Two drafts a step, output cut to 3 tokens: the first tokens of a
        // sequence from the target distribution follow it too.
        let sampler = Sampler::new(SamplingParams { seed: seed * 7919 + 1, ..base });
        let mut st = model.new_state();
        let mut sp = Speculator::start(&model, &mut st, prompt, sampler, spec).unwrap();
        let mut out = vec![sp.pending()];
        while out.len() < 3 {
            out.extend(sp.step(&mut st, 2).unwrap());
        }
        out.truncate(3);
        *counts.entry(out).or_default() += 1;
        drafted += sp.stats.drafted.iter().sum::<u64>();
        accepted += sp.stats.accepted.iter().sum::<u64>();
        second += sp.stats.accepted[1];
    }
    // Both the accept and the residual paths were exercised.
    assert!(accepted > 500 && drafted - accepted > 500, "accepted {accepted} of {drafted}");
    assert!(second > 200, "second drafts accepted {second}");
    assert!(counts.keys().all(|k| exact.contains_key(k)), "a sequence the target cannot produce");
    // Chi-square over cells with expected count >= 5, the rest pooled.
    let n = samples as f64;
    let (mut chi2, mut cells, mut pooled_e, mut pooled_o, mut tv) = (0.0, 0, 0.0, 0.0, 0.0);
    for (k, &p) in &exact {
        let o = *counts.get(k).unwrap_or(&0) as f64;
        tv += (o / n - p).abs() / 2.0;
        if p * n >= 5.0 {
            chi2 += (o - p * n).powi(2) / (p * n);
            cells += 1;
        } else {
            pooled_e += p * n;
            pooled_o += o;
        }
    }
    if pooled_e > 0.0 {
        chi2 += (pooled_o - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    // 99.9th percentile of chi-square (Wilson-Hilferty, z = 3.09).
    let df = (cells - 1) as f64;
    let a = 2.0 / (9.0 * df);
    let critical = df * (1.0 - a + 3.09 * a.sqrt()).powi(3);
    assert!(
        chi2 < critical,
        "chi2 {chi2:.1} over {cells} cells (critical {critical:.1}), TV {tv:.3}"
    );
    assert!(tv < 0.08, "total variation {tv:.3}");
    println!("chi2 {chi2:.1} over {cells} cells (critical {critical:.1}), TV {tv:.3}, accepted {accepted} of {drafted} ({second} second drafts)");
}
