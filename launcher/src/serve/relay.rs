//! One HTTP request's generation on the appliance: its own protocol
//! connection (so concurrent HTTP requests reach the service's scheduler
//! concurrently), a reader thread that forwards the blocking client's events
//! into a tokio channel, and a guard that sends the protocol's cancel when
//! the HTTP side goes away (client disconnect) before the `done` event.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kore_protocol::{Event, GenerateRequest, Id, Request};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::metrics::Metrics;
use crate::appliance::Appliance;
use crate::client::{Client, Delta, Done, Events, Requests};

/// What the reader thread forwards.
#[derive(Debug)]
pub enum Update {
    /// Streamed text.
    Delta(Delta),
    /// The generation ended.
    Done(Done),
    /// The appliance refused or failed the request, or went away.
    Failed(ApiError),
}

/// A generation in flight; dropping it before its `done` cancels it.
#[derive(Debug)]
pub struct Relay {
    updates: mpsc::UnboundedReceiver<Update>,
    _cancel: CancelOnDrop,
}

impl Relay {
    /// Sends `request` (its `id` replaced) on a new connection of
    /// `appliance` and starts forwarding its events.
    pub fn start(
        appliance: &Mutex<Appliance>,
        mut request: GenerateRequest,
        metrics: Arc<Metrics>,
    ) -> Result<Relay, ApiError> {
        let conn = {
            let a = appliance.lock().unwrap_or_else(|p| p.into_inner());
            a.connect()
        }
        .map_err(|e| ApiError::unavailable(format!("cannot reach the appliance: {e}")))?;
        let (events, mut requests) = Client::new(conn).into_split();
        let id = Id::from(1);
        request.id = id.clone();
        requests
            .send(&Request::Generate(request))
            .map_err(|e| ApiError::unavailable(format!("cannot send to the appliance: {e}")))?;
        let finished = Arc::new(AtomicBool::new(false));
        let (tx, updates) = mpsc::unbounded_channel();
        let flag = finished.clone();
        std::thread::Builder::new()
            .name("kore-serve-relay".into())
            .spawn(move || forward(events, &tx, &flag, &metrics))
            .map_err(|e| ApiError::unavailable(format!("cannot start a relay thread: {e}")))?;
        Ok(Relay { updates, _cancel: CancelOnDrop { requests, id, finished } })
    }

    /// The next update; `None` after the terminal one.
    pub async fn next(&mut self) -> Option<Update> {
        self.updates.recv().await
    }

    /// The first update if it comes within `wait` (protocol errors are sent
    /// before any work, so they arrive here and become HTTP statuses).
    pub async fn first_within(&mut self, wait: std::time::Duration) -> Option<Update> {
        tokio::time::timeout(wait, self.updates.recv()).await.ok().flatten()
    }
}

/// Reads events until the request's terminal one, forwarding them; keeps
/// reading after the HTTP side is gone so the cancelled `done` is seen.
fn forward(
    mut events: Events,
    tx: &mpsc::UnboundedSender<Update>,
    finished: &AtomicBool,
    metrics: &Metrics,
) {
    loop {
        let update = match events.next_event() {
            Ok(Some(Event::Delta(d))) => Update::Delta(d),
            Ok(Some(Event::Done(d))) => {
                finished.store(true, Ordering::SeqCst);
                metrics.record_done(&d);
                Update::Done(d)
            }
            Ok(Some(Event::Error(e))) => {
                finished.store(true, Ordering::SeqCst);
                Update::Failed(ApiError::from_protocol(e.error.code, &e.error.message))
            }
            Ok(Some(_)) => continue,
            Ok(None) => {
                finished.store(true, Ordering::SeqCst);
                Update::Failed(ApiError::unavailable("the appliance closed the connection"))
            }
            Err(e) => {
                finished.store(true, Ordering::SeqCst);
                Update::Failed(ApiError::unavailable(format!("appliance connection failed: {e}")))
            }
        };
        let terminal = !matches!(update, Update::Delta(_));
        // A closed receiver means the client left; the guard sent the cancel.
        let _ = tx.send(update);
        if terminal {
            return;
        }
    }
}

/// Sends `{"cancel": id}` on drop unless the request already ended; then
/// closes the connection's sending side.
#[derive(Debug)]
struct CancelOnDrop {
    requests: Requests,
    id: Id,
    finished: Arc<AtomicBool>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::SeqCst) {
            tracing::info!("client went away: cancelling its request");
            // A pipe or socket write of one short line; the service reads it
            // between engine steps.
            if let Err(e) = self.requests.cancel(&self.id) {
                tracing::warn!("cannot send the cancel: {e}");
            }
        }
        self.requests.close();
    }
}
