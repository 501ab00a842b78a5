//! `/v1/messages` end to end on the in-process appliance over the tiny test
//! model (`model-packs/tiny-hf`): whole and streamed answers agree, refusals
//! and the key check answer in Anthropic's shape, `/metrics` counts the path.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::appliance::Appliance;
use crate::serve::{router, AppState};

fn app(key: Option<&str>) -> Router {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf");
    let appliance = Appliance::native(&model).expect("native appliance");
    router(Arc::new(AppState::new(appliance, key.map(str::to_owned)).expect("state")))
}

fn post(body: &Value, key: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/v1/messages").header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("x-api-key", k);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

async fn call(app: &Router, req: Request<Body>) -> (StatusCode, String) {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 24).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The `(event, data)` pairs of an SSE body.
fn events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_owned();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((std::mem::take(&mut name), serde_json::from_str(d).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_whole_messages_agree() {
    let app = app(None);
    let body = json!({"model": "tiny-hf", "max_tokens": 12, "temperature": 0,
                      "system": "Be brief.", "messages": [{"role": "user", "content": "Hello"}]});
    let (status, text) = call(&app, post(&body, None)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let whole: Value = serde_json::from_str(&text).unwrap();
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    assert_eq!(
        (whole["type"].as_str(), whole["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(whole["content"][0]["type"], "text");
    assert!(["end_turn", "max_tokens"].contains(&whole["stop_reason"].as_str().unwrap()));
    assert!(whole["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, sse) = call(&app, post(&streamed, None)).await;
    assert_eq!(status, StatusCode::OK, "{sse}");
    let ev = events(&sse);
    assert_eq!(ev.first().map(|e| e.0.as_str()), Some("message_start"));
    assert_eq!(ev.last().map(|e| e.0.as_str()), Some("message_stop"));
    let text: String = ev
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, whole["content"][0]["text"].as_str().unwrap());
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    let (_, metrics) = call(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let line = "kore_http_requests_total{path=\"/v1/messages\",status=\"200\"} 2";
    assert!(metrics.contains(line), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_keys_answer_in_anthropics_shape() {
    let app = app(Some("sekrit"));
    let ok = json!({"model": "tiny-hf", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]});
    let cases = [
        (post(&ok, None), 401, "authentication_error"),
        (post(&ok, Some("wrong")), 401, "authentication_error"),
        (
            post(
                &json!({"model": "tiny-hf", "max_tokens": 2, "messages": [{"role": "user",
                    "content": [{"type": "image", "source": {"type": "base64",
                    "media_type": "image/png", "data": "AA=="}}]}]}),
                Some("sekrit"),
            ),
            400,
            "invalid_request_error",
        ),
        (
            post(&json!({"model": "claude-x", "max_tokens": 2, "messages": []}), Some("sekrit")),
            404,
            "not_found_error",
        ),
        (
            Request::post("/v1/messages")
                .header("x-api-key", "sekrit")
                .body(Body::from("{oops"))
                .unwrap(),
            400,
            "invalid_request_error",
        ),
        (
            Request::post("/v1/messages")
                .header("x-api-key", "sekrit")
                .body(Body::from(vec![b' '; 5 << 20]))
                .unwrap(),
            413,
            "request_too_large",
        ),
        (
            Request::post("/v1/messages/count_tokens")
                .header("x-api-key", "sekrit")
                .body(Body::from(ok.to_string()))
                .unwrap(),
            404,
            "not_found_error",
        ),
        (Request::get("/v1/messages").body(Body::empty()).unwrap(), 405, "invalid_request_error"),
    ];
    for (req, status, kind) in cases {
        let (got, text) = call(&app, req).await;
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!((got.as_u16(), body["type"].as_str()), (status, Some("error")), "{body}");
        assert_eq!(body["error"]["type"], kind, "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let bearer = Request::post("/v1/messages")
        .header("authorization", "Bearer sekrit")
        .body(Body::from(ok.to_string()))
        .unwrap();
    assert_eq!(call(&app, bearer).await.0, StatusCode::OK);
    assert_eq!(call(&app, post(&ok, Some("sekrit"))).await.0, StatusCode::OK);
}
