//! A client of the Kore chat protocol (docs/protocol.md): writes request
//! lines, reads events, cancels. It speaks over any [`Connection`] — an
//! in-process pipe to a native service, or the appliance VM's vsock through
//! its Unix socket — so every command drives the guest and `--native` paths
//! with the same code.
//!
//! ```ignore
//! let mut client = appliance.client()?;
//! let done = client.generate(json!({"prompt": "Once", "max_tokens": 8}), |d| print!("{}", d.text))?;
//! ```
//!
//! For concurrent use (a reader thread plus cancels from a Ctrl-C handler, or
//! several requests in flight) split it with [`Client::into_split`].

// Cancels and splitting serve `chat` and `batch` (helper ux).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};

use serde_json::{json, Value};

use crate::error::{LaunchError, Result};

/// One side of a byte stream to the service.
pub type ReadHalf = Box<dyn Read + Send>;
/// The other side; dropping it is end-of-stream for the service (requests
/// already sent still complete).
pub type WriteHalf = Box<dyn Write + Send>;

/// A duplex connection to the service, split into halves.
pub struct Connection {
    /// Responses from the service.
    pub reader: ReadHalf,
    /// Requests to the service.
    pub writer: WriteHalf,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

/// Where a delta belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reasoning between `<think>` and `</think>`.
    Thinking,
    /// The answer.
    Answer,
}

/// A streamed piece of text.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The request's id.
    pub id: Value,
    /// The text.
    pub text: String,
    /// Thinking or answer.
    pub phase: Phase,
}

/// The terminal `done` event of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// The request's id.
    pub id: Value,
    /// `stop`, `length` or `cancelled`.
    pub finish: String,
    /// Generated ids (including a final stop token).
    pub token_ids: Vec<u32>,
    /// The answer text.
    pub text: String,
    /// The thinking text (chat requests only).
    pub thinking: Option<String>,
    /// The stats object as sent (prompt_tokens, generated_tokens, ...).
    pub stats: Value,
}

/// A protocol error event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    /// The request's id (`null` when the line had none).
    pub id: Value,
    /// The stable code (`bad_request`, `prompt_too_long`, ...).
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
}

impl From<ProtocolError> for LaunchError {
    fn from(e: ProtocolError) -> Self {
        let text = format!("the appliance answered {}: {}", e.code, e.message);
        match e.code.as_str() {
            "bad_request" | "prompt_too_long" => LaunchError::Usage(text),
            _ => LaunchError::Other(text),
        }
    }
}

/// One event from the service.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Streamed text.
    Delta(Delta),
    /// A generation ended.
    Done(Done),
    /// A request failed.
    Error(ProtocolError),
    /// The answer to `{"op":"info"}`.
    Info {
        /// The request's id.
        id: Value,
        /// The info object.
        info: Value,
    },
    /// The answer to `{"op":"bench"}`.
    Bench {
        /// The request's id.
        id: Value,
        /// The report (the `kore-launch bench --json` fields).
        report: Value,
    },
}

impl Event {
    /// The id the event belongs to.
    pub fn id(&self) -> &Value {
        match self {
            Event::Delta(d) => &d.id,
            Event::Done(d) => &d.id,
            Event::Error(e) => &e.id,
            Event::Info { id, .. } | Event::Bench { id, .. } => id,
        }
    }

    /// Whether this ends its request.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Event::Delta(_))
    }

    /// Parses one event line with the protocol's wire types
    /// (`kore_service::response`, the only parser of events).
    pub fn parse(line: &str) -> Result<Event> {
        use kore_service::response::{self as wire, Event as Wire};
        let event = wire::parse_event(line).map_err(|e| {
            LaunchError::Other(format!("the appliance sent a malformed event ({e}): {line}"))
        })?;
        Ok(match event {
            Wire::Delta(d) => Event::Delta(Delta {
                id: d.id.into_owned().0,
                text: d.delta.into_owned(),
                phase: match d.phase {
                    wire::Phase::Thinking => Phase::Thinking,
                    wire::Phase::Answer => Phase::Answer,
                },
            }),
            Wire::Done(d) => Event::Done(Done {
                id: d.id.into_owned().0,
                finish: to_json(&d.finish).as_str().unwrap_or_default().to_string(),
                token_ids: d.token_ids.into_owned(),
                text: d.text.into_owned(),
                thinking: d.thinking.map(|t| t.into_owned()),
                stats: to_json(&d.stats),
            }),
            Wire::Error(e) => Event::Error(ProtocolError {
                id: e.id.into_owned().0,
                code: to_json(&e.error.code).as_str().unwrap_or_default().to_string(),
                message: e.error.message.into_owned(),
            }),
            Wire::Info(i) => Event::Info { id: i.id.into_owned().0, info: to_json(&i.info) },
            Wire::Bench(b) => Event::Bench { id: b.id.into_owned().0, report: to_json(&b.bench) },
        })
    }
}

/// A wire value as the JSON the service sent (the launcher's views keep some as JSON).
fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn io_err(source: std::io::Error) -> LaunchError {
    LaunchError::Io { path: "appliance connection".into(), source }
}

/// The reading half: events in arrival order.
pub struct Events {
    reader: BufReader<ReadHalf>,
    line: String,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Events")
    }
}

impl Events {
    /// The next event, or `None` once the service closed the connection.
    pub fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            self.line.clear();
            let n = self.reader.read_line(&mut self.line).map_err(io_err)?;
            if n == 0 {
                return Ok(None);
            }
            let line = self.line.trim_end();
            if !line.is_empty() {
                return Event::parse(line).map(Some);
            }
        }
    }
}

/// The writing half: requests and cancels.
pub struct Requests {
    writer: Option<WriteHalf>,
    next_id: u64,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Requests")
    }
}

impl Requests {
    /// Sends one request object as a line.
    pub fn send(&mut self, request: &Value) -> Result<()> {
        let w = self.writer.as_mut().ok_or_else(|| {
            LaunchError::Other("the connection's sending side is already closed".into())
        })?;
        let mut line = serde_json::to_vec(request)
            .map_err(|e| LaunchError::Other(format!("cannot encode the request: {e}")))?;
        line.push(b'\n');
        w.write_all(&line).and_then(|()| w.flush()).map_err(io_err)
    }

    /// A fresh numeric id for this connection.
    pub fn next_id(&mut self) -> Value {
        self.next_id += 1;
        json!(self.next_id)
    }

    /// Cancels request `id` (harmless if it already ended).
    pub fn cancel(&mut self, id: &Value) -> Result<()> {
        self.send(&json!({ "cancel": id }))
    }

    /// Closes the sending side: requests already sent are answered, then the
    /// service closes the connection.
    pub fn close(&mut self) {
        self.writer = None;
    }
}

/// A connection with both halves: send a request, read its events.
#[derive(Debug)]
pub struct Client {
    events: Events,
    requests: Requests,
}

impl Client {
    /// A client over `conn`.
    pub fn new(conn: Connection) -> Self {
        Self {
            events: Events { reader: BufReader::new(conn.reader), line: String::new() },
            requests: Requests { writer: Some(conn.writer), next_id: 0 },
        }
    }

    /// The halves, for a reader thread plus a writer elsewhere.
    pub fn into_split(self) -> (Events, Requests) {
        (self.events, self.requests)
    }

    /// Sends a request as is (it should carry an `id`).
    pub fn send(&mut self, request: &Value) -> Result<()> {
        self.requests.send(request)
    }

    /// The next event (`None` once the service closed the connection).
    pub fn next_event(&mut self) -> Result<Option<Event>> {
        self.events.next_event()
    }

    /// Cancels request `id`.
    pub fn cancel(&mut self, id: &Value) -> Result<()> {
        self.requests.cancel(id)
    }

    /// Reads until the terminal event of `id`, passing its deltas to
    /// `on_delta`; events of other requests are skipped.
    pub fn wait(&mut self, id: &Value, mut on_delta: impl FnMut(&Delta)) -> Result<Event> {
        loop {
            match self.next_event()? {
                None => {
                    return Err(LaunchError::Other(format!(
                        "the appliance closed the connection before answering request {id}"
                    )))
                }
                Some(Event::Delta(d)) if &d.id == id => on_delta(&d),
                Some(ev) if ev.is_terminal() && ev.id() == id => return Ok(ev),
                Some(_) => {}
            }
        }
    }

    /// Runs one generation (`request` without an `id`; one is added) and
    /// returns its `done` event; a protocol error becomes a [`LaunchError`].
    pub fn generate(&mut self, mut request: Value, on_delta: impl FnMut(&Delta)) -> Result<Done> {
        let id = self.requests.next_id();
        request["id"] = id.clone();
        self.send(&request)?;
        match self.wait(&id, on_delta)? {
            Event::Done(d) => Ok(d),
            Event::Error(e) => Err(e.into()),
            other => {
                Err(LaunchError::Other(format!("unexpected answer to a generation: {other:?}")))
            }
        }
    }

    /// `{"op":"info"}`: model, context limit, queue state.
    pub fn info(&mut self) -> Result<Value> {
        let id = self.requests.next_id();
        self.send(&json!({"op": "info", "id": id}))?;
        match self.wait(&id, |_| {})? {
            Event::Info { info, .. } => Ok(info),
            Event::Error(e) => Err(e.into()),
            other => Err(LaunchError::Other(format!("unexpected answer to info: {other:?}"))),
        }
    }

    /// `{"op":"bench", ...}` (`params` holds the optional fields); returns the report.
    pub fn bench(&mut self, params: Value) -> Result<Value> {
        let id = self.requests.next_id();
        let mut request = if params.is_object() { params } else { json!({}) };
        request["op"] = json!("bench");
        request["id"] = id.clone();
        self.send(&request)?;
        match self.wait(&id, |_| {})? {
            Event::Bench { report, .. } => Ok(report),
            Event::Error(e) => Err(e.into()),
            other => Err(LaunchError::Other(format!("unexpected answer to bench: {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_event_kind() {
        let d = Event::parse(r#"{"id":"a","delta":"hi","phase":"thinking"}"#).unwrap();
        assert_eq!(
            d,
            Event::Delta(Delta { id: json!("a"), text: "hi".into(), phase: Phase::Thinking })
        );
        let done = Event::parse(
            r#"{"id":1,"done":true,"finish":"stop","token_ids":[5,6],"text":"x","stats":{"prompt_tokens":3}}"#,
        )
        .unwrap();
        let Event::Done(done) = done else { panic!("not done") };
        assert_eq!(
            (done.token_ids, done.finish.as_str(), done.thinking),
            (vec![5, 6], "stop", None)
        );
        let e = Event::parse(r#"{"id":null,"error":{"code":"bad_json","message":"m"}}"#).unwrap();
        assert!(matches!(e, Event::Error(ProtocolError { ref code, .. }) if code == "bad_json"));
        assert!(Event::parse(r#"{"id":1,"info":{"model":"m"}}"#).unwrap().is_terminal());
        assert!(Event::parse("not json").is_err());
        assert!(Event::parse(r#"{"id":1,"done":true,"token_ids":[-1]}"#).is_err());
        assert!(Event::parse(r#"{"id":1,"what":2}"#).is_err());
    }
}
