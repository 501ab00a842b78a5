//! The HTTP handlers and middleware: the OpenAI endpoints, `/health`,
//! `/metrics`, the Bearer check and the request counter.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kore_protocol::{GenerateRequest, InfoBody};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::error::ApiError;
use super::mapping::{self, Envelope};
use super::relay::{Relay, Update};
use super::stream::{self, Kind};
use super::wire::{ChatRequest, CompletionRequest, ModelCard, ModelList, Options, Ordered};
use super::AppState;
use crate::client::Done;

/// How long a streamed request waits for its first event before the
/// response starts (the appliance refuses bad requests before any work, so
/// refusals come within this and get their HTTP status).
pub(super) const FIRST_EVENT_WAIT: Duration = Duration::from_millis(400);
/// How long `/health` and `/metrics` wait for the appliance's `info`.
const INFO_WAIT: Duration = Duration::from_secs(3);

type Shared = State<Arc<AppState>>;

/// A request body whose rejections (too large, unreadable) are OpenAI error
/// bodies; handlers read it as JSON themselves (twice: typed, and the
/// order-sensitive fields as written).
#[derive(Debug)]
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(ApiBody)
            .map_err(|r| ApiError::body(r.status(), r.body_text()))
    }
}

/// `GET /v1/models`.
pub async fn models(State(s): Shared) -> Json<ModelList> {
    let card = ModelCard {
        id: s.model.clone(),
        object: "model",
        created: s.created,
        owned_by: "kore",
        max_model_len: s.context_limit,
    };
    Json(ModelList { object: "list", data: vec![card] })
}

/// The body read twice: typed, and its order-sensitive fields as written.
fn ordered(body: &Bytes) -> Result<Ordered, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_param("response_format", format!("`tools` or `response_format`: {e}"))
    })
}

fn typed<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not a valid request: {e}")))
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): Shared, ApiBody(body): ApiBody) -> Result<Response, ApiError> {
    let req: ChatRequest = typed(&body)?;
    mapping::check_model(&req.model, &s.model)?;
    let protocol = mapping::chat_request(&req, &ordered(&body)?, random_seed())?;
    let env = envelope(&s, "chatcmpl");
    run(s, protocol, env, Kind::Chat, &req.options).await
}

/// `POST /v1/completions`.
pub async fn completions(State(s): Shared, ApiBody(body): ApiBody) -> Result<Response, ApiError> {
    let req: CompletionRequest = typed(&body)?;
    mapping::check_model(&req.model, &s.model)?;
    let protocol = mapping::completion_request(&req, &ordered(&body)?, random_seed())?;
    let env = envelope(&s, "cmpl");
    run(s, protocol, env, Kind::Completion, &req.options).await
}

/// Relays one generation and answers it whole or as a stream.
async fn run(
    s: Arc<AppState>,
    protocol: GenerateRequest,
    env: Envelope,
    kind: Kind,
    options: &Options,
) -> Result<Response, ApiError> {
    let in_flight = s.metrics.start();
    let mut relay = start_relay(&s, protocol).await?;
    if options.stream != Some(true) {
        let done = collect(&mut relay).await?;
        return Ok(match kind {
            Kind::Chat => Json(mapping::chat_answer(&env, &done)).into_response(),
            Kind::Completion => Json(mapping::completion_answer(&env, &done)).into_response(),
        });
    }
    let first = relay.first_within(FIRST_EVENT_WAIT).await;
    if let Some(Update::Failed(e)) = first {
        return Err(e);
    }
    let include_usage = options.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let plan = stream::Plan { env, kind, include_usage };
    Ok(stream::sse(relay, first, plan, in_flight).into_response())
}

/// Sends `protocol` to the appliance on a connection of its own (opened
/// off the async threads: a busy guest may accept it late).
pub(super) async fn start_relay(
    s: &Arc<AppState>,
    protocol: GenerateRequest,
) -> Result<Relay, ApiError> {
    let state = s.clone();
    tokio::task::spawn_blocking(move || {
        Relay::start(&state.appliance, protocol, state.metrics.clone())
    })
    .await
    .map_err(|e| ApiError::unavailable(format!("relay task failed: {e}")))?
}

/// Waits for the generation's end.
pub(super) async fn collect(relay: &mut Relay) -> Result<Done, ApiError> {
    loop {
        match relay.next().await {
            Some(Update::Delta(_)) => {}
            Some(Update::Done(d)) => return Ok(d),
            Some(Update::Failed(e)) => return Err(e),
            None => return Err(ApiError::unavailable("the relay ended without an answer")),
        }
    }
}

fn envelope(s: &AppState, prefix: &str) -> Envelope {
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    Envelope {
        id: format!("{prefix}-{:x}{n:x}", s.created),
        created: super::unix_now(),
        model: s.model.clone(),
    }
}

/// A seed for sampled requests that give none: different per request.
pub(super) fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id())
}

/// The appliance's `info`, or `None` when it does not answer in time.
async fn info(s: &Arc<AppState>) -> Option<InfoBody> {
    let state = s.clone();
    let ask = tokio::task::spawn_blocking(move || {
        let appliance = state.appliance.lock().unwrap_or_else(|p| p.into_inner());
        let client = appliance.client();
        drop(appliance);
        client.ok().and_then(|mut c| c.info().ok())
    });
    tokio::time::timeout(INFO_WAIT, ask).await.ok()?.ok()?
}

/// `GET /health`: 200 with the model, where it runs and its queue when the
/// appliance answers, else 503.
pub async fn health(State(s): Shared) -> Response {
    match info(&s).await {
        Some(i) => Json(json!({
            "status": "ok",
            "model": s.model,
            "placement": s.placement,
            "queued": i.queued,
            "busy": i.busy,
        }))
        .into_response(),
        None => ApiError::unavailable("the appliance does not answer").into_response(),
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(s): Shared) -> Response {
    let info = info(&s).await;
    let text = s.metrics.render(info.as_ref());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// Requires `Authorization: Bearer KEY` when the server has a key.
pub async fn auth(State(s): Shared, req: Request, next: Next) -> Response {
    if !key_accepted(&s, req.headers(), None) {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

/// Whether the request may pass: the server has no key, or it came as
/// `Authorization: Bearer KEY` (or in the `also` header, e.g. `x-api-key`).
pub(super) fn key_accepted(s: &AppState, headers: &HeaderMap, also: Option<&str>) -> bool {
    let Some(key) = &s.api_key else { return true };
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let bearer = text(header::AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer "));
    let other = also.and_then(text);
    [bearer, other].into_iter().flatten().any(|g| same_key(g.trim(), key))
}

/// Compares keys in time independent of where they differ.
pub(super) fn same_key(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every answer by path (known paths only, others as `other`) and status.
pub async fn count(State(s): Shared, req: Request, next: Next) -> Response {
    const KNOWN: [&str; 9] = [
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/health",
        "/metrics",
        "/",
        "/chat.js",
        "/chat.css",
    ];
    let path = req.uri().path();
    let label = KNOWN.iter().find(|k| **k == path).copied().unwrap_or("other");
    let response = next.run(req).await;
    let status: StatusCode = response.status();
    s.metrics.record_http(label, status.as_u16());
    response
}
