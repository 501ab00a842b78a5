//! Behaviour of the service over its sans-I/O interface, with the fake engine
//! and tokenizer: streaming order, phases, stats, cancellation, disconnects,
//! many connections, hostile input and every limit.

use kore_service::fake::{
    Behaviour, FakeCodec, FakeEngine, ManualClock, IM_END, THINK_CLOSE, THINK_OPEN,
};
use kore_service::{Config, ConnId, Service};
use serde_json::{json, Value};

type Svc = Service<FakeEngine, FakeCodec, ManualClock>;

fn service(behaviour: Behaviour, context: u32, config: Config) -> Svc {
    Service::new(
        FakeEngine::new(behaviour, context),
        FakeCodec,
        ManualClock::new(1_000_000),
        config,
    )
}

fn echo() -> Svc {
    service(Behaviour::Echo, 4096, Config::default())
}

fn text_ids(s: &str) -> Vec<u32> {
    FakeCodec::text_ids(s)
}

fn send(svc: &mut Svc, c: ConnId, v: &Value) {
    let mut line = serde_json::to_vec(v).unwrap();
    line.push(b'\n');
    svc.on_bytes(c, &line);
}

fn drain(svc: &mut Svc) {
    let mut guard = 0;
    while svc.poll() {
        guard += 1;
        assert!(guard < 1_000_000, "service never went idle");
    }
}

fn events(svc: &mut Svc, c: ConnId) -> Vec<Value> {
    let out = svc.take_output(c);
    assert!(out.is_empty() || out.ends_with(b"\n"), "output ends mid-line");
    out.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("every output line is JSON"))
        .collect()
}

fn done_of(evs: &[Value], id: &Value) -> Value {
    let mut done: Vec<&Value> =
        evs.iter().filter(|e| &e["id"] == id && e["done"] == true).collect();
    assert_eq!(done.len(), 1, "exactly one done for {id}: {evs:?}");
    done.remove(0).clone()
}

fn error_code(ev: &Value) -> &str {
    ev["error"]["code"].as_str().unwrap_or("")
}

#[test]
fn chat_streams_thinking_then_answer_with_stats() {
    let mut script = text_ids("\nLet me think.\n");
    script.push(THINK_CLOSE);
    script.extend(text_ids("\n\nHello there"));
    script.push(IM_END);
    let mut svc = service(Behaviour::Script(script.clone()), 4096, Config::default());
    let c = svc.open();
    send(
        &mut svc,
        c,
        &json!({"id":"a","messages":[{"role":"user","content":"hi"}],"thinking":"on"}),
    );
    drain(&mut svc);
    let evs = events(&mut svc, c);
    let deltas: Vec<&Value> = evs.iter().filter(|e| e.get("delta").is_some()).collect();
    assert!(!deltas.is_empty());
    // Thinking deltas all come before answer deltas, and no marker text leaks.
    let phases: Vec<&str> = deltas.iter().map(|d| d["phase"].as_str().unwrap()).collect();
    let first_answer = phases.iter().position(|p| *p == "answer").unwrap();
    assert!(phases[..first_answer].iter().all(|p| *p == "thinking"));
    assert!(phases[first_answer..].iter().all(|p| *p == "answer"));
    let thinking: String = deltas
        .iter()
        .filter(|d| d["phase"] == "thinking")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    let answer: String = deltas
        .iter()
        .filter(|d| d["phase"] == "answer")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, "Let me think.");
    assert_eq!(answer, "Hello there");
    assert!(evs.iter().all(|e| !e.to_string().contains("think>")));
    // The done event is last and carries everything.
    let done = evs.last().unwrap();
    assert_eq!(done["id"], "a");
    assert_eq!(done["finish"], "stop");
    assert!(done.get("stop_sequence").is_none(), "a stop token, not a string: {done}");
    assert_eq!(done["text"], "Hello there");
    assert_eq!(done["thinking"], "Let me think.");
    let ids: Vec<u32> = serde_json::from_value(done["token_ids"].clone()).unwrap();
    assert_eq!(ids, script);
    let stats = &done["stats"];
    for k in [
        "prompt_tokens",
        "generated_tokens",
        "prefill_ms",
        "prefill_tok_per_s",
        "decode_tok_per_s",
        "tokens_per_step",
        "context_used",
        "context_limit",
    ] {
        assert!(stats[k].is_number(), "stats.{k} missing: {stats}");
    }
    let prompt = FakeCodec.render_chat_for_test("hi", true);
    assert_eq!(stats["prompt_tokens"], prompt as u64);
    assert_eq!(stats["generated_tokens"], script.len() as u64);
    assert_eq!(stats["context_used"], (prompt + script.len()) as u64);
    assert_eq!(stats["context_limit"], 4096);
    assert_eq!(stats["tokens_per_step"], 1.0);
    // The fake clock ticks 1 ms per reading: every stat is positive and finite.
    assert!(stats["prefill_ms"].as_f64().unwrap() > 0.0);
    assert!(stats["decode_tok_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(svc.engine().finished, 1);
}

trait PromptLen {
    fn render_chat_for_test(&self, user: &str, thinking: bool) -> usize;
}

impl PromptLen for FakeCodec {
    fn render_chat_for_test(&self, user: &str, thinking: bool) -> usize {
        use kore_service::{Codec, Message, Role};
        let m = [Message::new(Role::User, user)];
        self.render_chat(&m, None, thinking).unwrap().len()
    }
}

#[test]
fn thinking_off_is_all_answer() {
    let mut svc = echo();
    let c = svc.open();
    send(
        &mut svc,
        c,
        &json!({"id":1,"messages":[{"role":"user","content":"just answer"}],"thinking":false}),
    );
    drain(&mut svc);
    let evs = events(&mut svc, c);
    assert!(evs.iter().filter(|e| e.get("delta").is_some()).all(|e| e["phase"] == "answer"));
    let done = done_of(&evs, &json!(1));
    assert_eq!(done["text"], "just answer");
    assert_eq!(done["thinking"], "");
    // Thinking off reached the template: the prompt closes the think block.
    let (prompt, _) = &svc.engine().started[0];
    assert!(prompt.ends_with(&[THINK_CLOSE, 10, 10]));
}

#[test]
fn raw_prompt_is_exact_and_answer_phase() {
    let mut svc = echo();
    let c = svc.open();
    send(&mut svc, c, &json!({"id":"r","prompt":"  raw <|endoftext|> text\n"}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    let done = done_of(&evs, &json!("r"));
    // Special-token text in a raw prompt is recognised (the echo drops it).
    assert_eq!(done["text"], "  raw  text\n");
    assert!(done.get("thinking").is_none());
    assert!(evs.iter().filter(|e| e.get("delta").is_some()).all(|e| e["phase"] == "answer"));
    let last = done["token_ids"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last, json!(IM_END));
    send(&mut svc, c, &json!({"id":"p","prompt_ids":[104, 105]}));
    drain(&mut svc);
    assert_eq!(done_of(&events(&mut svc, c), &json!("p"))["text"], "hi");
}

#[test]
fn max_tokens_mtp_and_stop_strings() {
    let mut svc = service(Behaviour::Script(text_ids("abcdefghij")), 4096, Config::default());
    let c = svc.open();
    send(&mut svc, c, &json!({"id":1,"prompt":"x","max_tokens":4}));
    drain(&mut svc);
    let done = done_of(&events(&mut svc, c), &json!(1));
    assert_eq!((done["finish"].as_str(), done["text"].as_str()), (Some("length"), Some("abcd")));
    // Two drafts per step: 1 token from prefill, then 3 per step.
    send(&mut svc, c, &json!({"id":2,"prompt":"x","max_tokens":7,"mtp":2}));
    drain(&mut svc);
    let done = done_of(&events(&mut svc, c), &json!(2));
    assert_eq!(done["text"], "abcdefg");
    assert_eq!(done["stats"]["tokens_per_step"], 3.0);
    assert_eq!(svc.engine().started[1].1.mtp, Some(2));
    // A stop string ends the answer; its text is never streamed.
    send(&mut svc, c, &json!({"id":3,"prompt":"x","stop":["zz","de"],"max_tokens":9}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    let done = done_of(&evs, &json!(3));
    assert_eq!((done["finish"].as_str(), done["text"].as_str()), (Some("stop"), Some("abc")));
    assert_eq!(done["stop_sequence"], "de");
    let streamed: String = evs.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert_eq!(streamed, "abc");
}

#[test]
fn context_limit_bounds_generation_and_rejects_long_prompts() {
    let mut svc = service(Behaviour::Script(vec![]), 16, Config::default());
    let c = svc.open();
    send(&mut svc, c, &json!({"id":1,"prompt":"0123456789"}));
    drain(&mut svc);
    let done = done_of(&events(&mut svc, c), &json!(1));
    assert_eq!(done["finish"], "length");
    assert_eq!(done["stats"]["context_used"], 16);
    assert_eq!(done["stats"]["generated_tokens"], 6);
    for prompt in ["0123456789abcdef", "0123456789abcdefXYZ"] {
        send(&mut svc, c, &json!({"id":2,"prompt":prompt}));
        let evs = events(&mut svc, c);
        assert_eq!(error_code(&evs[0]), "prompt_too_long", "{evs:?}");
        assert_eq!(evs[0]["id"], 2);
    }
    assert!(!svc.has_work(), "a rejected prompt must not be queued");
    assert_eq!(svc.engine().started.len(), 1);
}

#[test]
fn cancel_mid_stream_stops_at_next_token() {
    let mut svc = service(Behaviour::Script(vec![]), 100_000, Config::default());
    let c = svc.open();
    send(&mut svc, c, &json!({"id":"long","prompt":"go"}));
    // The first poll starts the request and runs its first step too.
    for _ in 0..4 {
        svc.poll();
    }
    let before = events(&mut svc, c);
    assert!(before.iter().any(|e| e.get("delta").is_some()));
    send(&mut svc, c, &json!({"cancel":"long"}));
    let evs = events(&mut svc, c);
    let done = done_of(&evs, &json!("long"));
    assert_eq!(done["finish"], "cancelled");
    assert_eq!(done["stats"]["generated_tokens"], 4);
    assert!(!svc.has_work());
    assert_eq!(svc.engine().finished, 1);
    // Cancelling again (already finished) is silent; the connection still works.
    send(&mut svc, c, &json!({"cancel":"long"}));
    assert!(events(&mut svc, c).is_empty());
    send(&mut svc, c, &json!({"id":"long","prompt":"go","max_tokens":2}));
    drain(&mut svc);
    assert_eq!(done_of(&events(&mut svc, c), &json!("long"))["finish"], "length");
}

#[test]
fn cancel_of_a_queued_request() {
    let mut svc = echo();
    let c = svc.open();
    send(&mut svc, c, &json!({"id":1,"prompt":"first"}));
    send(&mut svc, c, &json!({"id":2,"prompt":"second"}));
    send(&mut svc, c, &json!({"cancel":2}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    assert_eq!(done_of(&evs, &json!(2))["finish"], "cancelled");
    assert_eq!(done_of(&evs, &json!(1))["text"], "first");
    assert_eq!(svc.engine().started.len(), 1);
}

#[test]
fn disconnect_cancels_running_and_queued_work() {
    let mut svc = service(Behaviour::Script(vec![]), 100_000, Config::default());
    let gone = svc.open();
    let stays = svc.open();
    send(&mut svc, gone, &json!({"id":1,"prompt":"a"}));
    send(&mut svc, gone, &json!({"id":2,"prompt":"b"}));
    send(&mut svc, stays, &json!({"id":3,"prompt":"c","max_tokens":3}));
    for _ in 0..4 {
        svc.poll();
    }
    svc.on_closed(gone);
    assert_eq!(svc.engine().finished, 1, "the running request was stopped");
    assert_eq!(svc.queued(), 1);
    drain(&mut svc);
    assert_eq!(done_of(&events(&mut svc, stays), &json!(3))["finish"], "length");
    assert_eq!(svc.engine().started.len(), 2);
    assert!(svc.output(gone).is_empty());
    assert!(svc.should_close(gone));
}

#[test]
fn twenty_connections_none_lost() {
    let mut svc = echo();
    let conns: Vec<ConnId> = (0..20).map(|_| svc.open()).collect();
    // Requests arrive byte by byte, interleaved across connections, while
    // the service is generating.
    let lines: Vec<Vec<u8>> = (0..20)
        .map(|i| format!("{{\"id\":{i},\"messages\":[{{\"role\":\"user\",\"content\":\"request number {i}\"}}],\"thinking\":\"off\"}}\n").into_bytes())
        .collect();
    let longest = lines.iter().map(Vec::len).max().unwrap();
    let mut outputs: Vec<Vec<u8>> = vec![Vec::new(); 20];
    for pos in 0..longest {
        for (i, c) in conns.iter().enumerate() {
            if let Some(b) = lines[i].get(pos) {
                svc.on_bytes(*c, &[*b]);
            }
        }
        svc.poll();
        for (i, c) in conns.iter().enumerate() {
            outputs[i].extend(svc.take_output(*c));
        }
    }
    drain(&mut svc);
    for (i, c) in conns.iter().enumerate() {
        outputs[i].extend(svc.take_output(*c));
        let evs: Vec<Value> = outputs[i]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert!(evs.iter().all(|e| e["id"] == i), "connection {i} got another's events");
        let done = done_of(&evs, &json!(i));
        assert_eq!(done["text"], format!("request number {i}"));
        assert_eq!(done["finish"], "stop");
    }
    assert_eq!(svc.engine().started.len(), 20);
    assert_eq!(svc.engine().finished, 20);
}

#[test]
fn queue_overflow_is_overloaded() {
    let config = Config { queue_limit: 2, ..Config::default() };
    let mut svc = service(Behaviour::Echo, 4096, config);
    let c = svc.open();
    for i in 0..4 {
        send(&mut svc, c, &json!({"id":i,"prompt":format!("p{i}")}));
    }
    let evs = events(&mut svc, c);
    assert_eq!(evs.len(), 2);
    assert!(evs.iter().all(|e| error_code(e) == "overloaded"));
    assert_eq!((evs[0]["id"].clone(), evs[1]["id"].clone()), (json!(2), json!(3)));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    assert_eq!(done_of(&evs, &json!(0))["text"], "p0");
    assert_eq!(done_of(&evs, &json!(1))["text"], "p1");
    // Once running, the first request no longer counts against the queue.
    send(&mut svc, c, &json!({"id":"x","prompt":"x"}));
    svc.poll();
    send(&mut svc, c, &json!({"id":"y","prompt":"y"}));
    send(&mut svc, c, &json!({"id":"z","prompt":"z"}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    assert!(evs.iter().all(|e| e.get("error").is_none()), "{evs:?}");
}

#[test]
fn bad_lines_get_errors_and_the_connection_stays_usable() {
    let mut svc = echo();
    let c = svc.open();
    let cases: [(&[u8], &str, Value); 8] = [
        (b"{not json\n", "bad_json", Value::Null),
        (b"\xff\xfe\n", "bad_json", Value::Null),
        (b"[1,2]\n", "bad_json", Value::Null),
        (b"{\"id\":5}\n", "bad_request", json!(5)),
        (b"{\"id\":\"q\",\"prompt\":7}\n", "bad_request", json!("q")),
        (b"{\"id\":{},\"prompt\":\"x\"}\n", "bad_request", Value::Null),
        (b"{\"id\":6,\"prompt_ids\":[99999]}\n", "bad_request", json!(6)),
        (b"{\"id\":7,\"prompt\":\"x\",\"temperature\":\"hot\"}\n", "bad_request", json!(7)),
    ];
    for (line, code, id) in cases {
        svc.on_bytes(c, line);
        let evs = events(&mut svc, c);
        assert_eq!(evs.len(), 1, "{:?}", String::from_utf8_lossy(line));
        assert_eq!(error_code(&evs[0]), code);
        assert_eq!(evs[0]["id"], id);
        assert!(!evs[0]["error"]["message"].as_str().unwrap().is_empty());
    }
    send(&mut svc, c, &json!({"id":"ok","prompt":"still here"}));
    drain(&mut svc);
    assert_eq!(done_of(&events(&mut svc, c), &json!("ok"))["text"], "still here");
}

#[test]
fn over_long_line_errors_and_resyncs() {
    let config = Config { max_line_bytes: 1000, ..Config::default() };
    let mut svc = service(Behaviour::Echo, 1 << 20, config);
    let c = svc.open();
    let long = format!("{{\"id\":1,\"prompt\":\"{}\"}}", "a".repeat(5000));
    for chunk in long.as_bytes().chunks(300) {
        svc.on_bytes(c, chunk);
    }
    svc.on_bytes(c, b"\n{\"id\":2,\"prompt\":\"short\"}\n");
    drain(&mut svc);
    let evs = events(&mut svc, c);
    assert_eq!(error_code(&evs[0]), "line_too_long");
    assert_eq!(evs[0]["id"], Value::Null);
    assert_eq!(evs.iter().filter(|e| e.get("error").is_some()).count(), 1);
    assert_eq!(done_of(&evs, &json!(2))["text"], "short");
}

#[test]
fn random_bytes_never_break_the_service() {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let config = Config { max_line_bytes: 256, ..Config::default() };
    let mut svc = service(Behaviour::Echo, 512, config);
    let alphabet: &[u8] =
        b"{}[]\":,0123456789-+.eE truefalsnul\\u\n\r\tidpromptmessagesrolecontent\xff\xc3";
    for round in 0..300 {
        let c = svc.open();
        let len = (next() % 2000) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let r = next();
                if r % 4 == 0 {
                    (r >> 8) as u8
                } else {
                    alphabet[(r >> 8) as usize % alphabet.len()]
                }
            })
            .collect();
        for chunk in bytes.chunks(1 + (next() % 64) as usize) {
            svc.on_bytes(c, chunk);
            svc.poll();
        }
        // After a newline the same connection serves a valid request.
        svc.on_bytes(c, b"\n");
        send(&mut svc, c, &json!({"id":"check","prompt":"ok"}));
        drain(&mut svc);
        let out = svc.take_output(c);
        let evs: Vec<Value> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("output stays JSON lines"))
            .collect();
        let done = done_of(&evs, &json!("check"));
        assert_eq!(done["text"], "ok", "round {round}");
        if round % 2 == 0 {
            svc.on_closed(c);
        } else {
            svc.on_eof(c);
            drain(&mut svc);
            svc.take_output(c);
            assert!(svc.should_close(c));
            svc.on_closed(c);
        }
    }
    assert_eq!(svc.connections(), 0);
}

#[test]
fn duplicate_ids_info_and_bench() {
    let mut svc = service(Behaviour::Script(vec![]), 4096, Config::default());
    let c = svc.open();
    send(&mut svc, c, &json!({"id":"d","prompt":"x","max_tokens":2}));
    send(&mut svc, c, &json!({"id":"d","prompt":"y"}));
    send(&mut svc, c, &json!({"op":"info","id":"i"}));
    let evs = events(&mut svc, c);
    assert_eq!(error_code(&evs[0]), "duplicate_id");
    let info = &evs[1]["info"];
    assert_eq!(evs[1]["id"], "i");
    assert_eq!(info["model"], "fake");
    assert_eq!(info["context_limit"], 4096);
    assert_eq!(info["vocab_size"], 261);
    assert_eq!(info["queued"], 1);
    assert_eq!(info["scheduling"], "fifo");
    assert!(info["version"].is_string());
    // Another connection may reuse the id.
    let other = svc.open();
    send(&mut svc, other, &json!({"id":"d","prompt":"z","max_tokens":1}));
    send(&mut svc, other, &json!({"op":"bench","id":"b","threads":3}));
    drain(&mut svc);
    let evs = events(&mut svc, other);
    assert_eq!(done_of(&evs, &json!("d"))["finish"], "length");
    let bench = evs.iter().find(|e| e["id"] == "b").unwrap();
    assert_eq!(bench["bench"]["threads"], 3);
}

#[test]
fn engine_failure_is_internal_and_service_survives() {
    let mut engine = FakeEngine::new(Behaviour::Script(vec![]), 4096);
    engine.fail_at_step = Some(2);
    engine.prefill_steps = 1;
    let mut svc = Service::new(engine, FakeCodec, ManualClock::new(1000), Config::default());
    let c = svc.open();
    send(&mut svc, c, &json!({"id":1,"prompt":"x"}));
    send(&mut svc, c, &json!({"id":2,"prompt":"x","max_tokens":1}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    let err = evs.iter().find(|e| e["id"] == 1 && e.get("error").is_some()).unwrap();
    assert_eq!(error_code(err), "internal");
    assert!(evs.iter().all(|e| !(e["id"] == 1 && e.get("done").is_some())));
    // Request 1 streamed its first token before the failure.
    assert!(evs.iter().any(|e| e["id"] == 1 && e.get("delta").is_some()));
    // Request 2 needs one token, produced before the injected failing step.
    assert_eq!(done_of(&evs, &json!(2))["finish"], "length");
    assert_eq!(svc.engine().finished, 2);
}

#[test]
fn eof_lets_requests_finish_then_closes() {
    let mut svc = echo();
    let c = svc.open();
    svc.on_bytes(c, b"{\"id\":1,\"prompt\":\"bye\"}");
    svc.on_eof(c);
    assert!(!svc.should_close(c));
    drain(&mut svc);
    assert!(!svc.should_close(c), "output not yet sent");
    assert_eq!(done_of(&events(&mut svc, c), &json!(1))["text"], "bye");
    assert!(svc.should_close(c));
}

#[test]
fn client_that_never_reads_is_dropped() {
    let config = Config { max_output_bytes: 4096, ..Config::default() };
    let mut svc = service(Behaviour::Script(vec![]), 1 << 20, config);
    let c = svc.open();
    send(&mut svc, c, &json!({"id":1,"prompt":"x"}));
    let mut polls = 0;
    while svc.poll() {
        polls += 1;
        assert!(polls < 100_000);
    }
    assert!(svc.should_close(c));
    assert_eq!(svc.engine().finished, 1);
}

#[test]
fn too_many_connections_are_refused_politely() {
    let config = Config { max_connections: 2, ..Config::default() };
    let mut svc = service(Behaviour::Echo, 4096, config);
    let a = svc.open();
    let _b = svc.open();
    let c = svc.open();
    assert_eq!(error_code(&events(&mut svc, c)[0]), "overloaded");
    assert!(svc.should_close(c));
    assert!(!svc.should_close(a));
}

#[test]
fn thinking_marker_ids_are_in_token_ids_only() {
    let mut script = vec![THINK_OPEN];
    script.extend(text_ids("t"));
    script.push(THINK_CLOSE);
    script.extend(text_ids("a"));
    script.push(IM_END);
    let mut svc = service(Behaviour::Script(script.clone()), 4096, Config::default());
    let c = svc.open();
    send(&mut svc, c, &json!({"id":1,"messages":[{"role":"user","content":"q"}],"thinking":"off"}));
    drain(&mut svc);
    let done = done_of(&events(&mut svc, c), &json!(1));
    assert_eq!((done["thinking"].as_str(), done["text"].as_str()), (Some("t"), Some("a")));
    assert_eq!(done["token_ids"], json!(script));
}
