//! The committed default pack `model-packs/tiny`: it verifies, it is exactly
//! what `pack import` makes of `model-packs/tiny-hf` with the documented flags,
//! and its NVFP4 weights agree with the bf16 source on the greedy next token
//! (teacher-forced, kore-engine) over held-out text (*Julius Caesar*, which
//! training never saw: tests/fixtures/tiny_heldout_julius_caesar.txt).

mod common;

use common::temp_dir;
use kore_engine::Logits;
use kore_pack::config::LinearGroup;
use kore_pack::import::{import, ImportOptions, QuantMode};
use kore_pack::pack::verify;
use kore_pack::{NoProgress, Pack};
use std::path::{Path, PathBuf};

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |b, (i, &v)| if v > row[b] { i } else { b })
}

#[test]
fn committed_pack_is_the_documented_import_of_tiny_hf() {
    let committed = repo("../tiny");
    verify(&committed, &NoProgress).unwrap();
    let out = temp_dir("tiny-reimport");
    let opts = ImportOptions {
        quant: QuantMode::Nvfp4,
        groups: [LinearGroup::parse("mlp").unwrap()].into_iter().collect(),
        keep: vec!["model.layers.0.*".into()],
        name: Some("tiny".into()),
        context_length: None,
        head: Some(kore_pack::head::HeadFormat::Bf16),
    };
    import(&repo("../tiny-hf"), &out, &opts, &NoProgress).unwrap();
    let a = Pack::open(&committed).unwrap();
    let b = Pack::open(&out).unwrap();
    assert_eq!(a.manifest().files, b.manifest().files, "re-import gives the same bytes");
    assert_eq!(a.manifest().quantization, b.manifest().quantization);
    assert!(a.manifest().mtp && a.engine_config().mtp_num_hidden_layers == 1);
    assert_eq!(a.manifest().quantization.modules.len(), 24, "MLPs of layers 1-7 and the MTP layer");
    std::fs::remove_dir_all(out).unwrap();
}

#[test]
fn nvfp4_pack_agrees_with_bf16_on_held_out_text() {
    let pack = Pack::open(repo("../tiny")).unwrap();
    let hf = kore_engine::hf::HfModelDir::open(&repo("../tiny-hf")).unwrap();
    let json = std::fs::read(pack.tokenizer_path()).unwrap();
    let tok = kore_tokenizer::Tokenizer::from_json(&json).unwrap();
    let text =
        std::fs::read_to_string(repo("tests/fixtures/tiny_heldout_julius_caesar.txt")).unwrap();
    let ids = tok.encode(&text);
    assert!(ids.len() > 1000, "{} tokens", ids.len());
    let (quant, full) = (pack.model().unwrap(), hf.model().unwrap());
    let vocab = full.config.vocab_size;
    let (mut agree, mut total, mut correct_q, mut correct_f) = (0, 0, 0, 0);
    // Windows of 256 tokens, as in scripts/tiny-train (each starts a fresh state).
    for w in ids.chunks(257).filter(|w| w.len() > 1) {
        let inp = &w[..w.len() - 1];
        let lq = quant.forward(&mut quant.new_state(), inp, Logits::All).unwrap();
        let lf = full.forward(&mut full.new_state(), inp, Logits::All).unwrap();
        for (i, (rq, rf)) in lq.chunks_exact(vocab).zip(lf.chunks_exact(vocab)).enumerate() {
            let (q, f) = (argmax(rq), argmax(rf));
            agree += usize::from(q == f);
            correct_q += usize::from(q == w[i + 1] as usize);
            correct_f += usize::from(f == w[i + 1] as usize);
            total += 1;
        }
    }
    let rate = agree as f64 / total as f64;
    eprintln!(
        "NVFP4 vs bf16 greedy top-1 agreement: {agree}/{total} = {rate:.4}; accuracy vs text: \
         NVFP4 {correct_q}, bf16 {correct_f}"
    );
    assert!(rate >= 0.95, "agreement {rate:.4} < 0.95");
}

#[test]
fn resident_pack_is_the_mapped_pack_on_hugepages() {
    let mapped = Pack::open(repo("../tiny")).unwrap();
    let resident = Pack::open_resident(repo("../tiny"), &NoProgress).unwrap();
    assert_eq!(mapped.residency(), kore_pack::safetensors::Residency::Mapped);
    assert_ne!(resident.residency(), kore_pack::safetensors::Residency::Mapped, "13 MB fits");
    let ids = [1u32, 200, 3000, 45, 4000, 7];
    let (a, b) = (mapped.model().unwrap(), resident.model().unwrap());
    let la = a.forward(&mut a.new_state(), &ids, Logits::All).unwrap();
    let lb = b.forward(&mut b.new_state(), &ids, Logits::All).unwrap();
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()), "same bytes, same logits");
}

#[test]
fn resident_open_rejects_a_truncated_pack() {
    let out = temp_dir("tiny-truncated-resident");
    for f in std::fs::read_dir(repo("../tiny")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, out.join(f.file_name().unwrap())).unwrap();
    }
    let w = out.join("weights.safetensors");
    let len = std::fs::metadata(&w).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&w).unwrap().set_len(len - 100).unwrap();
    let err = Pack::open_resident(&out, &NoProgress).unwrap_err();
    assert!(err.to_string().contains("weights.safetensors"), "{err}");
    std::fs::remove_dir_all(out).unwrap();
}
