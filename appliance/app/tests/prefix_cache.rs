//! The automatic prefix cache over the real engine (model-packs/tiny-hf,
//! and the default pack model-packs/tiny for the chat): without naming
//! anything, a 10-turn chat prefills only each turn's new tokens
//! (`stats.cached_tokens` = the earlier turns, up to the previous generation
//! prompt's `<think>`); raw prompts that extend an earlier request continue
//! after its answer; a prompt that diverges starts over; a system prompt is
//! prefilled once for every conversation, also by requests arriving
//! together; the byte budget evicts the least recently used checkpoints.
//! Every answer equals the uncached engine's (cache budget 0), bit for bit:
//! see also `cache_exactness.rs` for 64 prompts sharing prefixes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kore_appliance::{stop_ids, Checkpoint, CheckpointStore, ModelEngine, TokenizerCodec};
use kore_engine::hf::HfModelDir;
use kore_engine::snapshot::file::{Decoded, Identity};
use kore_engine::Model;
use kore_service::host::StdClock;
use kore_service::{Config, Service};
use kore_tokenizer::Tokenizer;
use serde_json::{json, Value};

type Svc<'m> = Service<ModelEngine<'m>, TokenizerCodec, StdClock>;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf")
}

fn service<'m>(model: &'m Model<'m>, budget: Option<usize>) -> Svc<'m> {
    service_in(&tiny_dir(), model, budget)
}

fn service_in<'m>(dir: &Path, model: &'m Model<'m>, budget: Option<usize>) -> Svc<'m> {
    let tok = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let mut engine = ModelEngine::new(model, "tiny", stops.clone());
    if let Some(b) = budget {
        engine = engine.with_cache_budget(b);
    }
    Service::new(engine, TokenizerCodec::new(tok, stops), StdClock::new(), Config::default())
}

/// Sends `reqs` together (one connection each), runs them, returns their
/// done events in order.
fn ask_all(svc: &mut Svc<'_>, reqs: &[Value]) -> Vec<Value> {
    let conns: Vec<_> = reqs
        .iter()
        .map(|r| {
            let c = svc.open();
            svc.on_bytes(c, format!("{r}\n").as_bytes());
            c
        })
        .collect();
    while svc.poll() {}
    conns
        .into_iter()
        .map(|c| {
            let text = String::from_utf8(svc.take_output(c)).unwrap();
            svc.on_closed(c);
            let done = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|e| {
                assert!(e.get("error").is_none(), "{e}");
                e["done"] == true
            });
            done.expect("a done event")
        })
        .collect()
}

fn ask(svc: &mut Svc<'_>, req: Value) -> Value {
    ask_all(svc, &[req]).remove(0)
}

fn cached(done: &Value) -> u64 {
    done["stats"]["cached_tokens"].as_u64().unwrap()
}

#[test]
fn ten_turn_chat_reuses_the_earlier_turns_and_answers_as_uncached() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    ten_turns(&tiny_dir(), &hf.model().unwrap());
}

#[test]
fn ten_turn_chat_on_the_default_pack() {
    let dir = tiny_dir().join("../tiny");
    let pack = kore_pack::Pack::open(&dir).unwrap();
    ten_turns(&dir, &pack.model().unwrap());
}

fn ten_turns(dir: &Path, model: &Model<'_>) {
    let mut kept = service_in(dir, model, None);
    let mut fresh = service_in(dir, model, Some(0));
    let users = [
        "Who comes here?",
        "What news?",
        "Speak, man.",
        "Where is the king?",
        "Good morrow.",
        "What say you?",
        "Is it so?",
        "Go to.",
        "Farewell.",
        "Come, sir.",
    ];
    let mut messages: Vec<Value> = Vec::new();
    let mut prev_prompt = 0u64;
    for (k, user) in users.iter().enumerate() {
        messages.push(json!({"role": "user", "content": user}));
        let req = json!({"id": k, "messages": messages, "thinking": false, "max_tokens": 12});
        let mut with = req.clone();
        if k % 2 == 1 {
            // A named session is accepted and served by the same cache.
            with["session"] = json!("conv");
        }
        let a = ask(&mut kept, with);
        let b = ask(&mut fresh, req);
        assert_eq!(a["token_ids"], b["token_ids"], "turn {k}: cached vs uncached");
        assert_eq!(a["text"], b["text"], "turn {k}");
        assert_eq!(cached(&b), 0);
        let (c, prompt) = (cached(&a), a["stats"]["prompt_tokens"].as_u64().unwrap());
        if k == 0 {
            assert_eq!(c, 0);
        } else {
            // Everything up to the previous generation prompt's `<think>`
            // (`<think>\n\n</think>\n\n`: 4 tokens at most): earlier turns.
            assert!(c + 4 >= prev_prompt && c < prev_prompt, "turn {k}: {c} of {prev_prompt}");
        }
        eprintln!("turn {k}: prompt {prompt} tokens, {c} cached, answer {}", a["text"]);
        prev_prompt = prompt;
        messages.push(json!({"role": "assistant", "content": a["text"]}));
    }
    let stats = kept.engine().cache_stats();
    assert_eq!(stats.hits_memory, 9, "{stats:?}");
    assert!(stats.bytes <= stats.budget && stats.checkpoints > 0, "{stats:?}");
}

#[test]
fn raw_prompts_continue_after_the_answer_or_start_over() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let mut svc = service(&model, None);
    let mut fresh = service(&model, Some(0));
    let first = ask(&mut svc, json!({"prompt_ids": [1767, 36, 46], "max_tokens": 6}));
    let ids: Vec<u64> =
        first["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let mut next: Vec<u64> = vec![1767, 36, 46];
    next.extend(&ids);
    next.extend([11, 479]);
    let cont = json!({"prompt_ids": next, "max_tokens": 6});
    let a = ask(&mut svc, cont.clone());
    // The state covers the prompt and every generated token but the last.
    assert_eq!(cached(&a), 3 + ids.len() as u64 - 1);
    assert_eq!(a["token_ids"], ask(&mut fresh, cont)["token_ids"]);
    let other = ask(&mut svc, json!({"prompt_ids": [5, 6, 7], "max_tokens": 2}));
    assert_eq!(cached(&other), 0, "a diverging prompt starts over");
    // Its prompt's own checkpoint (3 tokens) serves a longer prompt.
    let longer = ask(&mut svc, json!({"prompt_ids": [5, 6, 7, 8], "max_tokens": 2}));
    assert_eq!(cached(&longer), 3);
}

#[test]
fn the_budget_evicts_the_least_recently_used_checkpoints() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    // What one 4-token prompt with 2 generated tokens keeps.
    let one = {
        let mut probe = service(&model, None);
        ask(&mut probe, json!({"prompt_ids": [1, 2, 3, 4], "max_tokens": 3}));
        probe.engine().cache_stats().bytes
    };
    let mut svc = service(&model, Some(one * 5 / 2));
    for first in [10, 20, 30] {
        ask(&mut svc, json!({"prompt_ids": [first, 2, 3, 4], "max_tokens": 3}));
    }
    let stats = svc.engine().cache_stats();
    assert!(stats.evictions > 0 && stats.bytes <= stats.budget, "{stats:?}");
    let extend = |first: u32| json!({"prompt_ids": [first, 2, 3, 4, 9], "max_tokens": 1});
    assert_eq!(cached(&ask(&mut svc, extend(10))), 0, "the oldest was evicted");
    assert!(cached(&ask(&mut svc, extend(30))) >= 4, "the newest is kept");
}

fn system_chats(n: usize, system: &str) -> Vec<Value> {
    let users = ["Who art thou?", "What news?", "Speak.", "Whither?", "Hark!", "Why so?"];
    (0..n)
        .map(|i| {
            let msgs = json!([{"role": "system", "content": system},
                {"role": "user", "content": format!("{} ({i})", users[i % users.len()])}]);
            json!({"id": i, "messages": msgs, "thinking": false, "max_tokens": 8})
        })
        .collect()
}

#[test]
fn a_system_prompt_is_prefilled_once_for_every_conversation() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let mut svc = service(&model, None);
    let mut fresh = service(&model, Some(0));
    let mut got = Vec::new();
    for req in system_chats(3, "Thou art a player in a Shakespeare play.") {
        let a = ask(&mut svc, req.clone());
        assert_eq!(a["token_ids"], ask(&mut fresh, req)["token_ids"]);
        got.push(cached(&a));
    }
    assert_eq!(got[0], 0, "nothing cached yet");
    assert!(got[1] > 10 && got[1] == got[2], "system turn shared: {got:?}");
}

#[test]
fn requests_arriving_together_prefill_a_shared_system_prompt_once() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let system = "Thou art a player in a Shakespeare play. ".repeat(60);
    let reqs = system_chats(8, &system);
    let mut svc = service(&model, None);
    let together = ask_all(&mut svc, &reqs);
    let mut fresh = service(&model, Some(0));
    let alone = ask_all(&mut fresh, &reqs);
    for (a, b) in together.iter().zip(&alone) {
        assert_eq!(a["token_ids"], b["token_ids"], "{}", a["id"]);
    }
    let stats = svc.engine().cache_stats();
    let shared = cached(&svc_probe(&model, &reqs[0]));
    assert!(shared > 500, "the system turn: {shared} tokens");
    // The first prefills it; the seven others wait and continue from its checkpoint.
    assert_eq!(stats.followed, 7, "{stats:?}");
    let served: Vec<u64> = together.iter().map(cached).collect();
    assert_eq!(served.iter().filter(|&&c| c >= shared).count(), 7, "{served:?}");
    assert!(stats.tokens_memory >= 7 * shared, "{stats:?}");
}

/// How many tokens of `req` a cache holding one other conversation with
/// the same system prompt serves.
fn svc_probe(model: &Model<'_>, req: &Value) -> Value {
    let mut svc = service(model, None);
    let mut other = req.clone();
    other["messages"][1]["content"] = json!("Something else entirely.");
    ask(&mut svc, other);
    ask(&mut svc, req.clone())
}

/// A store that keeps checkpoint files as bytes (as a host would keep a
/// guest's) and never offers any back by itself.
struct Collect(Arc<Mutex<Vec<Vec<u8>>>>);

impl CheckpointStore for Collect {
    fn persist(&mut self, checkpoint: Checkpoint) {
        self.0.lock().unwrap().push(checkpoint.to_bytes());
    }

    fn fetch(
        &mut self,
        _: &[u32],
        _: usize,
        _: &dyn Fn(usize) -> bool,
        _: &Identity,
    ) -> Option<Decoded> {
        None
    }
}

#[test]
fn checkpoints_handed_over_as_bytes_serve_another_engine() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let tok = Arc::new(Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let kept = Arc::new(Mutex::new(Vec::new()));
    let engine = |kept: &Arc<Mutex<Vec<Vec<u8>>>>| {
        ModelEngine::new(&model, "tiny", stops.clone())
            .with_store(Box::new(Collect(Arc::clone(kept))), [9; 32])
    };
    let codec = TokenizerCodec::new(Arc::clone(&tok), stops.clone());
    let mut first = Service::new(engine(&kept), codec.clone(), StdClock::new(), Config::default());
    let reqs = system_chats(2, "Thou art a player in a Shakespeare play.");
    ask(&mut first, reqs[0].clone());
    let files = kept.lock().unwrap().clone();
    assert!(files.len() >= 3, "boundaries and the prompt's end: {}", files.len());
    let mut second = engine(&Arc::new(Mutex::new(Vec::new())));
    for f in &files {
        assert!(second.offer(f).unwrap() > 0);
    }
    let mut bad = files[0].clone();
    bad[200] ^= 1;
    assert!(second.offer(&bad).is_err(), "a damaged file is refused");
    let other = ModelEngine::new(&model, "tiny", stops.clone())
        .with_store(Box::new(Collect(Arc::new(Mutex::new(Vec::new())))), [8; 32]);
    let mut other = other;
    assert!(other.offer(&files[0]).is_err(), "another pack's file is refused");
    let mut svc = Service::new(second, codec, StdClock::new(), Config::default());
    let a = ask(&mut svc, reqs[1].clone());
    assert_eq!(a["token_ids"], ask(&mut service(&model, Some(0)), reqs[1].clone())["token_ids"]);
    assert!(cached(&a) > 10, "{a}");
    assert_eq!(svc.engine().cache_stats().hits_disk, 1, "handed-over checkpoints count as disk");
}
