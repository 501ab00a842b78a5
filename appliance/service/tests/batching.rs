//! Batched scheduling with the fake engine: up to the engine's limit of
//! requests from any connections run in the same steps, the rest queue in
//! order; each request's output, finish and stats equal what it gets when
//! requests run one at a time; cancel and disconnect free a slot at once;
//! `info` shows active and queued; `bench` waits until nothing runs.

use kore_service::fake::{Behaviour, FakeCodec, FakeEngine, ManualClock};
use kore_service::{Config, ConnId, Service};
use serde_json::{json, Value};

type Svc = Service<FakeEngine, FakeCodec, ManualClock>;

fn service(max_sequences: usize) -> Svc {
    let mut engine = FakeEngine::new(Behaviour::Echo, 4096);
    engine.max_sequences = max_sequences;
    engine.prefill_steps = 2;
    Service::new(engine, FakeCodec, ManualClock::new(1_000_000), Config::default())
}

fn send(svc: &mut Svc, c: ConnId, v: &Value) {
    svc.on_bytes(c, format!("{v}\n").as_bytes());
}

fn events(svc: &mut Svc, c: ConnId) -> Vec<Value> {
    let out = svc.take_output(c);
    let text = String::from_utf8(out).expect("utf-8");
    text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect()
}

fn drain(svc: &mut Svc) {
    let mut guard = 0;
    while svc.poll() {
        guard += 1;
        assert!(guard < 100_000, "service never went idle");
    }
}

/// Seven requests of different lengths over two connections; returns each
/// done event by id.
fn run_all(max_sequences: usize) -> (Vec<(String, Value)>, usize, u64) {
    let mut svc = service(max_sequences);
    let (a, b) = (svc.open(), svc.open());
    for i in 0..7 {
        let conn = if i % 2 == 0 { a } else { b };
        let prompt = "word ".repeat(i + 1);
        let max = if i == 3 { json!(4) } else { json!(null) };
        send(&mut svc, conn, &json!({"id": format!("r{i}"), "prompt": prompt, "max_tokens": max}));
    }
    drain(&mut svc);
    let mut dones = Vec::new();
    for conn in [a, b] {
        for e in events(&mut svc, conn) {
            if e["done"] == true {
                dones.push((e["id"].as_str().unwrap().to_owned(), e));
            }
        }
    }
    dones.sort_by(|x, y| x.0.cmp(&y.0));
    (dones, svc.engine().peak_batch, svc.engine().steps)
}

#[test]
fn requests_share_steps_and_get_what_they_get_alone() {
    let (alone, peak1, steps1) = run_all(1);
    let (together, peak3, steps3) = run_all(3);
    assert_eq!((peak1, peak3), (1, 3), "batch sizes seen by the engine");
    assert!(steps3 * 2 < steps1, "batched steps {steps3} vs one at a time {steps1}");
    assert_eq!(alone.len(), 7);
    for ((id, x), (_, y)) in alone.iter().zip(&together) {
        assert_eq!(x["token_ids"], y["token_ids"], "{id}");
        assert_eq!(x["text"], y["text"], "{id}");
        assert_eq!(x["finish"], y["finish"], "{id}");
        for k in ["prompt_tokens", "generated_tokens", "context_used"] {
            assert_eq!(x["stats"][k], y["stats"][k], "{id} {k}");
        }
    }
    assert_eq!(together[3].1["finish"], "length");
}

#[test]
fn info_shows_active_and_queued_and_cancel_frees_a_slot() {
    let mut svc = service(2);
    let c = svc.open();
    for i in 0..4 {
        send(&mut svc, c, &json!({"id": i, "prompt": "x".repeat(50)}));
    }
    svc.poll();
    send(&mut svc, c, &json!({"op":"info","id":"i"}));
    let evs = events(&mut svc, c);
    let info = &evs.iter().find(|e| e["id"] == "i").unwrap()["info"];
    assert_eq!(info["scheduling"], "batched");
    assert_eq!((info["active"].clone(), info["queued"].clone()), (json!(2), json!(2)));
    assert_eq!(info["max_active"], 2);
    send(&mut svc, c, &json!({"cancel": 0}));
    assert_eq!((svc.active(), svc.queued()), (1, 2));
    svc.poll();
    assert_eq!((svc.active(), svc.queued()), (2, 1), "the freed slot is taken at the next poll");
    drain(&mut svc);
    let dones: Vec<Value> = events(&mut svc, c).into_iter().filter(|e| e["done"] == true).collect();
    assert_eq!(dones.len(), 4);
    assert_eq!(dones[0]["id"], 0);
    assert_eq!(dones[0]["finish"], "cancelled");
    assert_eq!(svc.engine().finished, 4);
}

#[test]
fn disconnect_finishes_only_that_connections_sequences() {
    let mut svc = service(4);
    let (a, b) = (svc.open(), svc.open());
    send(&mut svc, a, &json!({"id": 1, "prompt": "a".repeat(40)}));
    send(&mut svc, a, &json!({"id": 2, "prompt": "b".repeat(40)}));
    send(&mut svc, b, &json!({"id": 3, "prompt": "c".repeat(5)}));
    svc.poll();
    assert_eq!(svc.active(), 3);
    svc.on_closed(a);
    assert_eq!((svc.active(), svc.engine().finished), (1, 2));
    drain(&mut svc);
    let evs = events(&mut svc, b);
    let done = evs.iter().find(|e| e["done"] == true).expect("b's request completes");
    assert_eq!(done["text"], "ccccc");
}

#[test]
fn bench_waits_until_nothing_runs_and_later_requests_wait_for_it() {
    let mut svc = service(4);
    let c = svc.open();
    send(&mut svc, c, &json!({"id": "g1", "prompt": "abc"}));
    send(&mut svc, c, &json!({"op": "bench", "id": "b"}));
    send(&mut svc, c, &json!({"id": "g2", "prompt": "def"}));
    drain(&mut svc);
    let order: Vec<Value> = events(&mut svc, c)
        .into_iter()
        .filter(|e| e["done"] == true || e.get("bench").is_some())
        .map(|e| e["id"].clone())
        .collect();
    assert_eq!(order, [json!("g1"), json!("b"), json!("g2")]);
    assert_eq!(svc.engine().peak_batch, 1);
}

#[test]
fn session_names_reach_the_engine_and_bad_ones_are_refused() {
    let mut svc = service(2);
    let c = svc.open();
    send(&mut svc, c, &json!({"id": 1, "prompt": "hi", "session": "chat-7", "max_tokens": 2}));
    send(&mut svc, c, &json!({"id": 2, "prompt": "hi", "session": ""}));
    send(&mut svc, c, &json!({"id": 3, "prompt": "hi", "session": 5}));
    send(&mut svc, c, &json!({"id": 4, "prompt": "hi", "session": "x".repeat(257)}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    for id in [2, 3, 4] {
        let e = evs.iter().find(|e| e["id"] == id).unwrap();
        assert_eq!(e["error"]["code"], "bad_request", "{e}");
    }
    let done = evs.iter().find(|e| e["id"] == 1 && e["done"] == true).unwrap();
    assert_eq!(done["stats"]["cached_tokens"], 0);
    assert_eq!(svc.engine().started.len(), 1);
    assert_eq!(svc.engine().started[0].1.session.as_deref(), Some("chat-7"));
}

#[test]
fn bench_concurrency_is_parsed_and_reported() {
    let mut svc = service(1);
    let c = svc.open();
    send(&mut svc, c, &json!({"op": "bench", "id": "b", "concurrency": 4}));
    send(&mut svc, c, &json!({"op": "bench", "id": "z", "concurrency": 0}));
    drain(&mut svc);
    let evs = events(&mut svc, c);
    let b = evs.iter().find(|e| e["id"] == "b").unwrap();
    assert_eq!(b["bench"]["concurrency"], 4, "{b}");
    assert!(b["bench"].get("aggregate_decode_tok_per_s").is_some());
    let z = evs.iter().find(|e| e["id"] == "z").unwrap();
    assert_eq!(z["error"]["code"], "bad_request", "{z}");
}
