//! The web chat at `/`: static HTML, JavaScript and CSS embedded in the
//! binary (no build step, nothing fetched from elsewhere). The page talks to
//! this server's `/v1/chat/completions` with streaming.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("web/index.html");
const SCRIPT: &str = include_str!("web/chat.js");
const STYLE: &str = include_str!("web/chat.css");

/// `GET /`.
pub async fn index() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX)
}

/// `GET /chat.js`.
pub async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT)
}

/// `GET /chat.css`.
pub async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}
