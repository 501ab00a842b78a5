//! Answers for unknown paths and for known paths asked with another method, in the shape
//! of the API the path belongs to: Anthropic's below `/v1/messages`, OpenAI's elsewhere.

use axum::http::Uri;
use axum::response::{IntoResponse, Response};

use super::anthropic::AnthropicError;
use super::error::ApiError;

/// Unknown paths: 404 in OpenAI's shape (Anthropic's below `/v1/messages`).
pub async fn fallback(uri: Uri) -> Response {
    in_shape_of(uri.path(), ApiError::no_route(uri.path()))
}

/// Known paths asked with another method: 405 in OpenAI's shape (axum's own has no body;
/// Anthropic's below `/v1/messages`).
pub async fn wrong_method(method: axum::http::Method, uri: Uri) -> Response {
    in_shape_of(uri.path(), ApiError::wrong_method(method.as_str(), uri.path()))
}

/// `e` in the shape of the API `path` belongs to.
fn in_shape_of(path: &str, e: ApiError) -> Response {
    match path.starts_with("/v1/messages") {
        true => AnthropicError(e).into_response(),
        false => e.into_response(),
    }
}
