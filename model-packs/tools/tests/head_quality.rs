//! The quantized output heads (`--head q8|nvfp4`) against the bf16 head of
//! the default pack on its held-out text (model-packs/tools/tests/fixtures): top-1
//! agreement, mean KL(bf16 || quantized) and held-out loss, on the same trunk
//! hidden states. The q8 head (the default) must agree on >= 99% of tokens.

use kore_engine::{Linear, Model};
use kore_pack::head::{quantize_q8_row, Q8_GROUP};
use kore_pack::Pack;
use std::path::PathBuf;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// Agreement figures of one head against the reference logits.
#[derive(Debug, Default)]
struct Figures {
    agree: usize,
    total: usize,
    kl: f64,
    nll: f64,
}

fn log_softmax(z: &[f32]) -> Vec<f64> {
    let m = z.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + z.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
}

fn compare(reference: &[f32], got: &[f32], next: &[u32], vocab: usize, f: &mut Figures) {
    for ((r, g), &t) in reference.chunks_exact(vocab).zip(got.chunks_exact(vocab)).zip(next) {
        let (lr, lg) = (log_softmax(r), log_softmax(g));
        f.agree += usize::from(argmax(r) == argmax(g));
        f.kl += lr.iter().zip(&lg).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
        f.nll -= lg[t as usize];
        f.total += 1;
    }
}

/// The bf16 head of `model` as f32 rows.
fn head_f32(model: &Model<'_>) -> Vec<f32> {
    let (v, h) = (model.lm_head.rows(), model.lm_head.cols());
    let mut out = vec![0.0; v * h];
    for (r, row) in out.chunks_exact_mut(h).enumerate() {
        model.lm_head.decode_row(r, row);
    }
    out
}

#[test]
fn quantized_heads_agree_with_bf16_on_held_out_text() {
    let pack = Pack::open(repo("../tiny")).unwrap();
    let mut model = pack.model().unwrap();
    assert!(matches!(model.lm_head, Linear::Dense { .. }), "the default pack's head is bf16");
    let json = std::fs::read(pack.tokenizer_path()).unwrap();
    let tok = kore_tokenizer::Tokenizer::from_json(&json).unwrap();
    let text =
        std::fs::read_to_string(repo("tests/fixtures/tiny_heldout_julius_caesar.txt")).unwrap();
    let ids = tok.encode(&text);
    let (vocab, hidden) = (model.config.vocab_size, model.config.hidden_size);
    let full = head_f32(&model);

    let (mut q8, mut q8_scales) = (Vec::new(), Vec::new());
    for row in full.chunks_exact(hidden) {
        quantize_q8_row(row, &mut q8, &mut q8_scales).unwrap();
    }
    assert_eq!(q8_scales.len(), 2 * vocab * hidden / Q8_GROUP);
    let fp4 = kore_pack::nvfp4::quantize("lm_head.weight", &full, vocab, hidden).unwrap();
    let heads = [
        Linear::Q8 { data: &q8, scales: &q8_scales, rows: vocab, cols: hidden },
        Linear::Nvfp4 {
            packed: &fp4.weight,
            scales: &fp4.weight_scale,
            global_scale: fp4.weight_scale_2,
            rows: vocab,
            cols: hidden,
        },
    ];
    let bf16 = model.lm_head;
    let (mut reference, mut figs) = (Figures::default(), [Figures::default(), Figures::default()]);
    // Windows of 256 tokens, each from a fresh state (as scripts/tiny-train).
    for w in ids.chunks(257).filter(|w| w.len() > 1) {
        let (inp, next) = (&w[..w.len() - 1], &w[1..]);
        let h = model.forward_hidden(&mut model.new_state(), inp).unwrap();
        model.lm_head = bf16;
        let lr = model.logits(&h);
        compare(&lr, &lr, next, vocab, &mut reference);
        for (head, f) in heads.iter().zip(figs.iter_mut()) {
            model.lm_head = *head;
            compare(&lr, &model.logits(&h), next, vocab, f);
        }
    }
    let n = reference.total as f64;
    eprintln!("{} positions; bf16 head held-out loss {:.4}", reference.total, reference.nll / n);
    for (name, f) in ["q8", "nvfp4"].iter().zip(&figs) {
        eprintln!(
            "{name} head: top-1 agreement {}/{} = {:.4}, mean KL {:.2e} nats, held-out loss {:.4}",
            f.agree,
            f.total,
            f.agree as f64 / n,
            f.kl / n,
            f.nll / n
        );
    }
    assert!(reference.total > 1000);
    assert!(figs[0].agree as f64 / n >= 0.99, "q8 head agreement below 99%");
    assert!(figs[0].kl / n < 1e-3, "q8 head KL too large");
    assert!(figs[1].agree as f64 / n >= 0.9, "nvfp4 head agreement below 90%");
}
