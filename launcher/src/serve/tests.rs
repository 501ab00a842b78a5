//! The server end to end on the in-process appliance over the tiny test
//! model (`model-packs/tiny-hf`): routes, streaming, errors, auth, cancel.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{router, AppState};
use crate::appliance::Appliance;

fn state(key: Option<&str>) -> Arc<AppState> {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf");
    let appliance = Appliance::native(&model).expect("native appliance");
    Arc::new(AppState::new(appliance, key.map(str::to_owned)).expect("state"))
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, String) {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 24).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn call_json(app: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let (status, text) = call(app, req).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streamed_and_not_agree_with_the_protocol() {
    let s = state(None);
    let app = router(s.clone());
    let (status, models) =
        call_json(&app, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][0]["id"], "tiny-hf");
    assert_eq!(models["data"][0]["max_model_len"], 4096);
    let body = json!({"model": "tiny-hf", "prompt": "ROMEO:", "max_tokens": 12, "temperature": 0});
    let (status, whole) = call_json(&app, post("/v1/completions", body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 12);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    // The same request straight through the protocol client.
    let direct = {
        let a = s.appliance.lock().unwrap();
        let mut c = a.client().unwrap();
        let mut req = kore_protocol::GenerateRequest::completion("ROMEO:");
        req.max_tokens = Some(12);
        c.generate(req, |_| {}).unwrap()
    };
    assert_eq!(whole["choices"][0]["text"], direct.text.as_ref());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, text) = call(&app, post("/v1/completions", streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let joined: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(joined, direct.text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 12, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_role_then_text_and_answers_whole() {
    let app = router(state(None));
    let body = json!({"model": "tiny-hf", "max_tokens": 8, "stream": true,
                      "messages": [{"role": "user", "content": "Hello"}],
                      "chat_template_kwargs": {"enable_thinking": false}});
    let (status, text) = call(&app, post("/v1/chat/completions", body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let data = sse_data(&text);
    let first: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(last["choices"][0]["finish_reason"].is_string(), "{last}");
    assert!(last["kore_stats"]["context_limit"].is_u64(), "{last}");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    let mut whole = body;
    whole["stream"] = json!(false);
    let (status, answer) = call_json(&app, post("/v1/chat/completions", whole)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], streamed.as_str());
    assert!(answer["choices"][0]["message"].get("reasoning_content").is_none(), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let app = router(state(None));
    let user = json!([{"role": "user", "content": "x"}]);
    let cases = [
        (
            post("/v1/chat/completions", json!({"model": "gpt-4o", "messages": user})),
            404,
            "model_not_found",
        ),
        (post("/v1/chat/completions", json!({"model": "tiny-hf"})), 400, "bad_request"),
        (
            post("/v1/chat/completions", json!({"model": "tiny-hf", "messages": user, "top_p": 7})),
            400,
            "bad_request",
        ),
        (
            post("/v1/completions", json!({"model": "tiny-hf", "prompt": "ab ".repeat(5000)})),
            400,
            "context_length_exceeded",
        ),
        (Request::post("/v1/completions").body(Body::from("{oops")).unwrap(), 400, "bad_request"),
        (
            Request::post("/v1/completions").body(Body::from(vec![b' '; 5 << 20])).unwrap(),
            413,
            "request_too_large",
        ),
        (Request::get("/v2/nothing").body(Body::empty()).unwrap(), 404, "unknown_url"),
    ];
    for (req, status, code) in cases {
        let (got, body) = call_json(&app, req).await;
        assert_eq!((got.as_u16(), body["error"]["code"].as_str()), (status, Some(code)), "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // A streamed request refused by the appliance also gets its status, not a stream.
    let bad = json!({"model": "tiny-hf", "messages": user, "temperature": -1, "stream": true});
    assert_eq!(call_json(&app, post("/v1/chat/completions", bad)).await.0, StatusCode::BAD_REQUEST);
    let ok = json!({"model": "tiny-hf", "prompt": "x", "max_tokens": 2});
    assert_eq!(call_json(&app, post("/v1/completions", ok)).await.0, StatusCode::OK);
    let (status, health) =
        call_json(&app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!((status, health["status"].as_str()), (StatusCode::OK, Some("ok")));
    assert_eq!(health["placement"], "native");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set_and_the_page_is_served() {
    let app = router(state(Some("sekrit")));
    let get = |path: &str, key: Option<&str>| {
        let mut b = Request::get(path);
        if let Some(k) = key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        b.body(Body::empty()).unwrap()
    };
    assert_eq!(call(&app, get("/v1/models", None)).await.0, StatusCode::UNAUTHORIZED);
    let (status, body) = call_json(&app, get("/v1/models", Some("wrong"))).await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("authentication_error"))
    );
    assert_eq!(call(&app, get("/v1/models", Some("sekrit"))).await.0, StatusCode::OK);
    assert_eq!(call(&app, get("/metrics", None)).await.0, StatusCode::UNAUTHORIZED);
    let (status, page) = call(&app, get("/", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("/chat.js") && page.contains("id=\"stop\""));
    assert!(call(&app, get("/chat.js", None)).await.1.contains("/v1/chat/completions"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_cancels_its_generation() {
    let s = state(None);
    let app = router(s.clone());
    let body = json!({"model": "tiny-hf", "prompt": "JULIET:", "max_tokens": 4000, "stream": true});
    let res = app.clone().oneshot(post("/v1/completions", body)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.into_body().into_data_stream();
    let first = stream.next().await.expect("a chunk").unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.metrics.finished("cancelled") == 0 {
        assert!(Instant::now() < deadline, "the generation was not cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, metrics) = call(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(metrics.contains("kore_generations_total{finish=\"cancelled\"} 1"), "{metrics}");
    assert!(metrics.contains("kore_requests_in_flight 0"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_overloaded() {
    let app = router(state(None));
    // The service's 64 waiting (plus up to 8 running, batched, if the scheduler took some
    // before the rest arrived: on a loaded machine it may not have) fill it; the rest are refused.
    let body = json!({"model": "tiny-hf", "prompt": "JULIET:", "max_tokens": 4000, "stream": true});
    let calls = (0..90).map(|_| app.clone().oneshot(post("/v1/completions", body.clone())));
    let responses = futures_util::future::join_all(calls).await;
    let (refused, held): (Vec<_>, Vec<_>) = responses
        .into_iter()
        .map(Result::unwrap)
        .partition(|r| r.status() == StatusCode::SERVICE_UNAVAILABLE);
    assert!(held.iter().all(|r| r.status() == StatusCode::OK));
    assert!(
        held.len() >= 64 && !refused.is_empty(),
        "{} held, {} refused",
        held.len(),
        refused.len()
    );
    let res = refused.into_iter().next().unwrap();
    assert_eq!(res.headers()["retry-after"], "1");
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
}
