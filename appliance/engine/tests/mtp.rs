//! The MTP head against a PyTorch implementation of vLLM's
//! `Qwen3_5MultiTokenPredictor` whose decoder layer is transformers' own
//! (tests/fixtures/mtp_f32_untied, made by scripts/reference/gen_mtp_fixtures.py).

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::safetensors::Safetensors;
use kore_engine::{DType, ForwardError, MtpError, MtpState, TensorView};

const TOL: f32 = 1e-4;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mtp_f32_untied")
}

fn f32s(t: TensorView<'_>) -> Vec<f32> {
    assert_eq!(t.dtype, DType::F32);
    (0..t.numel()).map(|i| t.get_f32(i).unwrap()).collect()
}

fn i32s(t: TensorView<'_>) -> Vec<u32> {
    assert_eq!(t.dtype, DType::I32);
    t.data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect()
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
        "{what}: max |diff| {worst} at {at} (ours {}, ref {})",
        ours[at],
        theirs[at]
    );
}

struct Reference {
    prompt: Vec<u32>,
    next: u32,
    trunk_hidden: Vec<f32>,
    mtp_hidden: Vec<f32>,
    mtp_logits: Vec<f32>,
    chain_tokens: Vec<u32>,
    chain_logits: Vec<f32>,
}

fn reference() -> Reference {
    let bytes = std::fs::read(fixture().join("mtp_reference.safetensors")).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    let get = |n: &str| st.get(n).unwrap_or_else(|| panic!("{n} missing"));
    Reference {
        prompt: i32s(get("prompt")),
        next: i32s(get("next"))[0],
        trunk_hidden: f32s(get("trunk_hidden")),
        mtp_hidden: f32s(get("mtp_hidden")),
        mtp_logits: f32s(get("mtp_logits")),
        chain_tokens: i32s(get("chain_tokens")),
        chain_logits: f32s(get("chain_logits")),
    }
}

#[test]
fn mtp_head_matches_the_reference_batched_and_chained() {
    let hf = HfModelDir::open(&fixture()).unwrap();
    let model = hf.model().unwrap();
    assert!(model.has_mtp());
    let r = reference();
    let (h, v) = (model.config.hidden_size, model.config.vocab_size);
    // f32 KV: the 1e-4 tolerance holds only with it (f16 is the default).
    let mut st = kore_engine::State::with_kv(&model.config, kore_engine::state::KvPrecision::F32);
    let trunk = model.forward_hidden(&mut st, &r.prompt).unwrap();
    assert_close(&trunk, &r.trunk_hidden, "trunk final normed hidden");

    // Positions 0..T-1 in one batch: tokens x_1..x_T, hidden h_0..h_{T-1}.
    let mut shifted = r.prompt[1..].to_vec();
    shifted.push(r.next);
    let mut ms = MtpState::with_kv(kore_engine::state::KvPrecision::F32);
    let g = model.mtp_forward(&mut ms, &shifted, &trunk).unwrap();
    assert_eq!(ms.position(), r.prompt.len());
    assert_close(&g, &r.mtp_hidden, "MTP normed output");
    assert_close(&model.logits(&g), &r.mtp_logits, "MTP logits");

    // Chained drafts: each feeds the previous normed MTP output back.
    let mut last = g[g.len() - h..].to_vec();
    for (j, &d) in r.chain_tokens.iter().enumerate() {
        last = model.mtp_forward(&mut ms, &[d], &last).unwrap();
        assert_close(
            &model.logits(&last),
            &r.chain_logits[j * v..(j + 1) * v],
            &format!("chain {j}"),
        );
    }
}

#[test]
fn mtp_in_pieces_and_after_truncate_equals_one_batch() {
    let hf = HfModelDir::open(&fixture()).unwrap();
    let model = hf.model().unwrap();
    let r = reference();
    let h = model.config.hidden_size;
    let mut shifted = r.prompt[1..].to_vec();
    shifted.push(r.next);
    let split = 9;
    // f32 KV: compared with the reference at 1e-4 (f16 is the default).
    let mut ms = MtpState::with_kv(kore_engine::state::KvPrecision::F32);
    let mut g =
        model.mtp_forward(&mut ms, &shifted[..split], &r.trunk_hidden[..split * h]).unwrap();
    // Write garbage rows, then forget them: the cache must be as before.
    model.mtp_forward(&mut ms, &[3, 4], &r.trunk_hidden[..2 * h]).unwrap();
    ms.truncate(split);
    g.extend(model.mtp_forward(&mut ms, &shifted[split..], &r.trunk_hidden[split * h..]).unwrap());
    assert_close(&g, &r.mtp_hidden, "piecewise MTP");
}

#[test]
fn mtp_bad_inputs_are_typed_errors_and_change_nothing() {
    let hf = HfModelDir::open(&fixture()).unwrap();
    let model = hf.model().unwrap();
    let h = model.config.hidden_size;
    let mut ms = MtpState::new();
    let hidden = vec![0.5; 2 * h];
    assert_eq!(
        model.mtp_forward(&mut ms, &[1], &hidden).unwrap_err(),
        MtpError::HiddenShape { expected: h, got: 2 * h }
    );
    let v = model.config.vocab_size as u32;
    assert!(matches!(
        model.mtp_forward(&mut ms, &[1, v], &hidden).unwrap_err(),
        MtpError::Forward(ForwardError::TokenOutOfRange { .. })
    ));
    assert_eq!(
        model.mtp_forward(&mut ms, &[], &[]).unwrap_err(),
        MtpError::Forward(ForwardError::Empty)
    );
    assert_eq!(ms.position(), 0);
    let plain = HfModelDir::open(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixed_f32_untied"),
    )
    .unwrap();
    let plain = plain.model().unwrap();
    let hp = plain.config.hidden_size;
    assert_eq!(plain.mtp_forward(&mut ms, &[1], &vec![0.0; hp]).unwrap_err(), MtpError::NoMtpHead);
}
