//! kore-service over the real engine and tokenizer (model-packs/tiny-hf, the
//! trained tiny model): the tokens the protocol returns are exactly
//! `kore_engine::generate`'s for the same prompt and sampling parameters;
//! stop reasons, the context limit, cancellation and chat rendering behave as
//! docs/protocol.md says.

use std::path::PathBuf;
use std::sync::Arc;

use kore_appliance::{stop_ids, ModelEngine, OwnedDecoder, TokenizerCodec};
use kore_engine::hf::HfModelDir;
use kore_engine::{generate, GenerateOptions, Model, SamplingParams, StopReason};
use kore_service::host::StdClock;
use kore_service::{Config, Service, StreamDecode};
use kore_tokenizer::Tokenizer;
use serde_json::{json, Value};

type Svc<'m> = Service<ModelEngine<'m>, TokenizerCodec, StdClock>;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf")
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_file(tiny_dir().join("tokenizer.json")).expect("tiny tokenizer"))
}

fn service<'m>(model: &'m Model<'m>, stops: Option<Vec<u32>>, limit: Option<u32>) -> Svc<'m> {
    let tok = tokenizer();
    let stops = stops.unwrap_or_else(|| {
        stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size)
    });
    let mut engine = ModelEngine::new(model, "tiny", stops.clone());
    if let Some(l) = limit {
        engine = engine.with_context_limit(l);
    }
    Service::new(engine, TokenizerCodec::new(tok, stops), StdClock::new(), Config::default())
}

/// Sends `requests` on one connection, runs the service until idle, returns
/// every event it sent.
fn exchange(svc: &mut Svc<'_>, requests: &[Value]) -> Vec<Value> {
    let conn = svc.open();
    for r in requests {
        svc.on_bytes(conn, format!("{r}\n").as_bytes());
    }
    svc.on_eof(conn);
    while svc.poll() {}
    parse(&svc.take_output(conn))
}

fn parse(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("utf-8 output");
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

fn done(events: &[Value], id: &Value) -> Value {
    let mut dones = events.iter().filter(|e| &e["id"] == id && e.get("done").is_some());
    let d = dones.next().unwrap_or_else(|| panic!("no done event for {id} in {events:?}"));
    assert!(dones.next().is_none(), "two done events for {id}");
    d.clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn reference(
    model: &Model<'_>,
    prompt: &[u32],
    max: usize,
    stops: &[u32],
    s: SamplingParams,
) -> (Vec<u32>, StopReason) {
    let mut state = model.new_state();
    let opts = GenerateOptions { max_tokens: max, stop_tokens: stops.to_vec(), sampling: s };
    let g = generate(model, &mut state, prompt, &opts, |_| true).expect("reference generate");
    (g.tokens, g.stop)
}

#[test]
fn greedy_tokens_equal_engine_generate() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let mut svc = service(&model, None, None);
    let tok = tokenizer();
    let text = "ROMEO:\nBut soft, what light";
    let prompt = tok.encode(text);
    let stops = svc.engine().model().config.eos_token_ids.clone();
    let all_stops = stop_ids(Some(&*tok), &stops, None, 4096);
    let (want, why) =
        reference(svc.engine().model(), &prompt, 40, &all_stops, SamplingParams::greedy());
    let events = exchange(
        &mut svc,
        &[
            json!({"id": "text", "prompt": text, "max_tokens": 40}),
            json!({"id": "ids", "prompt_ids": prompt, "max_tokens": 40}),
        ],
    );
    for id in ["text", "ids"] {
        let d = done(&events, &json!(id));
        assert_eq!(ids(&d), want, "{id}");
        let finish = if why == StopReason::StopToken { "stop" } else { "length" };
        assert_eq!(d["finish"], finish);
        assert_eq!(d["stats"]["prompt_tokens"], prompt.len());
        assert_eq!(d["stats"]["generated_tokens"], want.len());
        assert_eq!(d["stats"]["context_used"], prompt.len() + want.len());
        // Raw mode: the answer is the decoded tokens (a final stop token's text aside).
        let body: Vec<u32> = want.iter().copied().filter(|t| !all_stops.contains(t)).collect();
        assert_eq!(d["text"], tok.decode(&body));
        let streamed: String = events
            .iter()
            .filter(|e| e["id"] == json!(id) && e.get("delta").is_some())
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(json!(streamed), d["text"]);
    }
}

#[test]
fn sampled_tokens_follow_seed_and_parameters() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let mut svc = service(&model, Some(vec![]), None);
    let prompt: Vec<u32> = tokenizer().encode("JULIET:\n");
    let s = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, min_p: 0.0, seed: 7 };
    let (want, _) = reference(svc.engine().model(), &prompt, 30, &[], s);
    let req = json!({"id": 1, "prompt_ids": prompt, "max_tokens": 30, "temperature": 0.8,
                     "top_k": 40, "top_p": 0.9, "seed": 7});
    let d = done(&exchange(&mut svc, &[req]), &json!(1));
    assert_eq!(ids(&d), want);
    let other = json!({"id": 2, "prompt_ids": prompt, "max_tokens": 30, "temperature": 0.8,
                       "top_k": 40, "top_p": 0.9, "seed": 8});
    let d2 = done(&exchange(&mut svc, &[other]), &json!(2));
    assert_ne!(ids(&d2), want, "another seed should sample differently over 30 tokens");
}

#[test]
fn stop_token_ends_with_stop_and_is_included() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let prompt = tokenizer().encode("KING HENRY:\nOnce more unto the breach");
    let (free, _) = reference(&model, &prompt, 16, &[], SamplingParams::greedy());
    // The first token (after the first one) that did not occur before it.
    let cut = (1..free.len()).find(|&i| !free[..i].contains(&free[i])).expect("a fresh token");
    let stop = free[cut];
    let mut svc = service(&model, Some(vec![stop]), None);
    let d = done(
        &exchange(&mut svc, &[json!({"id": 5, "prompt_ids": prompt, "max_tokens": 16})]),
        &json!(5),
    );
    assert_eq!(d["finish"], "stop");
    assert_eq!(ids(&d), free[..=cut].to_vec());
    // max_tokens below the stop position ends with "length".
    let d = done(
        &exchange(&mut svc, &[json!({"id": 6, "prompt_ids": prompt, "max_tokens": cut})]),
        &json!(6),
    );
    assert_eq!(d["finish"], "length");
    assert_eq!(ids(&d), free[..cut].to_vec());
}

#[test]
fn context_limit_is_enforced() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let prompt: Vec<u32> = (100..110).collect();
    let (want, _) = reference(&model, &prompt, 6, &[], SamplingParams::greedy());
    let mut svc = service(&model, Some(vec![]), Some(16));
    let long: Vec<u32> = (100..116).collect();
    let events = exchange(
        &mut svc,
        &[
            json!({"id": "long", "prompt_ids": long}),
            json!({"op": "info", "id": "i"}),
            json!({"id": "fits", "prompt_ids": prompt}),
        ],
    );
    let err = events.iter().find(|e| e["id"] == json!("long")).expect("an answer to long");
    assert_eq!(err["error"]["code"], "prompt_too_long", "{err}");
    let info = events.iter().find(|e| e["id"] == json!("i")).expect("info");
    assert_eq!(info["info"]["context_limit"], 16);
    assert_eq!(info["info"]["vocab_size"], 4096);
    let d = done(&events, &json!("fits"));
    assert_eq!(d["finish"], "length");
    assert_eq!(ids(&d), want);
    assert_eq!(d["stats"]["context_used"], 16);
    assert_eq!(d["stats"]["context_limit"], 16);
}

#[test]
fn cancelled_request_leaves_a_clean_state() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let prompt = tokenizer().encode("First Citizen:\n");
    let (want, _) = reference(&model, &prompt, 12, &[], SamplingParams::greedy());
    let mut svc = service(&model, Some(vec![]), None);
    // Start a request, run a few steps, then the client disconnects.
    let conn = svc.open();
    svc.on_bytes(
        conn,
        format!("{}\n", json!({"id": 1, "prompt": "Hark", "max_tokens": 100})).as_bytes(),
    );
    for _ in 0..4 {
        svc.poll();
    }
    assert!(svc.busy());
    svc.on_closed(conn);
    assert!(!svc.busy());
    // A cancel on the same connection ends the request with "cancelled".
    let c2 = svc.open();
    svc.on_bytes(
        c2,
        format!("{}\n", json!({"id": 2, "prompt": "Hark", "max_tokens": 100})).as_bytes(),
    );
    for _ in 0..3 {
        svc.poll();
    }
    svc.on_bytes(c2, b"{\"cancel\": 2}\n");
    let events = parse(&svc.take_output(c2));
    assert_eq!(done(&events, &json!(2))["finish"], "cancelled");
    // The next request sees a fresh sequence.
    let d = done(
        &exchange(&mut svc, &[json!({"id": 3, "prompt_ids": prompt, "max_tokens": 12})]),
        &json!(3),
    );
    assert_eq!(ids(&d), want);
}

#[test]
fn chat_renders_the_template_with_thinking_on_and_off() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let tok = tokenizer();
    let template = kore_tokenizer::ChatTemplate::new(&tok).expect("Qwen3.5 chat tokens");
    let msgs = [kore_tokenizer::ChatMessage::new(kore_tokenizer::Role::User, "Speak, Horatio.")];
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, 4096);
    let mut want = Vec::new();
    for thinking in [true, false] {
        let opts = kore_tokenizer::ChatOptions { add_generation_prompt: true, thinking };
        let prompt = template.render(&tok, &msgs, opts).expect("render");
        want.push((
            prompt.len(),
            reference(&model, &prompt, 20, &stops, SamplingParams::greedy()).0,
        ));
    }
    let mut svc = service(&model, None, None);
    let messages = json!([{"role": "user", "content": "Speak, Horatio."}]);
    let events = exchange(
        &mut svc,
        &[
            json!({"id": "on", "messages": messages, "thinking": "on", "max_tokens": 20}),
            json!({"id": "off", "messages": messages, "thinking": false, "max_tokens": 20}),
        ],
    );
    for (id, (prompt_len, tokens)) in ["on", "off"].iter().zip(want) {
        let d = done(&events, &json!(id));
        assert_eq!(d["stats"]["prompt_tokens"], prompt_len, "{id}");
        assert_eq!(ids(&d), tokens, "{id}");
        assert!(d["thinking"].is_string(), "chat requests report thinking: {d}");
    }
    // Thinking on starts in the thinking phase: the first delta (if any before
    // a </think>) is "thinking".
    if let Some(first) = events.iter().find(|e| e["id"] == json!("on") && e.get("delta").is_some())
    {
        let think_close = tok.token_to_id("</think>").unwrap();
        let d = done(&events, &json!("on"));
        let phase = if ids(&d).first() == Some(&think_close) { "answer" } else { "thinking" };
        assert_eq!(first["phase"], phase);
    }
}

#[test]
fn owned_decoder_streams_whole_characters() {
    let tok = tokenizer();
    let text = "héllo wörld — “quoted” 世界 🎉 <|im_end|> done";
    let ids = tok.encode(text);
    let mut d = OwnedDecoder::new(Arc::clone(&tok));
    let mut out = String::new();
    for &id in &ids {
        let piece = d.push(id);
        out.push_str(&piece);
    }
    out.push_str(&d.flush());
    assert_eq!(out, tok.decode(&ids));
    // A cut character comes out as U+FFFD on flush, like decode's lossy UTF-8.
    let snowman = tok.encode("🎉");
    if snowman.len() > 1 {
        let mut d = OwnedDecoder::new(Arc::clone(&tok));
        assert_eq!(d.push(snowman[0]), "");
        assert_eq!(d.flush(), tok.decode(&snowman[..1]));
    }
}

#[test]
fn mtp_greedy_tokens_equal_plain_decoding_in_fewer_steps() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    assert!(model.has_mtp(), "tiny-hf has an MTP head");
    let prompt = tokenizer().encode("ROMEO:\nBut soft, what light through yonder window");
    let (want, _) = reference(&model, &prompt, 48, &[], SamplingParams::greedy());
    let mut svc = service(&model, Some(vec![]), None);
    let mut reqs = Vec::new();
    for n in [0, 1, 3, 7] {
        reqs.push(json!({"id": n, "prompt_ids": prompt, "max_tokens": 48, "mtp": n}));
    }
    let events = exchange(&mut svc, &reqs);
    for n in [0, 1, 3, 7] {
        let d = done(&events, &json!(n));
        assert_eq!(ids(&d), want, "mtp {n}");
        assert_eq!(d["finish"], "length", "mtp {n}");
        let tps = d["stats"]["tokens_per_step"].as_f64().unwrap();
        if n == 0 {
            assert_eq!(tps, 1.0, "{d}");
        } else {
            // A trained head's drafts are accepted often (FACTS.md: 0.6-0.9 per position).
            assert!(tps > 1.0, "mtp {n}: {d}");
        }
    }
}

#[test]
fn mtp_ends_at_max_tokens_and_stop_tokens_exactly() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let prompt = tokenizer().encode("KING HENRY:\nOnce more unto the breach");
    let (free, _) = reference(&model, &prompt, 24, &[], SamplingParams::greedy());
    let cut = (1..free.len()).find(|&i| !free[..i].contains(&free[i])).expect("a fresh token");
    let mut svc = service(&model, Some(vec![free[cut]]), None);
    let mut reqs = Vec::new();
    for max in 1..=6 {
        reqs.push(json!({"id": max, "prompt_ids": prompt, "max_tokens": max, "mtp": 3}));
    }
    reqs.push(json!({"id": "stop", "prompt_ids": prompt, "max_tokens": 24, "mtp": 3}));
    let events = exchange(&mut svc, &reqs);
    for max in 1..=6usize {
        let d = done(&events, &json!(max));
        let n = max.min(cut + 1);
        assert_eq!(ids(&d), free[..n].to_vec(), "max_tokens {max}");
    }
    let d = done(&events, &json!("stop"));
    assert_eq!(d["finish"], "stop");
    assert_eq!(ids(&d), free[..=cut].to_vec());
}

#[test]
fn mtp_sampling_follows_the_seed() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let mut svc = service(&model, Some(vec![]), None);
    let prompt: Vec<u32> = tokenizer().encode("JULIET:\n");
    let req = |id: u32, seed: u64| {
        json!({"id": id, "prompt_ids": prompt, "max_tokens": 30, "temperature": 0.8,
               "top_k": 40, "seed": seed, "mtp": 2})
    };
    let events = exchange(&mut svc, &[req(1, 7), req(2, 7), req(3, 8)]);
    let (a, b, c) = (
        ids(&done(&events, &json!(1))),
        ids(&done(&events, &json!(2))),
        ids(&done(&events, &json!(3))),
    );
    assert_eq!(a.len(), 30);
    assert_eq!(a, b, "same seed, same tokens");
    assert_ne!(a, c, "another seed should sample differently over 30 tokens");
}

#[test]
fn mtp_out_of_range_is_a_bad_request_and_the_service_goes_on() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let mut svc = service(&model, Some(vec![]), None);
    let events = exchange(
        &mut svc,
        &[
            json!({"id": "big", "prompt_ids": [100, 101], "max_tokens": 4, "mtp": 8}),
            json!({"id": "ok", "prompt_ids": [100, 101], "max_tokens": 4, "mtp": 2}),
        ],
    );
    let err = events.iter().find(|e| e["id"] == json!("big")).expect("an answer to big");
    assert_eq!(err["error"]["code"], "bad_request", "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("at most 7"), "{err}");
    assert_eq!(ids(&done(&events, &json!("ok"))).len(), 4);
}

#[test]
fn bench_op_reports_kore_engine_bench_figures() {
    let hf = HfModelDir::open(&tiny_dir()).expect("tiny-hf");
    let model = hf.model().expect("model");
    let tok = tokenizer();
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, 4096);
    let engine = ModelEngine::new(&model, "tiny", stops.clone()).with_bench_buffer(64 << 20);
    let mut svc =
        Service::new(engine, TokenizerCodec::new(tok, stops), StdClock::new(), Config::default());
    let events = exchange(
        &mut svc,
        &[
            json!({"op": "bench", "id": 1, "prompt_tokens": 16, "decode_tokens": 8}),
            json!({"op": "bench", "id": 2, "threads": 3}),
            json!({"op": "bench", "id": 3, "prompt_tokens": 4000, "decode_tokens": 200}),
        ],
    );
    let b = &events.iter().find(|e| e["id"] == json!(1)).expect("bench 1")["bench"];
    for k in kore_service::protocol::BENCH_POSITIVE_FIELDS {
        assert!(b[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {b}");
    }
    assert_eq!(b["weight_bytes_per_step"].as_f64().unwrap(), model.weight_bytes_per_token() as f64);
    assert_eq!(b["tokens_per_step"], 1.0);
    assert_eq!(b["threads"], 1, "the model runs on the serial pool");
    let e2 = events.iter().find(|e| e["id"] == json!(2)).expect("bench 2");
    assert_eq!(e2["error"]["code"], "bad_request", "{e2}");
    let e3 = events.iter().find(|e| e["id"] == json!(3)).expect("bench 3");
    assert_eq!(e3["error"]["code"], "bad_request", "{e3}");
}
