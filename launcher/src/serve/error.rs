//! Errors of the HTTP API, answered in OpenAI's JSON shape with the status
//! an OpenAI client maps to its exception (400 `BadRequestError`, 401
//! `AuthenticationError`, 404 `NotFoundError`, 413, 503 ...).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use kore_protocol::ErrorCode;

use super::wire::{ErrorBody, ErrorDetail};

/// An API error: status plus OpenAI's error fields.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// A stable code.
    pub code: Option<String>,
    /// The parameter at fault.
    pub param: Option<String>,
    /// What went wrong and what to do.
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &str, message: String) -> Self {
        Self { status, kind, code: Some(code.into()), param: None, message }
    }

    /// 400 for a bad value of `param`.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad_request(message);
        e.param = Some(param.into());
        e
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "bad_request", message.into())
    }

    /// 401: no or a wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "missing or wrong API key: send `Authorization: Bearer KEY` with the key given \
             to `kore-launch serve --api-key`"
                .into(),
        )
    }

    /// 404 for a model that is not served.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model `{asked}` is not served here; this server serves `{served}`"),
        );
        e.param = Some("model".into());
        e
    }

    /// 404 for an unknown path.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            format!(
                "no endpoint {path}; see /v1/models, /v1/chat/completions, /v1/completions, \
                 /v1/messages"
            ),
        )
    }

    /// 405 for a known path asked with a method it does not serve.
    pub fn wrong_method(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("{path} does not serve {method}: the /v1 endpoints take POST, the others GET"),
        )
    }

    /// A body that could not be read or parsed, with the status axum chose
    /// (400, 413 past the size limit, 415 ...).
    pub fn body(status: StatusCode, why: String) -> Self {
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            _ => "bad_request",
        };
        Self::new(status, "invalid_request_error", code, why)
    }

    /// 503: the appliance cannot be reached or stopped answering.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "unavailable", message.into())
    }

    /// 500: something the server should never produce (a bug to report).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal", message.into())
    }

    /// The protocol's error `code` with its `message`, mapped to a status:
    /// `prompt_too_long` is 400 `context_length_exceeded` (as OpenAI),
    /// `line_too_long` 413, `overloaded` 503, `internal` 500.
    pub fn from_protocol(code: ErrorCode, message: &str) -> Self {
        let (status, kind, code) = match code {
            ErrorCode::PromptTooLong => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", "context_length_exceeded")
            }
            ErrorCode::LineTooLong => {
                (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "request_too_large")
            }
            ErrorCode::Overloaded => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error", "overloaded")
            }
            ErrorCode::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal"),
            ErrorCode::BadJson
            | ErrorCode::BadRequest
            | ErrorCode::Unsupported
            | ErrorCode::DuplicateId => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", "bad_request")
            }
        };
        Self::new(status, kind, code, message.to_string())
    }

    /// The JSON body.
    pub fn body_json(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind,
                param: self.param.clone(),
                code: self.code.clone(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body_json())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_codes_map_to_openai_statuses() {
        let status = |c: ErrorCode| ApiError::from_protocol(c, "m").status.as_u16();
        assert_eq!(status(ErrorCode::PromptTooLong), 400);
        assert_eq!(status(ErrorCode::BadRequest), 400);
        assert_eq!(status(ErrorCode::LineTooLong), 413);
        assert_eq!(status(ErrorCode::Overloaded), 503);
        assert_eq!(status(ErrorCode::Internal), 500);
        let e = ApiError::from_protocol(ErrorCode::PromptTooLong, "too long");
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
    }

    #[test]
    fn error_body_has_openai_shape() {
        let v = serde_json::to_value(ApiError::unknown_model("gpt-4", "tiny").body_json()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert!(v["error"]["message"].as_str().unwrap().contains("tiny"));
    }
}
