//! Qwen3.5 MoE beyond tests/reference.rs (which checks the MoE fixtures'
//! logits and greedy tokens against transformers like the dense ones): the
//! MoE MTP head against its PyTorch reference (tests/fixtures/
//! moe_mtp_bf16_untied, scripts/reference/gen_moe_fixtures.py), and that a
//! forward reads only the routed experts, each once.

use std::path::{Path, PathBuf};

use kore_engine::hf::HfModelDir;
use kore_engine::model::{Ffn, Mixer, Model};
use kore_engine::safetensors::Safetensors;
use kore_engine::{DType, Logits, MtpState, SeqInput, TensorView};

const TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
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
    let worst = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= TOL, "{what}: max |diff| {worst}");
}

#[test]
fn moe_mtp_head_matches_the_reference_batched_and_chained() {
    let dir = fixture("moe_mtp_bf16_untied");
    let hf = HfModelDir::open(&dir).unwrap();
    let model = hf.model().unwrap();
    let mtp = model.mtp.as_ref().expect("MTP head");
    assert!(matches!(mtp.layer.mlp, Ffn::Moe(_)), "the MTP layer of an MoE model is MoE");
    let bytes = std::fs::read(dir.join("mtp_reference.safetensors")).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    let get = |n: &str| st.get(n).unwrap_or_else(|| panic!("{n} missing"));
    let prompt = i32s(get("prompt"));
    let (h, v) = (model.config.hidden_size, model.config.vocab_size);
    // f32 KV: the 1e-4 tolerance holds only with it (f16 is the default).
    let f32_kv = kore_engine::state::KvPrecision::F32;
    let mut s = kore_engine::State::with_kv(&model.config, f32_kv);
    let trunk = model.forward_hidden(&mut s, &prompt).unwrap();
    assert_close(&trunk, &f32s(get("trunk_hidden")), "trunk final normed hidden");
    let mut shifted = prompt[1..].to_vec();
    shifted.push(i32s(get("next"))[0]);
    let mut ms = MtpState::with_kv(f32_kv);
    let g = model.mtp_forward(&mut ms, &shifted, &trunk).unwrap();
    assert_close(&g, &f32s(get("mtp_hidden")), "MTP normed output");
    assert_close(&model.logits(&g), &f32s(get("mtp_logits")), "MTP logits");
    let chain_logits = f32s(get("chain_logits"));
    let mut last = g[g.len() - h..].to_vec();
    for (j, &d) in i32s(get("chain_tokens")).iter().enumerate() {
        last = model.mtp_forward(&mut ms, &[d], &last).unwrap();
        let what = format!("chain {j}");
        assert_close(&model.logits(&last), &chain_logits[j * v..(j + 1) * v], &what);
    }
}

/// Bytes of the routed experts of one layer's MoE block, per expert.
fn expert_bytes(model: &Model<'_>) -> (usize, usize, usize) {
    let Ffn::Moe(m) = &model.layers[0].mlp else { panic!("not an MoE model") };
    let e = &m.experts[0];
    let per = e.gate_proj.weight_bytes() + e.up_proj.weight_bytes() + e.down_proj.weight_bytes();
    (per, m.top_k, m.experts.len())
}

#[test]
fn decode_reads_the_routed_experts_and_prefill_each_expert_once() {
    for name in ["moe_f32_untied", "moe_bf16_tied_mm_fused"] {
        let hf = HfModelDir::open(&fixture(name)).unwrap();
        let model = hf.model().unwrap();
        let (per, k, e) = expert_bytes(&model);
        let layers = model.layers.len() as u64;
        let mut s = model.new_state();
        let prompt: Vec<u32> = (0..64).map(|i| (i * 37 % 250) as u32).collect();
        model.forward(&mut s, &prompt, Logits::Last).unwrap();
        let (bytes, passes) = model.expert_reads();
        // 64 tokens x k experts over e experts: each expert at most once a layer.
        assert!(passes <= layers * e as u64 && passes > layers * k as u64, "{name}: {passes}");
        assert_eq!(bytes, passes * per as u64, "{name}");
        model.forward(&mut s, &[5], Logits::Last).unwrap();
        let (b2, p2) = model.expert_reads();
        assert_eq!(p2 - passes, layers * k as u64, "{name}: one token reads k experts a layer");
        assert_eq!(b2 - bytes, layers * (k * per) as u64);
        // Two sequences in one step read the union of their experts, once.
        let mut a = s.clone();
        let mut b = s.clone();
        let mut seqs = [
            SeqInput { state: &mut a, tokens: &[7], logits: true },
            SeqInput { state: &mut b, tokens: &[200], logits: true },
        ];
        model.forward_batch(&mut seqs).unwrap();
        let (_, p3) = model.expert_reads();
        let step = p3 - p2;
        assert!(step >= layers * k as u64 && step <= 2 * layers * k as u64, "{name}: {step}");
    }
}

#[test]
fn weight_bytes_per_token_counts_the_active_parameters() {
    let hf = HfModelDir::open(&fixture("moe_f32_untied")).unwrap();
    let model = hf.model().unwrap();
    let (per, k, e) = expert_bytes(&model);
    let Ffn::Moe(m) = &model.layers[0].mlp else { unreachable!() };
    let shared = &m.shared_expert;
    let fixed = m.router.weight_bytes()
        + m.shared_expert_gate.weight_bytes()
        + shared.gate_proj.weight_bytes()
        + shared.up_proj.weight_bytes()
        + shared.down_proj.weight_bytes();
    let mixers: usize = model
        .layers
        .iter()
        .map(|l| match &l.mixer {
            Mixer::Linear(d) => [&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a]
                .iter()
                .chain([&&d.out_proj])
                .map(|x| x.weight_bytes())
                .sum::<usize>(),
            Mixer::Full(a) => {
                [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj].iter().map(|x| x.weight_bytes()).sum()
            }
        })
        .sum();
    let layers = model.layers.len();
    let want = mixers + layers * (fixed + k * per) + model.lm_head.weight_bytes();
    assert_eq!(model.weight_bytes_per_token(), want);
    assert!(k < e, "the fixture routes to a subset");
}

#[test]
fn bench_counts_the_experts_batched_decode_reads() {
    use kore_engine::bench::{run, BenchOptions};
    let hf = HfModelDir::open(&fixture("moe_f32_untied")).unwrap();
    let model = hf.model().unwrap();
    let start = std::time::Instant::now();
    let clock = || start.elapsed().as_nanos() as u64;
    let opts = |concurrency| BenchOptions {
        prompt_tokens: 8,
        decode_tokens: 6,
        concurrency,
        ..Default::default()
    };
    let one = run(&model, 10.0, &clock, &opts(1), &mut |_| {}).unwrap();
    assert_eq!(one.weight_bytes_per_step, model.weight_bytes_per_token() as u64);
    // Four sequences from different tokens route apart: a step reads more
    // experts than one token's, at most every expert of every layer.
    let four = run(&model, 10.0, &clock, &opts(4), &mut |_| {}).unwrap();
    let (per, k, e) = expert_bytes(&model);
    let layers = model.layers.len();
    let fixed = model.weight_bytes_per_token() - layers * k * per;
    assert!(four.weight_bytes_per_step > one.weight_bytes_per_step, "{four:?}");
    assert!(four.weight_bytes_per_step <= (fixed + layers * e.min(4 * k) * per) as u64);
}
