//! Errors of `/v1/messages` in Anthropic's shape,
//! `{"type": "error", "error": {"type", "message"}}`, with the statuses the
//! `anthropic` client maps to its exceptions (400, 401, 404, 413, 500, 503,
//! and 529 `overloaded_error` for a full queue).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::serve::error::ApiError;

/// An [`ApiError`] answered in Anthropic's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's status for `e` (a full queue is 529, as Anthropic's API).
pub fn status(e: &ApiError) -> StatusCode {
    match e.code.as_deref() {
        Some("overloaded") => StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
        _ => e.status,
    }
}

/// Anthropic's error `type` for a status.
pub fn kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The error body (also a stream's `error` event).
pub fn body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": kind(status(e)), "message": e.message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status = status(&self.0);
        let mut response = (status, Json(body(&self.0))).into_response();
        if status.is_server_error() {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kore_protocol::ErrorCode;

    #[test]
    fn errors_take_anthropic_types_and_statuses() {
        let case = |e: ApiError| (status(&e).as_u16(), body(&e)["error"]["type"].clone());
        assert_eq!(
            case(ApiError::bad_param("messages", "x")),
            (400, json!("invalid_request_error"))
        );
        assert_eq!(case(ApiError::unauthorized()), (401, json!("authentication_error")));
        assert_eq!(case(ApiError::unknown_model("a", "b")), (404, json!("not_found_error")));
        let full = ApiError::from_protocol(ErrorCode::Overloaded, "full");
        assert_eq!(case(full), (529, json!("overloaded_error")));
        let internal = ApiError::from_protocol(ErrorCode::Internal, "bug");
        assert_eq!(case(internal), (500, json!("api_error")));
        assert_eq!(case(ApiError::unavailable("gone")), (503, json!("api_error")));
        let b = body(&ApiError::bad_request("why"));
        assert_eq!(
            (b["type"].as_str(), b["error"]["message"].as_str()),
            (Some("error"), Some("why"))
        );
    }
}
