//! The fuzz bodies of `kore-launch serve`: [`anthropic_body`] (an Anthropic Messages body
//! through its parse and mapping) and [`http_api`], below.
//!
//! The fuzz body for the HTTP API of `kore-launch serve`: arbitrary bytes become one HTTP
//! request, sent through the server's whole router (Bearer check, body limit, JSON parsing,
//! the OpenAI -> protocol mapping, the relay and SSE streaming) to a kore-service over the
//! fake engine (`kore_service::fake`), on a server without a key and on one with a key.
//! Used by the `http_api` cargo-fuzz target (`fuzz/`) and by a plain test over its seeds.
//!
//! The input reads like an HTTP/1 request, leniently: `METHOD PATH` on the first line,
//! `Name: value` lines, an empty line, then the body (any bytes). Requests that the `http`
//! crate cannot even represent (a bad method, path or header) are hyper's to refuse and are
//! skipped. Whatever the request, the server must answer within [`ANSWER_WAIT`], never
//! with a 500, and every error (4xx/5xx) must be an OpenAI error body; a stream ends with
//! `data: [DONE]` or an error event. `KORE_FUZZ_TRACE=1` prints every answer (status, content
//! type, body) to stderr, for reproducing a case.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use kore_service::fake::{Behaviour, FakeCodec, FakeEngine};
use kore_service::host::{ServiceHandle, StdClock};
use kore_service::{Config, Service};
use serde_json::Value;
use tower::ServiceExt;

use crate::appliance::Appliance;
use crate::serve::{router, AppState};

/// Longest wait for a whole answer (head and body).
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// The key of the keyed server (seeds send `Authorization: Bearer fuzz-key`).
const KEY: &str = "fuzz-key";
/// Largest answer body read.
const ANSWER_MAX: usize = 64 << 20;

struct Harness {
    /// `KORE_FUZZ_TRACE` is set.
    trace: bool,
    runtime: tokio::runtime::Runtime,
    open: Router,
    keyed: Router,
}

/// One server state over its own fake-engine service thread.
fn server(api_key: Option<&str>) -> Router {
    let service = ServiceHandle::spawn_with(|runner| {
        let mut engine = FakeEngine::new(Behaviour::Echo, 4096);
        engine.max_sequences = 4;
        runner.run(Service::new(engine, FakeCodec, StdClock::new(), Config::default()));
    })
    .expect("the fake service thread starts");
    let state = AppState::new(Appliance::in_process(service), api_key.map(str::to_owned))
        .expect("the fake service answers info");
    router(Arc::new(state))
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| Harness {
        trace: crate::env::get("KORE_FUZZ_TRACE").is_some(),
        runtime: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime"),
        open: server(None),
        keyed: server(Some(KEY)),
    })
}

/// One `POST /v1/messages` body through its parse and mapping: it never panics, and a body
/// that maps gives a protocol request that passes the protocol's own checks and survives its
/// JSON line (so the tool list built from the body is valid JSON).
pub fn anthropic_body(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<crate::serve::MessagesRequest>(data) else { return };
    let Ok(request) = crate::serve::anthropic_request(&body, 7) else { return };
    if let Err(e) = request.validate() {
        panic!("a mapped request the protocol refuses ({e}): {request:?}");
    }
    let line = serde_json::to_string(&request).expect("a mapped request serializes");
    let back: kore_protocol::GenerateRequest =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(back, request, "{line}");
}

/// Runs one case (see the module docs); panics when the server breaks a rule.
pub fn http_api(data: &[u8]) {
    let h = harness();
    for app in [&h.open, &h.keyed] {
        let Some(request) = parse(data) else { return };
        let answer = h.runtime.block_on(async {
            tokio::time::timeout(ANSWER_WAIT, async {
                let response = app.clone().oneshot(request).await.expect("infallible");
                let (head, body) = response.into_parts();
                let body = axum::body::to_bytes(body, ANSWER_MAX).await;
                (head, body)
            })
            .await
        });
        let (head, body) = answer.unwrap_or_else(|_| {
            panic!("no whole answer within {ANSWER_WAIT:?} to {:?}", String::from_utf8_lossy(data))
        });
        let body = body.expect("the answer body can be read");
        let content_type =
            head.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if h.trace {
            eprintln!("{} {content_type} {}", head.status, String::from_utf8_lossy(&body));
        }
        check(head.status, content_type, &body);
    }
}

/// The request `data` describes, if the `http` crate can represent it.
fn parse(data: &[u8]) -> Option<Request<Body>> {
    let split = data.windows(2).position(|w| w == b"\n\n");
    let (head, body) = match split {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &data[data.len()..]),
    };
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.lines();
    let (method, path) = lines.next()?.trim_end_matches('\r').split_once(' ')?;
    let mut builder =
        Request::builder().method(Method::from_bytes(method.as_bytes()).ok()?).uri(path);
    for line in lines {
        let (name, value) = line.trim_end_matches('\r').split_once(':')?;
        builder = builder.header(name, value.trim_start());
    }
    builder.body(Body::from(body.to_vec())).ok()
}

/// The rules every answer keeps.
fn check(status: StatusCode, content_type: &str, body: &[u8]) {
    let text = String::from_utf8_lossy(body);
    assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "500: {text}");
    if status.is_client_error() || status.is_server_error() {
        let error: Value = serde_json::from_slice(body)
            .unwrap_or_else(|e| panic!("{status} with a body that is not JSON ({e}): {text}"));
        assert!(error["error"]["message"].is_string(), "{status} not in OpenAI's shape: {text}");
        return;
    }
    if content_type.starts_with("text/event-stream") {
        let last = text.lines().rev().find_map(|l| l.strip_prefix("data: "));
        // OpenAI's streams end with [DONE] or an error; Anthropic's with message_stop or error.
        let ended = last == Some("[DONE]")
            || last
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .is_some_and(|v| v["error"].is_object() || v["type"] == "message_stop");
        assert!(ended, "a stream that ends without [DONE] or an error: {text}");
    } else if content_type.starts_with("application/json") {
        serde_json::from_slice::<Value>(body)
            .unwrap_or_else(|e| panic!("{status} JSON answer that does not parse ({e}): {text}"));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The committed seeds of the `http_api` target, each through the fuzz body.
    #[test]
    fn fuzz_body_keeps_its_rules_on_the_seeds() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/http_api");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("seed directory") {
            super::http_api(&std::fs::read(entry.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n >= 8, "only {n} seeds in {}", dir.display());
    }

    /// The committed seeds of the `anthropic_body` target, whole and truncated.
    #[test]
    fn anthropic_fuzz_body_keeps_its_rules_on_the_seeds() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/anthropic_body");
        let (mut n, mut mapped) = (0, 0);
        for entry in std::fs::read_dir(&dir).expect("seed directory") {
            let seed = std::fs::read(entry.unwrap().path()).unwrap();
            for cut in (0..=seed.len()).rev().step_by(7) {
                super::anthropic_body(&seed[..cut]);
            }
            let body: crate::serve::MessagesRequest = serde_json::from_slice(&seed).unwrap();
            mapped += usize::from(crate::serve::anthropic_request(&body, 7).is_ok());
            n += 1;
        }
        // The seeds reach the mapping's end, not only its refusals.
        assert!(n >= 4 && mapped >= 3, "{mapped} of {n} seeds map ({})", dir.display());
    }

    /// Mangled seeds: truncated at every byte of one request, and with bytes flipped.
    #[test]
    fn fuzz_body_survives_mangled_requests() {
        let seed = b"POST /v1/chat/completions\ncontent-type: application/json\n\n\
            {\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}";
        for cut in (0..seed.len()).step_by(3) {
            super::http_api(&seed[..cut]);
        }
        let mut x = 0x9e37_79b9_u32;
        for _ in 0..200 {
            let mut case = seed.to_vec();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let i = x as usize % case.len();
                case[i] = (x >> 8) as u8;
            }
            super::http_api(&case);
        }
    }
}
