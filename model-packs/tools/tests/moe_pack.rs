//! Qwen3.5 MoE checkpoints become packs: Hugging Face bf16/f32 ones (experts
//! per expert or fused as transformers keeps them) and a ModelOpt NVFP4 one
//! (tests/fixtures/moe_nvfp4_modelopt, scripts/reference/gen_moe_nvfp4_fixture.py)
//! whose import must reproduce transformers on its dequantized weights.

mod common;

use common::temp_dir;
use kore_engine::safetensors::Safetensors;
use kore_engine::{DType as EDType, Logits, TensorView};
use kore_pack::import::{import, ImportOptions, QuantMode};
use kore_pack::manifest::Scheme;
use kore_pack::nvfp4;
use kore_pack::pack::verify;
use kore_pack::synth::byte_level_tokenizer;
use kore_pack::{LinearRef, NoProgress, Pack};
use std::path::{Path, PathBuf};

fn engine_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../appliance/engine/tests/fixtures").join(name)
}

/// A copy of checkpoint `src` with a byte-level tokenizer for its 256 ids.
fn checkpoint(src: &Path, tag: &str) -> PathBuf {
    let dir = temp_dir(tag);
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), byte_level_tokenizer(256, &[]).unwrap()).unwrap();
    dir
}

fn logits_of(model: &kore_engine::Model<'_>, tokens: &[u32]) -> Vec<f32> {
    model.forward(&mut model.new_state(), tokens, Logits::All).unwrap()
}

fn floats(t: TensorView<'_>) -> Vec<f32> {
    (0..t.numel()).map(|i| t.get_f32(i).unwrap()).collect()
}

fn ids(t: TensorView<'_>) -> Vec<u32> {
    assert_eq!(t.dtype, EDType::I32);
    t.data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect()
}

/// Sets `model` to a kernel path whose NVFP4 products take f32 activations
/// (the `avx512vnni` and `avx2` paths quantize them to int8 by design; their
/// own agreement tests are in kore-engine) and to f32 KV (the reference's
/// tolerance holds with it; f16 is the default).
fn f32_activations(model: &mut kore_engine::Model<'_>) {
    use kore_engine::simd::Path as K;
    let kernels = match model.kernels() {
        K::Avx512Vnni | K::Amx => K::Avx512,
        K::Avx2 => K::Generic,
        other => other,
    };
    let kv = kore_engine::state::KvPrecision::F32;
    let opts = kore_engine::EngineOptions { kernels: Some(kernels), kv, ..Default::default() };
    model.set_options(&opts).unwrap();
}

#[test]
fn modelopt_nvfp4_moe_checkpoint_matches_its_dequantized_reference() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/moe_nvfp4_modelopt");
    let hf = checkpoint(&fixture, "moe-modelopt");
    let out = temp_dir("moe-modelopt-pack");
    let s = import(&hf, &out, &ImportOptions::default(), &NoProgress).unwrap();
    // 2 layers x (8 experts x 3 + the shared expert's 3), copied byte for byte.
    assert_eq!((s.nvfp4_modules, s.copied_nvfp4), (54, 54));
    verify(&out, &NoProgress).unwrap();
    let pack = Pack::open(&out).unwrap();
    assert_eq!(pack.manifest().architecture, "qwen3_5_moe_text");
    assert_eq!(pack.manifest().quantization.producer.as_deref(), Some("modelopt"));
    // The router and the shared expert's gate keep the checkpoint's precision.
    for m in ["model.layers.1.mlp.gate", "model.layers.1.mlp.shared_expert_gate"] {
        let Some(LinearRef::Float(t)) = pack.linear(m) else { panic!("{m} is not plain") };
        assert_eq!(t.dtype, kore_pack::safetensors::DType::BF16, "{m}");
    }
    let src = std::fs::read(fixture.join("model.safetensors")).unwrap();
    let src = Safetensors::parse(&src).unwrap();
    let m = "model.layers.1.mlp.experts.5.down_proj";
    let Some(LinearRef::Nvfp4 { weight, .. }) = pack.linear(m) else { panic!("{m}") };
    let theirs = src.get("model.language_model.layers.1.mlp.experts.5.down_proj.weight").unwrap();
    assert_eq!(weight.data, theirs.data, "NVFP4 codes are copied as they are");

    let mut model = pack.model().unwrap();
    f32_activations(&mut model);
    let refs = std::fs::read(fixture.join("reference.safetensors")).unwrap();
    let refs = Safetensors::parse(&refs).unwrap();
    for i in 0..2 {
        let prompt = ids(refs.get(&format!("prompt_{i}")).unwrap());
        let want = floats(refs.get(&format!("prefill_logits_{i}")).unwrap());
        let got = logits_of(&model, &prompt);
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-4, "prompt {i}: max |logit diff| {worst}");
        let opts = kore_engine::GenerateOptions {
            max_tokens: 10,
            stop_tokens: vec![],
            sampling: kore_engine::SamplingParams::greedy(),
        };
        let out = kore_engine::generate(&model, &mut model.new_state(), &prompt, &opts, |_| true);
        let greedy = ids(refs.get(&format!("generated_{i}")).unwrap());
        assert_eq!(out.unwrap().tokens, greedy, "prompt {i}: greedy tokens");
    }
}

#[test]
fn hf_moe_checkpoints_import_exactly_and_quantize_each_expert() {
    for (name, fused) in [("moe_f32_untied", false), ("moe_bf16_tied_mm_fused", true)] {
        let hf = checkpoint(&engine_fixture(name), name);
        let dir = kore_engine::hf::HfModelDir::open(&hf).unwrap();
        let tokens = [3u32, 200, 17, 42, 99, 3, 250, 1];
        let want = logits_of(&dir.model().unwrap(), &tokens);
        // Kept as they are: the pack runs exactly like its source.
        let kept = temp_dir(&format!("{name}-keep"));
        let opts = ImportOptions { quant: QuantMode::Keep, ..Default::default() };
        import(&hf, &kept, &opts, &NoProgress).unwrap();
        verify(&kept, &NoProgress).unwrap();
        let pack = Pack::open(&kept).unwrap();
        assert_eq!(logits_of(&pack.model().unwrap(), &tokens), want, "{name}: kept pack");

        // NVFP4: every expert quantized from its own matrix, router kept.
        let q = temp_dir(&format!("{name}-nvfp4"));
        let opts =
            ImportOptions { head: Some(kore_pack::head::HeadFormat::Bf16), ..Default::default() };
        import(&hf, &q, &opts, &NoProgress).unwrap();
        verify(&q, &NoProgress).unwrap();
        let pack = Pack::open(&q).unwrap();
        let modules = &pack.manifest().quantization.modules;
        let cfg = pack.config();
        let moe = cfg.moe.unwrap();
        let experts = modules.keys().filter(|m| m.contains(".mlp.experts.")).count() as u64;
        assert_eq!(experts, (cfg.num_hidden_layers) * moe.num_experts * 3, "{name}");
        assert_eq!(modules.get("model.layers.0.mlp.shared_expert.up_proj"), Some(&Scheme::Nvfp4));
        assert!(!modules.contains_key("model.layers.0.mlp.gate"), "{name}: router quantized");
        let (e, inter) = (3usize, moe.moe_intermediate_size as usize);
        let h = cfg.hidden_size as usize;
        let src_bytes = std::fs::read(hf.join("model.safetensors")).unwrap();
        let src = Safetensors::parse(&src_bytes).unwrap();
        let source_up: Vec<f32> = if fused {
            let t = src.get("model.language_model.layers.0.mlp.experts.gate_up_proj").unwrap();
            let all = floats(t);
            let start = (e * 2 * inter + inter) * h;
            all[start..start + inter * h].to_vec()
        } else {
            floats(src.get(&format!("model.layers.0.mlp.experts.{e}.up_proj.weight")).unwrap())
        };
        let module = format!("model.layers.0.mlp.experts.{e}.up_proj");
        let ours = nvfp4::quantize(&module, &source_up, inter, h).unwrap();
        let Some(LinearRef::Nvfp4 { weight, weight_scale, weight_scale_2 }) = pack.linear(&module)
        else {
            panic!("{module}")
        };
        assert_eq!(weight.data, ours.weight.as_slice(), "{name}: {module}");
        assert_eq!(weight_scale.data, ours.weight_scale.as_slice());
        assert_eq!(weight_scale_2, ours.weight_scale_2);
        let l = logits_of(&pack.model().unwrap(), &tokens);
        assert!(l.iter().all(|v| v.is_finite()));
    }
}
