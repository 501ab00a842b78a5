//! Anthropic's Messages API on `serve`: `POST /v1/messages`, whole or
//! streamed, with `x-api-key` (or `Authorization: Bearer`) when the server
//! has a key and errors in Anthropic's shape.
//!
//! A body is mapped onto the protocol request the OpenAI chat path builds
//! ([`request`]), so the chat template, tool grammar and checks are shared;
//! the `done` event becomes a message ([`answer`]) or Anthropic's event
//! sequence ([`stream`]). Wire types are in [`wire`], errors in [`error`].

mod answer;
mod error;
#[cfg(test)]
mod http_tests;
mod request;
mod stream;
#[cfg(test)]
mod tests;
mod wire;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use self::answer::Naming;
use super::error::ApiError;
use super::handlers::{collect, key_accepted, random_seed, start_relay, ApiBody, FIRST_EVENT_WAIT};
use super::mapping::check_model;
use super::relay::Update;
use super::AppState;

pub use self::error::AnthropicError;
pub use self::request::request as protocol_request;
pub use self::wire::MessagesRequest;

/// `POST /v1/messages`.
pub async fn messages(
    State(s): State<Arc<AppState>>,
    body: Result<ApiBody, ApiError>,
) -> Result<Response, AnthropicError> {
    let ApiBody(body) = body?;
    let req: MessagesRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("the body is not a valid Messages request: {e}"))
    })?;
    check_model(&req.model, &s.model)?;
    let protocol = request::request(&req, random_seed())?;
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let naming = Naming {
        id: format!("msg_{:x}{n:x}", s.created),
        model: s.model.clone(),
        max_tokens: protocol.max_tokens.unwrap_or(u32::MAX),
    };
    let in_flight = s.metrics.start();
    let mut relay = start_relay(&s, protocol).await?;
    if req.stream != Some(true) {
        let done = collect(&mut relay).await?;
        return Ok(Json(answer::answer(&naming, &done)?).into_response());
    }
    let first = relay.first_within(FIRST_EVENT_WAIT).await;
    if let Some(Update::Failed(e)) = first {
        return Err(e.into());
    }
    Ok(stream::sse(relay, first, naming, in_flight).into_response())
}

/// Requires the server's key, as `x-api-key` or `Authorization: Bearer`,
/// when it has one; refusals are Anthropic's 401.
pub async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !key_accepted(&s, req.headers(), Some("x-api-key")) {
        let mut e = ApiError::unauthorized();
        e.message = "missing or wrong API key: send `x-api-key: KEY` (or `Authorization: \
                     Bearer KEY`) with the key given to `kore-launch serve --api-key`"
            .into();
        return AnthropicError(e).into_response();
    }
    next.run(req).await
}
