//! import -> verify -> open -> engine, for bf16 and NVFP4, plain and ModelOpt sources.

mod common;

use common::{temp_dir, tiny_config, write_hf_dir, write_safetensors};
use kore_engine::{Logits, TensorSource};
use kore_pack::import::{import, ImportOptions, QuantMode};
use kore_pack::manifest::Scheme;
use kore_pack::nvfp4;
use kore_pack::pack::verify;
use kore_pack::safetensors::{DType, TensorSpec};
use kore_pack::{LinearRef, NoProgress, Pack};

fn logits_of(model: &kore_engine::Model<'_>, tokens: &[u32]) -> Vec<f32> {
    let mut state = model.new_state();
    model.forward(&mut state, tokens, Logits::All).unwrap()
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |b, (i, &v)| if v > row[b] { i } else { b })
}

#[test]
fn bf16_import_is_exact_and_runs_like_the_hf_directory() {
    let hf = temp_dir("hf-bf16");
    let values = write_hf_dir(&hf, &tiny_config(), 1);
    let out = temp_dir("pack-bf16");
    let opts = ImportOptions { quant: QuantMode::Bf16, ..Default::default() };
    let s = import(&hf, &out, &opts, &NoProgress).unwrap();
    assert_eq!(s.nvfp4_modules, 0);
    assert!(s.mtp);
    assert_eq!(s.dropped, 1, "the vision tensor is dropped");
    let r = verify(&out, &NoProgress).unwrap();
    assert_eq!(r.files, 2);
    let pack = Pack::open(&out).unwrap();
    assert_eq!(pack.config(), &tiny_config());
    assert_eq!(pack.manifest().tokenizer.chat_template.as_deref(), Some("{{ messages }}"));
    assert!(pack.tokenizer_path().is_file());
    for (name, vals) in &values {
        let t = pack.tensor(name).unwrap();
        assert_eq!(&t.to_f32().unwrap(), vals, "{name}");
        let view = TensorSource::tensor(&pack, name).unwrap();
        assert_eq!(view.data.as_ptr() as usize % 64, 0, "{name} is not 64-byte aligned in memory");
    }
    let tokens = [1u32, 200, 17, 42, 99, 3];
    let from_pack = logits_of(&pack.model().unwrap(), &tokens);
    let dir = kore_engine::hf::HfModelDir::open(&hf).unwrap();
    let from_hf = logits_of(&dir.model().unwrap(), &tokens);
    assert_eq!(from_pack, from_hf, "the bf16 pack must run exactly like its source");
}

#[test]
fn nvfp4_import_quantizes_exactly_and_stays_close() {
    let hf = temp_dir("hf-nvfp4");
    let values = write_hf_dir(&hf, &tiny_config(), 2);
    let out = temp_dir("pack-nvfp4");
    // A q8 head: the default NVFP4 head's rescoring copy (head_storage.rs) is
    // not the dequantized checkpoint this compares against.
    let opts = ImportOptions { head: Some(kore_pack::head::HeadFormat::Q8), ..Default::default() };
    let s = import(&hf, &out, &opts, &NoProgress).unwrap();
    // 3 DeltaNet layers x 5 + 1 attention x 4 + 4 MLPs x 3 + MTP attention 4 + MTP MLP 3.
    assert_eq!(s.nvfp4_modules, 15 + 4 + 12 + 4 + 3);
    verify(&out, &NoProgress).unwrap();
    let pack = Pack::open(&out).unwrap();
    let m = &pack.manifest().quantization.modules;
    assert!(!m.contains_key("mtp.fc"), "mtp.fc stays BF16 by default");
    assert_eq!(m.get("lm_head"), Some(&Scheme::Q8));
    assert_eq!(m.get("mtp.layers.0.mlp.up_proj"), Some(&Scheme::Nvfp4));
    // The streaming importer gives the same bytes as the reference-checked quantizer.
    for module in [
        "model.layers.0.linear_attn.in_proj_qkv",
        "model.layers.3.self_attn.o_proj",
        "model.layers.2.mlp.down_proj",
    ] {
        let src = &values.iter().find(|(n, _)| n == &format!("{module}.weight")).unwrap().1;
        let e = pack
            .config()
            .expected_tensors()
            .into_iter()
            .find(|e| e.name == format!("{module}.weight"))
            .unwrap();
        let q = nvfp4::quantize(module, src, e.shape[0] as usize, e.shape[1] as usize).unwrap();
        let Some(LinearRef::Nvfp4 { weight, weight_scale, weight_scale_2 }) = pack.linear(module)
        else {
            panic!("{module}")
        };
        assert_eq!(weight.data, q.weight.as_slice());
        assert_eq!(weight_scale.data, q.weight_scale.as_slice());
        assert_eq!(weight_scale_2, q.weight_scale_2);
    }
    // The engine's NVFP4 path over the pack equals the engine over an F32
    // checkpoint holding the dequantized weights (up to summation order), on
    // a kernel path with f32 activations: the `avx512vnni` and `avx2` paths
    // quantize NVFP4 activations to int8 by design (their own agreement
    // tests are in kore-engine), which is not what this checks.
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 % 300) as u32).collect();
    use kore_engine::simd::{best, Path as K};
    let path = match best() {
        K::Avx512Vnni | K::Amx => K::Avx512,
        K::Avx2 => K::Generic,
        p => p,
    };
    let on_path = |mut m: kore_engine::Model<'_>| {
        m.set_kernels(path).unwrap();
        logits_of(&m, &tokens)
    };
    let deq = temp_dir("hf-dequantized");
    std::fs::copy(hf.join("config.json"), deq.join("config.json")).unwrap();
    let mut specs = Vec::new();
    let mut data = Vec::new();
    for e in pack.config().expected_tensors() {
        let vals = match e.module().map(|m| pack.linear(m).unwrap()) {
            Some(LinearRef::Nvfp4 { weight, weight_scale, weight_scale_2 }) => {
                nvfp4::dequantize(&nvfp4::Nvfp4Weight {
                    rows: e.shape[0] as usize,
                    cols: e.shape[1] as usize,
                    weight: weight.data.to_vec(),
                    weight_scale: weight_scale.data.to_vec(),
                    weight_scale_2,
                })
            }
            Some(LinearRef::Q8 { weight, weight_scale }) => {
                let mut v = vec![0.0; weight.data.len()];
                let (cols, blocks) = (e.shape[1] as usize, 2 * e.shape[1] as usize / 32);
                for (r, out) in v.chunks_exact_mut(cols).enumerate() {
                    let (q, s) =
                        (&weight.data[r * cols..][..cols], &weight_scale.data[r * blocks..]);
                    kore_pack::head::dequantize_q8_row(q, &s[..blocks], out);
                }
                v
            }
            _ => values.iter().find(|(n, _)| n == &e.name).unwrap().1.clone(),
        };
        specs.push(TensorSpec::new(e.name.clone(), DType::F32, e.shape.clone()));
        data.push(vals.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    write_safetensors(&deq.join("model.safetensors"), &specs, &data, 1);
    let q = on_path(pack.model().unwrap());
    let dir = kore_engine::hf::HfModelDir::open(&deq).unwrap();
    let f = on_path(dir.model().unwrap());
    let scale = f.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let diff = q.iter().zip(&f).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-4 * scale.max(1.0), "max |logit difference| {diff} (scale {scale})");
    let agree = q.chunks(320).zip(f.chunks(320)).filter(|(a, b)| argmax(a) == argmax(b)).count();
    assert_eq!(agree, tokens.len());
}

#[test]
fn flags_choose_more_or_less() {
    let hf = temp_dir("hf-flags");
    write_hf_dir(&hf, &tiny_config(), 3);
    let out = temp_dir("pack-flags");
    let opts = ImportOptions {
        groups: [kore_pack::config::LinearGroup::Mlp, kore_pack::config::LinearGroup::LmHead]
            .into_iter()
            .collect(),
        keep: vec!["model.layers.0.*".into()],
        ..Default::default()
    };
    import(&hf, &out, &opts, &NoProgress).unwrap();
    let pack = Pack::open(&out).unwrap();
    let m = &pack.manifest().quantization.modules;
    assert!(m.contains_key("lm_head"));
    assert!(m.contains_key("model.layers.1.mlp.gate_proj"));
    assert!(!m.contains_key("model.layers.0.mlp.gate_proj"));
    assert!(!m.contains_key("model.layers.3.self_attn.q_proj"));
    verify(&out, &NoProgress).unwrap();
}

#[test]
fn modelopt_checkpoint_is_imported_as_is() {
    // A mixed ModelOpt export: MLPs NVFP4, everything else BF16.
    let cfg = tiny_config();
    let hf = temp_dir("hf-modelopt");
    let values = write_hf_dir(&hf, &cfg, 4);
    let mut specs = Vec::new();
    let mut data = Vec::new();
    let mut expected = Vec::new();
    for e in cfg.expected_tensors() {
        let vals = &values.iter().find(|(n, _)| n == &e.name).unwrap().1;
        let hf_name = e.name.replacen("model.", "model.language_model.", 1);
        if e.name.contains(".mlp.") {
            let m = e.module().unwrap();
            let q = nvfp4::quantize(m, vals, e.shape[0] as usize, e.shape[1] as usize).unwrap();
            let hm = hf_name.strip_suffix(".weight").unwrap().to_string();
            specs.push(TensorSpec::new(
                format!("{hm}.weight"),
                DType::U8,
                vec![e.shape[0], e.shape[1] / 2],
            ));
            data.push(q.weight.clone());
            specs.push(TensorSpec::new(
                format!("{hm}.weight_scale"),
                DType::F8E4M3,
                vec![e.shape[0], e.shape[1] / 16],
            ));
            data.push(q.weight_scale.clone());
            specs.push(TensorSpec::new(format!("{hm}.weight_scale_2"), DType::F32, vec![]));
            data.push(q.weight_scale_2.to_le_bytes().to_vec());
            specs.push(TensorSpec::new(format!("{hm}.input_scale"), DType::F32, vec![1]));
            data.push(0.5f32.to_le_bytes().to_vec());
            expected.push((m.to_string(), q));
        } else {
            specs.push(TensorSpec::new(hf_name, DType::BF16, e.shape.clone()));
            data.push(
                vals.iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
            );
        }
    }
    specs.push(TensorSpec::new(
        "model.language_model.layers.3.self_attn.k_scale",
        DType::F32,
        vec![],
    ));
    data.push(1.0f32.to_le_bytes().to_vec());
    write_safetensors(&hf.join("model.safetensors"), &specs, &data, 1);
    let qcfg = serde_json::json!({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "*self_attn*", "*linear_attn*"]}});
    std::fs::write(hf.join("hf_quant_config.json"), serde_json::to_vec(&qcfg).unwrap()).unwrap();
    let out = temp_dir("pack-modelopt");
    let s = import(&hf, &out, &ImportOptions::default(), &NoProgress).unwrap();
    assert_eq!(s.nvfp4_modules, 15);
    assert_eq!(s.copied_nvfp4, 15);
    verify(&out, &NoProgress).unwrap();
    let pack = Pack::open(&out).unwrap();
    assert_eq!(pack.manifest().quantization.producer.as_deref(), Some("modelopt"));
    for (m, q) in &expected {
        let Some(LinearRef::Nvfp4 { weight, weight_scale, weight_scale_2 }) = pack.linear(m) else {
            panic!("{m}")
        };
        assert_eq!(
            (weight.data, weight_scale.data, weight_scale_2),
            (q.weight.as_slice(), q.weight_scale.as_slice(), q.weight_scale_2)
        );
        assert_eq!(pack.tensor(&format!("{m}.input_scale")).unwrap().shape, &[] as &[u64]);
    }
    assert!(matches!(pack.linear("model.layers.3.self_attn.q_proj"), Some(LinearRef::Float(_))));
    pack.model().unwrap();
}

#[test]
fn synth_writes_a_valid_pack_the_engine_loads() {
    let out = temp_dir("synth");
    let pack =
        kore_pack::synth::synth_config("tiny-synth", tiny_config(), &out, 9, &NoProgress).unwrap();
    verify(&out, &NoProgress).unwrap();
    assert!(pack.manifest().quantization.modules.contains_key("lm_head"));
    let model = pack.model().unwrap();
    let l = logits_of(&model, &[5, 6, 7]);
    assert!(l.iter().all(|v| v.is_finite()));
    // Same seed, same bytes.
    let again = temp_dir("synth2");
    kore_pack::synth::synth_config("tiny-synth", tiny_config(), &again, 9, &NoProgress).unwrap();
    assert_eq!(
        std::fs::read(out.join("weights.safetensors")).unwrap(),
        std::fs::read(again.join("weights.safetensors")).unwrap()
    );
}

#[test]
fn presets_have_the_published_sizes() {
    // Parameter counts (without MTP) of the published models, in billions.
    for (name, lo, hi) in [
        ("qwen3.5-0.8b", 0.7, 0.9),
        ("qwen3.5-2b", 1.8, 2.3),
        ("qwen3.5-4b", 4.0, 4.8),
        ("qwen3.5-9b", 8.8, 9.2),
        ("qwen3.5-27b", 26.0, 28.0),
    ] {
        let c = kore_pack::synth::preset(name).unwrap();
        let params: u64 = c
            .expected_tensors()
            .iter()
            .filter(|e| !e.name.starts_with("mtp."))
            .map(|e| e.shape.iter().product::<u64>())
            .sum();
        let b = params as f64 / 1e9;
        assert!(b > lo && b < hi, "{name}: {b:.2}B parameters");
    }
    assert!(kore_pack::synth::preset("qwen3.5-1b").is_err());
}
