//! Tool calls, structured-output constraints and log-probabilities through
//! the service, with the fake engine playing a scripted answer: the calls
//! leave the answer text, stream as `tool_call` pieces that concatenate to
//! the `done` event's calls, and bad constraints are refused by name.

use kore_service::fake::{fake_logprobs, Behaviour, FakeCodec, FakeEngine, ManualClock, IM_END};
use kore_service::{Config, Service};
use serde_json::{json, Value};

type Svc = Service<FakeEngine, FakeCodec, ManualClock>;

fn run(script: &str, request: Value) -> (Svc, Vec<Value>) {
    let mut ids = FakeCodec::text_ids(script);
    ids.push(IM_END);
    let engine = FakeEngine::new(Behaviour::Script(ids), 4096);
    let mut svc = Service::new(engine, FakeCodec, ManualClock::new(1000), Config::default());
    let c = svc.open();
    let mut line = serde_json::to_vec(&request).unwrap();
    line.push(b'\n');
    svc.on_bytes(c, &line);
    while svc.poll() {}
    let out = svc.take_output(c);
    let evs = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    (svc, evs)
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}])
}

fn chat(extra: Value) -> Value {
    let mut r = json!({"id": 1, "messages": [{"role": "user", "content": "weather?"}],
                       "thinking": false});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

const CALL: &str = "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n\
                    Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

#[test]
fn calls_leave_the_text_and_stream_in_pieces_that_add_up() {
    let (svc, evs) = run(CALL, chat(json!({"tools": tools(), "tool_choice": "auto"})));
    let done = evs.last().unwrap();
    assert_eq!(done["done"], true, "{evs:?}");
    assert_eq!(done["text"], "Let me look.\n");
    let calls = done["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["name"], "get_weather");
    assert_eq!(calls[0]["arguments"], r#"{"city":"Paris","days":3}"#);
    let mut args = String::new();
    let mut first = None;
    for e in evs.iter().filter_map(|e| e.get("tool_call")) {
        if first.is_none() {
            first = Some(e.clone());
        }
        assert_eq!(e["index"], 0);
        args.push_str(e["arguments"].as_str().unwrap_or(""));
    }
    let first = first.expect("tool_call deltas");
    assert_eq!((&first["id"], &first["name"]), (&calls[0]["id"], &calls[0]["name"]));
    assert_eq!(args, calls[0]["arguments"].as_str().unwrap());
    let text: String = evs.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert_eq!(text, "Let me look.\n");
    // The engine got a tool grammar; the prompt carries the tools.
    let params = &svc.engine().started[0].1;
    assert!(params.constraint.as_ref().unwrap().tool_set().is_some());
}

#[test]
fn tool_choice_none_leaves_text_alone_and_formats_constrain() {
    let (svc, evs) = run(CALL, chat(json!({"tools": tools(), "tool_choice": "none"})));
    let done = evs.last().unwrap();
    assert_eq!(done["text"], CALL);
    assert!(done.get("tool_calls").is_none());
    assert!(svc.engine().started[0].1.constraint.is_none());
    let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}});
    let (svc, evs) = run("{\"a\":1}", chat(json!({"response_format": schema})));
    assert_eq!(evs.last().unwrap()["text"], "{\"a\":1}");
    assert!(svc.engine().started[0].1.constraint.is_some());
}

#[test]
fn bad_constraints_are_refused_naming_the_problem() {
    for (extra, needle) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "string", "pattern": "a+"}}}}),
            "pattern",
        ),
        (json!({"response_format": {"type": "yaml"}}), "yaml"),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function",
            "function": {"name": "nope"}}}),
            "nope",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "function"),
        (json!({"logprobs": 21}), "logprobs"),
    ] {
        let (svc, evs) = run("x", chat(extra.clone()));
        let e = &evs[0]["error"];
        assert_eq!(e["code"], "bad_request", "{extra}: {evs:?}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{extra}: {e}");
        assert!(svc.engine().started.is_empty());
    }
}

#[test]
fn logprobs_come_with_done_one_per_token() {
    let (_, evs) = run("ab", chat(json!({"logprobs": 2})));
    let done = evs.last().unwrap();
    let lp = done["logprobs"].as_array().unwrap();
    let ids: Vec<u64> =
        done["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(lp.len(), ids.len());
    for (l, &id) in lp.iter().zip(&ids) {
        let want = fake_logprobs(id as u32, 2);
        assert_eq!(l["id"], id);
        assert!((l["logprob"].as_f64().unwrap() - f64::from(want.logprob)).abs() < 1e-6);
        assert_eq!(l["top"].as_array().unwrap().len(), 2);
    }
    assert_eq!(lp[0]["token"], "a");
    assert_eq!(lp[0]["bytes"], json!([97]));
    let (_, evs) = run("ab", chat(json!({})));
    assert!(evs.last().unwrap().get("logprobs").is_none());
}

/// The `logprobs` of the delta events, joined (ids).
fn streamed_logprob_ids(evs: &[Value]) -> Vec<u64> {
    evs.iter()
        .filter(|e| e.get("delta").is_some())
        .filter_map(|e| e.get("logprobs"))
        .flat_map(|l| l.as_array().unwrap().iter().map(|t| t["id"].as_u64().unwrap()))
        .collect()
}

#[test]
fn deltas_carry_their_tokens_logprobs_as_they_stream() {
    for (script, extra) in [
        ("hello there", json!({"logprobs": 1})),
        (CALL, json!({"logprobs": 0, "tools": tools(), "tool_choice": "auto"})),
    ] {
        let (_, evs) = run(script, chat(extra));
        let done = evs.last().unwrap();
        let all: Vec<u64> = done["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect();
        let streamed = streamed_logprob_ids(&evs);
        assert!(!streamed.is_empty(), "{evs:?}");
        assert_eq!(streamed[..], all[..streamed.len()], "a prefix of done's, in order");
        // Plain text holds nothing back: each delta carries exactly its own tokens.
        if script == "hello there" {
            for e in evs.iter().filter(|e| e.get("delta").is_some()) {
                let tokens: String = e["logprobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["token"].as_str().unwrap())
                    .collect();
                assert_eq!(tokens, e["delta"].as_str().unwrap());
            }
        }
    }
    let (_, evs) = run("hello there", chat(json!({})));
    assert!(streamed_logprob_ids(&evs).is_empty());
}
