//! Batched forwards change nothing but speed: every sequence of a
//! `Model::forward_batch` gets the greedy and seeded-sampled tokens it gets
//! alone, whether its neighbours are prefilling, decoding or joining late, on
//! every reference fixture and the trained tiny model, serial and threaded,
//! on every kernel path this CPU runs. Every path's row kernels do the same
//! arithmetic for a token whatever the tile it is in, so the logits are
//! bit-for-bit equal on all of them.

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::pool::ThreadPool;
use kore_engine::simd::Path as Kernels;
use kore_engine::{EngineOptions, ForwardError, Logits, Model, Sampler, SamplingParams};
use kore_engine::{SeqInput, State};

fn open(rel: &str) -> HfModelDir {
    let p: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    HfModelDir::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every kernel path this CPU runs (each test sets it on its own models:
/// the path is a model's, so the tests run in parallel).
fn paths() -> Vec<Kernels> {
    Kernels::ALL.into_iter().filter(|p| p.supported()).collect()
}

const MODELS: [&str; 9] = [
    "tests/fixtures/full_f32_tied_mm",
    "tests/fixtures/linear_bf16_tied",
    "tests/fixtures/mixed_bf16_mm_sharded_mtp",
    "tests/fixtures/mixed_f32_untied",
    "tests/fixtures/mtp_f32_untied",
    "tests/fixtures/moe_f32_untied",
    "tests/fixtures/moe_bf16_tied_mm_fused",
    "tests/fixtures/moe_mtp_bf16_untied",
    "../../model-packs/tiny-hf",
];

/// Prompts of different lengths (ids folded into the vocabulary).
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    [3usize, 11, 1, 29, 7]
        .iter()
        .enumerate()
        .map(|(j, &n)| (0..n).map(|i| ((i * 37 + j * 101 + 5) % vocab) as u32).collect())
        .collect()
}

/// Sampling of sequence `j`: even ones greedy, odd ones seeded sampling.
fn sampler(j: usize) -> Sampler {
    if j & 1 == 0 {
        Sampler::new(SamplingParams::greedy())
    } else {
        Sampler::new(SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            seed: 1000 + j as u64,
        })
    }
}

/// One sequence alone: prefill in one call, then `n` tokens one by one.
fn alone(model: &Model<'_>, prompt: &[u32], j: usize, n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut state = model.new_state();
    let mut s = sampler(j);
    let mut logits = model.forward(&mut state, prompt, Logits::Last).unwrap();
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = s.sample(&logits);
        toks.push(t);
        all.push(logits.clone());
        logits = model.forward(&mut state, &[t], Logits::Last).unwrap();
    }
    (toks, all)
}

/// All sequences together: sequence `j` joins at step `j` with its whole
/// prompt (so prefill rows share forwards with others' decode rows).
fn together(model: &Model<'_>, prompts: &[Vec<u32>], n: usize) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut states: Vec<State> = prompts.iter().map(|_| model.new_state()).collect();
    let mut samplers: Vec<Sampler> = (0..prompts.len()).map(sampler).collect();
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); prompts.len()];
    let mut step = 0;
    while out.iter().any(|o| o.0.len() < n) {
        let inputs: Vec<Vec<u32>> = (0..prompts.len())
            .map(|j| match out[j].0.last() {
                _ if j > step || out[j].0.len() >= n => Vec::new(),
                None => prompts[j].clone(),
                Some(&t) => vec![t],
            })
            .collect();
        let live: Vec<usize> = (0..prompts.len()).filter(|&j| !inputs[j].is_empty()).collect();
        let mut seqs: Vec<SeqInput<'_>> = states
            .iter_mut()
            .zip(&inputs)
            .filter(|(_, i)| !i.is_empty())
            .map(|(state, tokens)| SeqInput { state, tokens, logits: true })
            .collect();
        let logits = model.forward_batch(&mut seqs).unwrap();
        for (&j, l) in live.iter().zip(logits) {
            let t = samplers[j].sample(&l);
            out[j].0.push(t);
            out[j].1.push(l);
        }
        step += 1;
    }
    out
}

#[test]
fn each_sequence_of_a_batch_equals_it_alone() {
    let pool = ThreadPool::new(2);
    let models: Vec<HfModelDir> = MODELS.iter().map(|d| open(d)).collect();
    for path in paths() {
        for (dir, hf) in MODELS.iter().zip(&models) {
            let mut model = hf.model().unwrap();
            model.set_kernels(path).unwrap();
            for threaded in [false, true] {
                if threaded {
                    model.set_pool(&pool);
                }
                let ps = prompts(model.config.vocab_size);
                let batched = together(&model, &ps, 12);
                for (j, p) in ps.iter().enumerate() {
                    let at = format!("{dir} {} threaded={threaded} seq {j}", path.name());
                    let (toks, logits) = alone(&model, p, j, 12);
                    assert_eq!(batched[j].0, toks, "{at}: tokens");
                    assert!(batched[j].1 == logits, "{at}: logits differ");
                }
            }
        }
    }
}

#[test]
fn prefill_in_chunks_equals_one_call_on_short_contexts() {
    let hf = open("../../model-packs/tiny-hf");
    let mut model = hf.model().unwrap();
    let prompt: Vec<u32> = (0..100u32).map(|i| (i * 53 + 7) % 4096).collect();
    for path in paths() {
        model.set_kernels(path).unwrap();
        let whole = model.forward(&mut model.new_state(), &prompt, Logits::Last).unwrap();
        for chunk in [17, 32, 64] {
            let mut state = model.new_state();
            let mut last = Vec::new();
            for c in prompt.chunks(chunk) {
                let mut seqs = [SeqInput { state: &mut state, tokens: c, logits: true }];
                last = model.forward_batch(&mut seqs).unwrap().remove(0);
            }
            let at = format!("{} chunks of {chunk}", path.name());
            assert!(last == whole, "{at}: logits differ from one call");
        }
    }
}

#[test]
fn a_bad_sequence_is_named_and_changes_nothing() {
    let hf = open("tests/fixtures/mixed_f32_untied");
    let model = hf.model().unwrap();
    let vocab = model.config.vocab_size as u32;
    let (mut a, mut b) = (model.new_state(), model.new_state());
    let (good, bad) = ([1u32, 2, 3], [4u32, vocab]);
    let mut seqs = [
        SeqInput { state: &mut a, tokens: &good, logits: true },
        SeqInput { state: &mut b, tokens: &bad, logits: true },
    ];
    let err = model.forward_batch(&mut seqs).unwrap_err();
    assert_eq!(err.index, 1);
    assert!(matches!(err.error, ForwardError::TokenOutOfRange { token, .. } if token == vocab));
    assert_eq!((a.position(), b.position()), (0, 0), "a refused batch moved a state");
    let mut seqs = [SeqInput { state: &mut a, tokens: &good, logits: false }];
    let out = model.forward_batch(&mut seqs).unwrap();
    assert!(out[0].is_empty(), "logits returned though not asked for");
    assert_eq!(a.position(), 3);
}

/// Enough sequences decoding together that the batched DeltaNet mixer splits
/// its decode steps across the pool (not only the prefill steps): each still
/// gets the logits it gets alone, bit for bit, on every path.
#[test]
fn many_decoding_sequences_split_across_the_pool_equal_alone() {
    let hf = open("../../model-packs/tiny-hf");
    let mut model = hf.model().unwrap();
    let pool = ThreadPool::new(3);
    model.set_pool(&pool);
    let c = &model.config;
    // One decode token per sequence: the mixer goes parallel from 2^16 state elements.
    let per_token = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
    let seqs = (1usize << 16).div_ceil(per_token) + 1;
    let vocab = c.vocab_size;
    let ps: Vec<Vec<u32>> = (0..seqs)
        .map(|j| (0..2 + j % 3).map(|i| ((i * 31 + j * 7 + 1) % vocab) as u32).collect())
        .collect();
    for path in paths() {
        model.set_kernels(path).unwrap();
        let mut states: Vec<State> = ps.iter().map(|_| model.new_state()).collect();
        let mut next: Vec<u32> = ps
            .iter()
            .zip(&mut states)
            .map(|(p, s)| argmax(&model.forward(s, p, Logits::Last).unwrap()))
            .collect();
        let mut alone: Vec<State> = states.clone();
        for step in 0..6 {
            let mut inputs: Vec<SeqInput<'_>> = states
                .iter_mut()
                .zip(&next)
                .map(|(state, t)| SeqInput { state, tokens: std::slice::from_ref(t), logits: true })
                .collect();
            let batched = model.forward_batch(&mut inputs).unwrap();
            for (j, l) in batched.iter().enumerate() {
                let own = model.forward(&mut alone[j], &[next[j]], Logits::Last).unwrap();
                assert!(*l == own, "{} step {step} seq {j}: logits differ", path.name());
                next[j] = argmax(l);
            }
        }
    }
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// With the chunked DeltaNet form forced for prompts, a batch still gives
/// each sequence what it gets alone (both take the chunked form for the same
/// prompt rows).
#[test]
fn forced_chunked_prefill_batched_equals_alone() {
    let hf = open("../../model-packs/tiny-hf");
    let mut model = hf.model().unwrap();
    let pool = ThreadPool::new(2);
    model.set_pool(&pool);
    let chunked = EngineOptions { deltanet_chunked_min: Some(2), ..Default::default() };
    model.set_options(&chunked).unwrap();
    assert_eq!(model.deltanet_chunked_min(), 2);
    let ps = prompts(model.config.vocab_size);
    let batched = together(&model, &ps, 6);
    let mut differs = Vec::new();
    for (j, p) in ps.iter().enumerate() {
        if alone(&model, p, j, 6) != batched[j] {
            differs.push(j);
        }
    }
    assert!(differs.is_empty(), "sequences {differs:?} differ from alone");
}
