//! The real engine batched behind the service (model-packs/tiny-hf): eight
//! requests over three connections, greedy and seeded sampling, raw and
//! chat, prompts prefilled in small chunks between the others' decode steps,
//! get exactly the tokens each gets when requests run one at a time, on the
//! kernel paths whose per-token arithmetic does not depend on the batch
//! (generic, AVX2) and on this CPU's default path.

use std::path::PathBuf;
use std::sync::Arc;

use kore_appliance::{stop_ids, ModelEngine, TokenizerCodec};
use kore_engine::hf::HfModelDir;
use kore_engine::simd::Path;
use kore_engine::Model;
use kore_service::host::StdClock;
use kore_service::{Config, Service};
use kore_tokenizer::Tokenizer;
use serde_json::{json, Value};

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf")
}

fn requests() -> Vec<Value> {
    let lines = [
        "ROMEO:\nBut soft, what light through yonder window breaks?",
        "KING HENRY:\nOnce more unto the breach",
        "JULIET:\n",
        "First Citizen:\nBefore we proceed any further, hear me speak. All: Speak, speak.",
    ];
    let mut out = Vec::new();
    for (i, text) in lines.iter().enumerate() {
        out.push(json!({"id": format!("g{i}"), "prompt": text, "max_tokens": 24 + 3 * i}));
        out.push(json!({
            "id": format!("s{i}"), "prompt": text, "max_tokens": 20,
            "temperature": 0.8, "top_p": 0.9, "seed": 7 + i
        }));
    }
    out.push(json!({"id": "chat", "messages": [{"role": "user", "content": "Who art thou?"}],
        "max_tokens": 30, "thinking": false}));
    out
}

/// Runs every request with at most `max` sequences together and prefill
/// chunks of `chunk`; returns `(id, token_ids, finish)` sorted by id.
fn run(model: &Model<'_>, max: usize, chunk: usize) -> Vec<(String, Value, Value)> {
    run_with(model, max, chunk, None).0
}

/// [`run`] with a KV position budget; also returns the most requests that ran together.
fn run_with(
    model: &Model<'_>,
    max: usize,
    chunk: usize,
    kv_tokens: Option<usize>,
) -> (Vec<(String, Value, Value)>, usize) {
    let tok = Arc::new(Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let mut engine = ModelEngine::new(model, "tiny", stops.clone())
        .with_max_sequences(max)
        .with_prefill_chunk(chunk);
    if let Some(tokens) = kv_tokens {
        engine = engine.with_kv_token_budget(tokens);
    }
    let codec = TokenizerCodec::new(tok, stops);
    let mut svc = Service::new(engine, codec, StdClock::new(), Config::default());
    let conns = [svc.open(), svc.open(), svc.open()];
    for (i, r) in requests().iter().enumerate() {
        svc.on_bytes(conns[i % 3], format!("{r}\n").as_bytes());
    }
    let mut peak = 0;
    while svc.poll() {
        peak = peak.max(svc.active());
    }
    if kv_tokens.is_none() {
        assert_eq!(peak, max.min(requests().len()), "requests running together");
    }
    let mut out = Vec::new();
    for c in conns {
        let text = String::from_utf8(svc.take_output(c)).unwrap();
        for line in text.lines() {
            let e: Value = serde_json::from_str(line).unwrap();
            assert!(e.get("error").is_none(), "{e}");
            if e["done"] == true {
                out.push((
                    e["id"].as_str().unwrap().to_owned(),
                    e["token_ids"].clone(),
                    e["finish"].clone(),
                ));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(out.len(), requests().len());
    (out, peak)
}

/// With a KV position budget, requests wait in the queue until the running
/// ones' prompts plus `max_tokens` leave room: fewer run together, none is
/// refused, and each still gets its own tokens.
#[test]
fn a_kv_budget_queues_requests_beyond_it() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let mut model = hf.model().unwrap();
    model.set_kernels(Path::Generic).unwrap();
    let alone = run(&model, 1, 7);
    // Each request reserves its prompt plus 20-33 tokens: 140 positions fit a few, not all 9.
    let (limited, peak) = run_with(&model, 9, 7, Some(140));
    let (_, free_peak) = run_with(&model, 9, 7, None);
    assert_eq!(alone, limited);
    assert!(peak >= 2, "{peak} ran together under a budget of 140 positions");
    assert!(free_peak > peak, "{free_peak} without the budget, {peak} with it");
}

#[test]
fn batched_requests_get_the_tokens_they_get_alone() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let mut model = hf.model().unwrap();
    let pool = kore_engine::pool::ThreadPool::new(2);
    model.set_pool(&pool);
    let paths = [Path::Generic, Path::Avx2, kore_engine::simd::best()];
    for path in paths.into_iter().filter(|p| p.supported()) {
        model.set_kernels(path).unwrap();
        let alone = run(&model, 1, 7);
        for (max, chunk) in [(4, 7), (9, 3)] {
            let together = run(&model, max, chunk);
            assert_eq!(alone, together, "kernels {path:?}, {max} together, chunks of {chunk}");
        }
    }
}
