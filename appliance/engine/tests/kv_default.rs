//! The default KV cache precision (f16) against transformers: on every
//! reference fixture (tests/fixtures, made by scripts/reference/gen_fixtures.py)
//! greedy decoding gives transformers' tokens, on every kernel path this CPU
//! supports and with DeltaNet in both forms. The logits move by about 1e-3
//! with f16 keys and values (over tests/reference.rs's 1e-4, which runs f32),
//! so only the tokens are compared; the smallest top-1 / top-2 logit gap along
//! the reference continuations is printed to show the margin.

use std::path::Path;

use kore_engine::hf::HfModelDir;
use kore_engine::safetensors::Safetensors;
use kore_engine::simd::Path as KernelPath;
use kore_engine::state::KvPrecision;
use kore_engine::{generate, DType, EngineOptions, GenerateOptions, Logits, SamplingParams};

/// (prompt, transformers' greedy continuation) pairs of a fixture.
fn cases(dir: &Path) -> Vec<(Vec<u32>, Vec<u32>)> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    let ids = |n: String| {
        let t = st.get(&n)?;
        assert_eq!(t.dtype, DType::I32);
        Some(
            t.data
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
                .collect(),
        )
    };
    (0..)
        .map_while(|i| Some((ids(format!("prompt_{i}"))?, ids(format!("generated_{i}"))?)))
        .collect()
}

/// Top-1 minus top-2 logit.
fn gap(l: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in l {
        if x > a {
            (a, b) = (x, a);
        } else if x > b {
            b = x;
        }
    }
    a - b
}

#[test]
fn default_f16_kv_gives_transformers_greedy_tokens_on_every_path() {
    assert_eq!(EngineOptions::default().kv, KvPrecision::F16, "f16 is the default");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("reference.safetensors").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 4, "expected at least 4 reference fixtures, found {}", dirs.len());
    let paths: Vec<_> = KernelPath::ALL.into_iter().filter(|p| p.supported()).collect();
    let (mut runs, mut min_gap) = (0, f32::MAX);
    for dir in &dirs {
        let hf = HfModelDir::open(dir).unwrap();
        let mut model = hf.model().unwrap();
        let cases = cases(dir);
        assert!(!cases.is_empty(), "{}: no cases", dir.display());
        for &path in &paths {
            for chunked in [None, Some(2)] {
                let opts = EngineOptions {
                    kernels: Some(path),
                    deltanet_chunked_min: chunked,
                    ..Default::default()
                };
                model.set_options(&opts).unwrap();
                for (i, (prompt, want)) in cases.iter().enumerate() {
                    let what = format!(
                        "{} prompt {i}, {} kernels, chunked {chunked:?}",
                        dir.display(),
                        path.name()
                    );
                    let g = GenerateOptions {
                        max_tokens: want.len(),
                        stop_tokens: vec![],
                        sampling: SamplingParams::greedy(),
                    };
                    let mut st = model.new_state();
                    let out = generate(&model, &mut st, prompt, &g, |_| true).unwrap();
                    assert_eq!(&out.tokens, want, "{what}: greedy tokens with f16 KV");
                    let mut st = model.new_state();
                    let mut logits = model.forward(&mut st, prompt, Logits::Last).unwrap();
                    for &t in want {
                        min_gap = min_gap.min(gap(&logits));
                        logits = model.forward(&mut st, &[t], Logits::Last).unwrap();
                    }
                    runs += 1;
                }
            }
        }
    }
    let names: Vec<_> = paths.iter().map(|p| p.name()).collect();
    eprintln!(
        "f16 KV: {runs} greedy runs equal transformers' on paths {names:?}; \
         smallest top-1/top-2 logit gap {min_gap:.4}"
    );
}
