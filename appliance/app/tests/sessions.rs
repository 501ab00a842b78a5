//! Sessions over the real engine (model-packs/tiny-hf, and the default pack
//! model-packs/tiny for the chat): a 10-turn chat in one
//! session prefills only each turn's new tokens (`stats.cached_tokens` = the
//! earlier turns, up to the previous generation prompt's `<think>`), and every
//! answer equals a fresh request of the same conversation without a session;
//! raw prompts that extend the previous request continue after its answer;
//! a prompt that diverges starts over; the byte budget drops the least
//! recently used session.

use std::path::PathBuf;
use std::sync::Arc;

use kore_appliance::{stop_ids, ModelEngine, TokenizerCodec};
use kore_engine::hf::HfModelDir;
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

fn service_in<'m>(dir: &std::path::Path, model: &'m Model<'m>, budget: Option<usize>) -> Svc<'m> {
    let tok = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let mut engine = ModelEngine::new(model, "tiny", stops.clone());
    if let Some(b) = budget {
        engine = engine.with_session_budget(b);
    }
    Service::new(engine, TokenizerCodec::new(tok, stops), StdClock::new(), Config::default())
}

/// Sends one request, runs it, returns its done event.
fn ask(svc: &mut Svc<'_>, req: Value) -> Value {
    let c = svc.open();
    svc.on_bytes(c, format!("{req}\n").as_bytes());
    while svc.poll() {}
    let text = String::from_utf8(svc.take_output(c)).unwrap();
    svc.on_closed(c);
    let done = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|e| {
        assert!(e.get("error").is_none(), "{e}");
        e["done"] == true
    });
    done.expect("a done event")
}

#[test]
fn ten_turn_chat_reuses_the_earlier_turns_and_answers_as_a_fresh_prefill() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    ten_turns(&tiny_dir(), &hf.model().unwrap());
}

#[test]
fn ten_turn_chat_on_the_default_pack() {
    let dir = tiny_dir().join("../tiny");
    let pack = kore_pack::Pack::open(&dir).unwrap();
    ten_turns(&dir, &pack.model().unwrap());
}

fn ten_turns(dir: &std::path::Path, model: &Model<'_>) {
    let mut kept = service_in(dir, model, None);
    let mut fresh = service_in(dir, model, None);
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
        with["session"] = json!("conv");
        let a = ask(&mut kept, with);
        let b = ask(&mut fresh, req);
        assert_eq!(a["token_ids"], b["token_ids"], "turn {k}: session vs fresh prefill");
        assert_eq!(a["text"], b["text"], "turn {k}");
        assert_eq!(b["stats"]["cached_tokens"], 0);
        let cached = a["stats"]["cached_tokens"].as_u64().unwrap();
        let prompt = a["stats"]["prompt_tokens"].as_u64().unwrap();
        if k == 0 {
            assert_eq!(cached, 0);
        } else {
            // Everything up to the previous generation prompt's `<think>`
            // (`<think>\n\n</think>\n\n`: 4 tokens at most): earlier turns.
            assert!(cached + 4 >= prev_prompt && cached < prev_prompt, "turn {k}: {cached}");
        }
        eprintln!("turn {k}: prompt {prompt} tokens, {cached} cached, answer {}", a["text"]);
        prev_prompt = prompt;
        messages.push(json!({"role": "assistant", "content": a["text"]}));
    }
    assert_eq!(kept.engine().kept_sessions().0, 1);
}

#[test]
fn raw_prompts_continue_after_the_answer_or_start_over() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let mut svc = service(&model, None);
    let first =
        ask(&mut svc, json!({"prompt_ids": [1767, 36, 46], "max_tokens": 6, "session": "s"}));
    let ids: Vec<u64> =
        first["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let mut next: Vec<u64> = vec![1767, 36, 46];
    next.extend(&ids);
    next.extend([11, 479]);
    let cont = json!({"prompt_ids": next, "max_tokens": 6});
    let mut with = cont.clone();
    with["session"] = json!("s");
    let a = ask(&mut svc, with);
    // The state covers the prompt and every generated token but the last.
    assert_eq!(a["stats"]["cached_tokens"], 3 + ids.len() - 1);
    let b = ask(&mut svc, cont);
    assert_eq!(a["token_ids"], b["token_ids"]);
    let other = ask(&mut svc, json!({"prompt_ids": [5, 6, 7], "max_tokens": 2, "session": "s"}));
    assert_eq!(other["stats"]["cached_tokens"], 0, "a diverging prompt starts over");
}

#[test]
fn the_budget_drops_the_least_recently_used_session() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    // Room for about two sessions of this size.
    let one = {
        let mut probe = service(&model, None);
        ask(&mut probe, json!({"prompt_ids": [1, 2, 3, 4], "max_tokens": 3, "session": "p"}));
        probe.engine().kept_sessions().1
    };
    let mut svc = service(&model, Some(one * 5 / 2));
    for name in ["a", "b", "c"] {
        ask(&mut svc, json!({"prompt_ids": [1, 2, 3, 4], "max_tokens": 3, "session": name}));
    }
    assert_eq!(svc.engine().kept_sessions().0, 2);
    let extend =
        |name: &str| json!({"prompt_ids": [1, 2, 3, 4, 9], "max_tokens": 1, "session": name});
    assert_eq!(ask(&mut svc, extend("a"))["stats"]["cached_tokens"], 0, "a was evicted");
    assert!(ask(&mut svc, extend("c"))["stats"]["cached_tokens"].as_u64().unwrap() >= 4);
}

#[test]
fn a_system_prompt_is_prefilled_once_for_every_session() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let mut svc = service(&model, None);
    let mut fresh = service(&model, None);
    let system = json!({"role": "system", "content": "Thou art a player in a Shakespeare play."});
    let mut cached = Vec::new();
    for (name, user) in [("a", "Who art thou?"), ("b", "What news?"), ("c", "Speak.")] {
        let msgs = json!([system, {"role": "user", "content": user}]);
        let req = json!({"messages": msgs, "thinking": false, "max_tokens": 8});
        let mut with = req.clone();
        with["session"] = json!(name);
        let a = ask(&mut svc, with);
        assert_eq!(a["token_ids"], ask(&mut fresh, req)["token_ids"], "session {name}");
        cached.push(a["stats"]["cached_tokens"].as_u64().unwrap());
    }
    assert_eq!(cached[0], 0, "nothing shared yet");
    assert!(cached[1] > 10 && cached[1] == cached[2], "system turn shared: {cached:?}");
}
