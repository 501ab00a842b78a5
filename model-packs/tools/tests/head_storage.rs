//! `--head bf16|q8|nvfp4`: what import and synth write, that it verifies and
//! loads, that a tied model's separate head is the quantized embedding, that
//! an untied NVFP4 head carries a q8 copy whose rows rescore its best
//! candidates, and that a q8 scheme anywhere but the heads is rejected.

mod common;

use common::{temp_dir, tiny_config, write_hf_dir};
use kore_engine::Linear;
use kore_pack::head::{dequantize_q8_row, quantize_q8_row, HeadFormat, Q8_GROUP};
use kore_pack::import::{import, ImportOptions};
use kore_pack::manifest::Scheme;
use kore_pack::pack::verify;
use kore_pack::{LinearRef, NoProgress, Pack};

fn tied() -> kore_pack::PackConfig {
    kore_pack::PackConfig { tie_word_embeddings: true, ..tiny_config() }
}

#[test]
fn tied_import_gets_a_separate_q8_head_from_the_embedding() {
    let hf = temp_dir("hf-tied");
    let values = write_hf_dir(&hf, &tied(), 4);
    let out = temp_dir("pack-tied-q8");
    let opts = ImportOptions { head: Some(HeadFormat::Q8), ..ImportOptions::default() };
    import(&hf, &out, &opts, &NoProgress).unwrap();
    verify(&out, &NoProgress).unwrap();
    let pack = Pack::open(&out).unwrap();
    assert_eq!(pack.manifest().quantization.modules.get("lm_head"), Some(&Scheme::Q8));
    let Some(LinearRef::Q8 { weight, weight_scale }) = pack.linear("lm_head") else {
        panic!("no q8 head")
    };
    let embed = &values.iter().find(|(n, _)| n == "model.embed_tokens.weight").unwrap().1;
    let (mut q, mut s) = (Vec::new(), Vec::new());
    for row in embed.chunks_exact(tied().hidden_size as usize) {
        quantize_q8_row(row, &mut q, &mut s).unwrap();
    }
    assert_eq!((weight.data, weight_scale.data), (q.as_slice(), s.as_slice()));
    let model = pack.model().unwrap();
    assert!(matches!(model.lm_head, Linear::Q8 { .. }));
    assert!(matches!(model.embed_tokens, Linear::Dense { .. }), "the embedding stays bf16");
    assert!(matches!(model.head_exact, Some(Linear::Dense { .. })), "the embedding rescores");
    let logits = model.forward(&mut model.new_state(), &[1, 2, 3], kore_engine::Logits::Last);
    assert!(logits.unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn every_head_format_synthesizes_verifies_and_loads() {
    for (cfg, tag) in [(tied(), "tied"), (tiny_config(), "untied")] {
        for head in [HeadFormat::Bf16, HeadFormat::Q8, HeadFormat::Nvfp4] {
            let out = temp_dir(&format!("synth-{tag}-{head}"));
            kore_pack::synth::synth_config_with("t", cfg.clone(), &out, 3, Some(head), &NoProgress)
                .unwrap();
            verify(&out, &NoProgress).unwrap();
            let pack = Pack::open(&out).unwrap();
            let model = pack.model().unwrap();
            let modules = &pack.manifest().quantization.modules;
            let scheme = modules.get("lm_head").copied();
            let exact = modules.get("lm_head_exact").copied();
            let tied = tag == "tied";
            match head {
                HeadFormat::Bf16 => {
                    assert_eq!((scheme, exact), (None, None));
                    assert!(matches!(model.lm_head, Linear::Dense { .. }), "{tag}");
                    assert!(model.head_exact.is_none(), "{tag}");
                }
                HeadFormat::Q8 => {
                    assert_eq!((scheme, exact), (Some(Scheme::Q8), None));
                    assert!(matches!(model.lm_head, Linear::Q8 { .. }), "{tag}");
                    assert_eq!(model.head_exact.is_some(), tied, "{tag}");
                }
                HeadFormat::Nvfp4 => {
                    assert_eq!(scheme, Some(Scheme::Nvfp4));
                    assert!(matches!(model.lm_head, Linear::Nvfp4 { .. }), "{tag}");
                    let want = if tied { None } else { Some(Scheme::Q8) };
                    assert_eq!(exact, want, "{tag}");
                    match model.head_exact {
                        Some(Linear::Dense { .. }) => assert!(tied),
                        Some(Linear::Q8 { .. }) => assert!(!tied),
                        _ => panic!("{tag}: no exact head"),
                    }
                }
            }
            let logits = model.forward(&mut model.new_state(), &[5, 6], kore_engine::Logits::Last);
            assert!(logits.unwrap().iter().all(|v| v.is_finite()), "{tag} {head}");
            std::fs::remove_dir_all(out).unwrap();
        }
    }
}

#[test]
fn untied_nvfp4_import_rescores_its_best_candidates_with_a_q8_copy() {
    let cfg = tiny_config();
    let hf = temp_dir("hf-untied");
    let values = write_hf_dir(&hf, &cfg, 5);
    let out = temp_dir("pack-untied-nvfp4");
    import(&hf, &out, &ImportOptions::default(), &NoProgress).unwrap(); // default head: nvfp4
    verify(&out, &NoProgress).unwrap();
    let pack = Pack::open(&out).unwrap();
    let Some(LinearRef::Q8 { weight, weight_scale }) = pack.linear("lm_head_exact") else {
        panic!("no q8 copy of the head")
    };
    let h = cfg.hidden_size as usize;
    let head = &values.iter().find(|(n, _)| n == "lm_head.weight").unwrap().1;
    let (mut q, mut s) = (Vec::new(), Vec::new());
    for row in head.chunks_exact(h) {
        quantize_q8_row(row, &mut q, &mut s).unwrap();
    }
    assert_eq!((weight.data, weight_scale.data), (q.as_slice(), s.as_slice()));

    let mut model = pack.model().unwrap();
    let hidden = model.forward_hidden(&mut model.new_state(), &[7, 8, 9]).unwrap();
    let last = &hidden[hidden.len() - h..];
    let rescored = model.logits(last);
    let exact_head = model.head_exact.take().expect("an exact head");
    let screen = model.logits(last);
    let mut row = vec![0.0; h];
    let mut order: Vec<usize> = (0..screen.len()).collect();
    order.sort_by(|&a, &b| screen[b].total_cmp(&screen[a]));
    for (rank, &i) in order.iter().enumerate() {
        if rank < kore_engine::RESCORE_ROWS {
            let scale_bytes = 2 * h / Q8_GROUP; // one F16 per group
            let scales = &s[i * scale_bytes..(i + 1) * scale_bytes];
            dequantize_q8_row(&q[i * h..(i + 1) * h], scales, &mut row);
            let exact: f32 = row.iter().zip(last).map(|(a, b)| a * b).sum();
            let tol = 1e-4 * (1.0 + exact.abs());
            assert!((rescored[i] - exact).abs() <= tol, "row {i}: {} vs {exact}", rescored[i]);
        } else {
            assert_eq!(rescored[i], screen[i], "row {i} (rank {rank}) is not a candidate");
        }
    }
    assert!(matches!(exact_head, Linear::Q8 { .. }));
}

#[test]
fn q8_is_only_for_the_heads() {
    let out = temp_dir("synth-q8-misplaced");
    kore_pack::synth::synth_config_with("t", tied(), &out, 3, Some(HeadFormat::Q8), &NoProgress)
        .unwrap();
    let toml = out.join("pack.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let bad =
        text.replace("[quantization.modules]\n", "[quantization.modules]\n\"mtp.fc\" = \"q8\"\n");
    assert_ne!(text, bad);
    std::fs::write(&toml, bad).unwrap();
    let Err(err) = Pack::open(&out) else { panic!("a q8 mtp.fc must be rejected") };
    let err = err.to_string();
    assert!(err.contains("q8"), "{err}");
}
