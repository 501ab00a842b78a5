//! The engine against transformers: every fixture in tests/fixtures (made by
//! scripts/reference/gen_fixtures.py) must give the same logits (within 1e-4,
//! f32 math) and the same greedy continuation.

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::safetensors::Safetensors;
use kore_engine::sampling::argmax;
use kore_engine::{generate, DType, GenerateOptions, Logits, Model, SamplingParams, TensorView};

const TOL: f32 = 1e-4;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The model fixtures (directories with a reference.safetensors).
fn model_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("reference.safetensors").exists())
        .collect();
    v.sort();
    assert!(v.len() >= 4, "expected at least 4 reference fixtures, found {}", v.len());
    v
}

fn f32s(t: TensorView<'_>) -> Vec<f32> {
    assert_eq!(t.dtype, DType::F32);
    (0..t.numel()).map(|i| t.get_f32(i).unwrap()).collect()
}

fn i32s(t: TensorView<'_>) -> Vec<u32> {
    assert_eq!(t.dtype, DType::I32);
    t.data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect()
}

struct Case {
    prompt: Vec<u32>,
    prefill: Vec<f32>,
    generated: Vec<u32>,
    decode: Vec<f32>,
}

fn cases(dir: &Path) -> Vec<Case> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    (0..)
        .map_while(|i| {
            let get = |n: &str| st.get(&format!("{n}_{i}"));
            Some(Case {
                prompt: i32s(get("prompt")?),
                prefill: f32s(get("prefill_logits")?),
                generated: i32s(get("generated")?),
                decode: f32s(get("decode_logits")?),
            })
        })
        .collect()
}

fn assert_close(ours: &[f32], theirs: &[f32], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    let (mut worst, mut at) = (0.0f32, 0);
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let d = (a - b).abs();
        if d > worst || d.is_nan() {
            worst = d;
            at = i;
        }
    }
    assert!(
        worst <= TOL,
        "{what}: max |diff| {worst} at {at} (ours {}, transformers {})",
        ours[at],
        theirs[at]
    );
}

/// The engine options tests/reference_paths.rs passes to its re-runs
/// (`KORE_KERNELS`, `KORE_DELTANET_CHUNKED_MIN`, read here as the launcher
/// reads them: the engine library reads no environment).
fn options_from_env() -> kore_engine::EngineOptions {
    let kernels = std::env::var("KORE_KERNELS").ok().map(|v| {
        kore_engine::simd::Path::from_name(&v).unwrap_or_else(|| panic!("KORE_KERNELS={v}"))
    });
    let deltanet_chunked_min =
        std::env::var("KORE_DELTANET_CHUNKED_MIN").ok().map(|v| v.parse().unwrap());
    // f32 KV: the tolerance of these tests holds only with it (f16 is the default).
    let kv = kore_engine::state::KvPrecision::F32;
    kore_engine::EngineOptions { kernels, deltanet_chunked_min, kv }
}

fn load(dir: &Path) -> HfModelDir {
    HfModelDir::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The model of `hf` with the options from the environment.
fn open_model(hf: &HfModelDir) -> Model<'_> {
    let opts = options_from_env();
    let mut m = hf.model().unwrap();
    m.set_options(&opts).unwrap();
    if let Some(path) = opts.kernels {
        assert_eq!(m.kernels(), path, "Model::set_options sets the path");
    }
    m
}

#[test]
fn prefill_logits_match_transformers_at_every_position() {
    for dir in model_fixtures() {
        let hf = load(&dir);
        let model = open_model(&hf);
        let v = model.config.vocab_size;
        for (i, c) in cases(&dir).iter().enumerate() {
            let mut st = model.new_state();
            let logits = model.forward(&mut st, &c.prompt, Logits::All).unwrap();
            let what = format!("{} prompt {i} ({} tokens) prefill", dir.display(), c.prompt.len());
            assert_close(&logits, &c.prefill, &what);
            assert_eq!(logits.len(), c.prompt.len() * v);
        }
    }
}

#[test]
fn greedy_decoding_matches_transformers_token_for_token() {
    for dir in model_fixtures() {
        let hf = load(&dir);
        let model = open_model(&hf);
        let v = model.config.vocab_size;
        for (i, c) in cases(&dir).iter().enumerate() {
            let mut st = model.new_state();
            let mut logits = model.forward(&mut st, &c.prompt, Logits::Last).unwrap();
            for (j, &want) in c.generated.iter().enumerate() {
                let what = format!("{} prompt {i} decode step {j}", dir.display());
                assert_close(&logits, &c.decode[j * v..(j + 1) * v], &what);
                assert_eq!(argmax(&logits), want, "{what}: greedy token");
                logits = model.forward(&mut st, &[want], Logits::Last).unwrap();
            }
            // The generation loop gives the same continuation.
            let opts = GenerateOptions {
                max_tokens: c.generated.len(),
                stop_tokens: vec![],
                sampling: SamplingParams::greedy(),
            };
            let mut st = model.new_state();
            let out = generate(&model, &mut st, &c.prompt, &opts, |_| true).unwrap();
            assert_eq!(out.tokens, c.generated, "{} prompt {i}: generate()", dir.display());
            assert_eq!(st.position(), c.prompt.len() + c.generated.len() - 1);
        }
    }
}

#[test]
fn prefill_in_pieces_equals_one_batch() {
    // Splitting a prompt across forward calls (and single tokens) must not
    // change anything: the caches carry the sequence.
    for dir in model_fixtures() {
        let hf = load(&dir);
        let model = open_model(&hf);
        let v = model.config.vocab_size;
        let c = cases(&dir).into_iter().max_by_key(|c| c.prompt.len()).unwrap();
        let split = c.prompt.len() / 3 + 1;
        let mut st = model.new_state();
        let mut all = Vec::new();
        if split < c.prompt.len() {
            all.extend(model.forward(&mut st, &c.prompt[..split], Logits::All).unwrap());
        }
        for &t in &c.prompt[all.len() / v..] {
            all.extend(model.forward(&mut st, &[t], Logits::All).unwrap());
        }
        assert_close(&all, &c.prefill, &format!("{} piecewise prefill", dir.display()));
    }
}

#[test]
fn state_clone_is_a_checkpoint_and_reset_restarts() {
    let dir = fixtures_dir().join("mixed_f32_untied");
    let hf = load(&dir);
    let model: Model<'_> = open_model(&hf);
    let c = &cases(&dir)[1];
    let mut st = model.new_state();
    model.forward(&mut st, &c.prompt, Logits::Last).unwrap();
    let checkpoint = st.clone();
    let a = model.forward(&mut st, &[c.generated[0]], Logits::Last).unwrap();
    let mut st2 = checkpoint.clone();
    let b = model.forward(&mut st2, &[c.generated[0]], Logits::Last).unwrap();
    assert_eq!(a, b);
    st.reset();
    let again = model.forward(&mut st, &c.prompt, Logits::All).unwrap();
    assert_close(&again, &c.prefill, "after reset");
}

#[test]
fn mtp_weights_are_carried_and_the_trunk_hidden_state_is_exposed() {
    let hf = load(&fixtures_dir().join("mixed_bf16_mm_sharded_mtp"));
    let model = open_model(&hf);
    let mtp = model.mtp.as_ref().expect("mtp weights loaded");
    let h = model.config.hidden_size;
    assert_eq!((mtp.fc.rows(), mtp.fc.cols()), (h, 2 * h));
    assert_eq!(mtp.norm.len(), h);
    let mut st = model.new_state();
    let hidden = model.forward_hidden(&mut st, &[1, 2, 3]).unwrap();
    assert_eq!(st.last_hidden(), &hidden[2 * h..]);
    // lm_head over the exposed hidden state gives the logits.
    let mut st2 = model.new_state();
    let logits = model.forward(&mut st2, &[1, 2, 3], Logits::Last).unwrap();
    assert_eq!(model.logits(st.last_hidden()), logits);
    // Fixtures without MTP tensors load without them.
    let plain = load(&fixtures_dir().join("mixed_f32_untied"));
    assert!(open_model(&plain).mtp.is_none());
}
