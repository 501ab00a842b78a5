//! `kore-launch serve`: an OpenAI-compatible HTTP server (axum on tokio) in
//! front of the appliance, with Anthropic's Messages API at `/v1/messages`
//! ([`anthropic`]) and a web chat at `/`.
//!
//! Each generation gets its own protocol connection ([`relay`]), so
//! concurrent HTTP requests reach the appliance's scheduler concurrently; a
//! client that disconnects has its request cancelled. OpenAI's wire types
//! are in [`wire`], the mapping to and from the protocol in [`mapping`].

mod anthropic;
mod error;
mod fallback;
mod handlers;
mod mapping;
mod metrics;
mod relay;
mod stream;
#[cfg(test)]
mod tests;
mod tools;
mod web;
mod wire;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::appliance::Appliance;
use crate::error::{LaunchError, Result};

pub(crate) use anthropic::{protocol_request as anthropic_request, MessagesRequest};
pub use mapping::chat_body;
pub use metrics::Metrics;

/// Request bodies larger than this are answered 413 (the protocol's line
/// limit is 1 MiB; JSON escapes may grow a prompt a little).
const BODY_LIMIT: usize = 4 << 20;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The appliance (locked only to open a connection).
    pub appliance: Mutex<Appliance>,
    /// The served model's name (`info.model`).
    pub model: String,
    /// Its context limit in tokens.
    pub context_limit: u64,
    /// Where the engine runs (`native`, `vm`, `attached`).
    pub placement: &'static str,
    /// When the server started (Unix seconds).
    pub created: u64,
    /// The Bearer key the API requires, if any.
    pub api_key: Option<String>,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Numbers answer ids.
    pub next_id: AtomicU64,
}

impl AppState {
    /// The state for `appliance`, reading the model's name and context
    /// limit from its `info`.
    pub fn new(appliance: Appliance, api_key: Option<String>) -> Result<AppState> {
        let info = appliance.client()?.info()?;
        let model = info.model;
        let context_limit = u64::from(info.context_limit);
        Ok(AppState {
            placement: appliance.placement(),
            appliance: Mutex::new(appliance),
            model,
            context_limit,
            created: unix_now(),
            api_key,
            metrics: Arc::default(),
            next_id: AtomicU64::new(0),
        })
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/metrics", get(handlers::metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), handlers::auth));
    let messages = Router::new()
        .route("/v1/messages", post(anthropic::messages))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), anthropic::auth));
    Router::new()
        .merge(api)
        .merge(messages)
        .route("/health", get(handlers::health))
        .route("/", get(web::index))
        .route("/chat.js", get(web::script))
        .route("/chat.css", get(web::style))
        .fallback(fallback::fallback)
        .method_not_allowed_fallback(fallback::wrong_method)
        .layer(axum::middleware::from_fn_with_state(state.clone(), handlers::count))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Whether `addr` may be served without an API key.
pub fn needs_key(addr: &SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

/// Serves `state` on `addr` until Ctrl-C or SIGTERM; prints the address.
pub fn run(state: AppState, addr: SocketAddr) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| LaunchError::Start { what: "the async runtime", source })?;
    let state = Arc::new(state);
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| {
            LaunchError::Serve { what: format!("cannot listen on {addr}"), source }
        })?;
        let local = listener.local_addr().map_err(|source| LaunchError::Serve {
            what: format!("cannot read the address of {addr}"),
            source,
        })?;
        println!(
            "kore-launch serve: http://{local}/ (model {}; OpenAI API at http://{local}/v1)",
            state.model
        );
        // Open streams get a few seconds to end after the signal, then are dropped
        // (which cancels their generations).
        let stopping = Arc::new(tokio::sync::Notify::new());
        let notify = stopping.clone();
        let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
            shutdown_signal().await;
            notify.notify_waiters();
        });
        tokio::select! {
            r = server => r.map_err(|source| LaunchError::Serve {
                what: "the HTTP server failed".into(),
                source,
            }),
            () = async {
                stopping.notified().await;
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            } => Ok(()),
        }
    })
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => drop(s.recv().await),
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("shutting down the HTTP server");
}
