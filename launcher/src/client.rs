//! The one client of the Kore chat protocol (docs/protocol.md) for every
//! command: writes typed [`Request`]s, reads typed [`Event`]s (crate
//! `kore-protocol`, the types the service itself writes), cancels. It speaks
//! over any [`Connection`]: an in-process pipe to a native service, the
//! appliance VM's vsock through its Unix socket, or the background
//! appliance's relay.
//!
//! ```ignore
//! let mut client = appliance.client()?;
//! let done = client.generate(GenerateRequest::completion("Once"), |d| print!("{}", d.delta))?;
//! ```
//!
//! Where events must be read while requests are written (a Ctrl-C cancel,
//! several requests in flight, an HTTP relay), split it with
//! [`Client::into_split`]; [`Events::spawn_reader`] moves the reading half to
//! a thread that delivers events on a channel.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use kore_protocol::{
    BenchReport, BenchRequest, DeltaEvent, DoneEvent, ErrorCode, Event, GenerateRequest, Id,
    InfoBody, Request,
};

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

/// An event as a client reads it (owned).
pub type OwnedEvent = Event<'static>;
/// A `done` event as a client reads it (owned).
pub type Done = DoneEvent<'static>;
/// A delta as a client reads it (owned).
pub type Delta = DeltaEvent<'static>;

/// What can go wrong talking to the appliance.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The appliance answered the request with a protocol error.
    #[error("the appliance answered {code}: {message}")]
    Refused {
        /// The request's id (`null` when the line had none).
        id: Id,
        /// The stable code.
        code: ErrorCode,
        /// What went wrong and what to do.
        message: String,
    },
    /// The connection ended before the answer.
    #[error("the appliance closed the connection before answering{0}")]
    Closed(String),
    /// Reading or writing the connection failed.
    #[error("the connection to the appliance failed: {0}")]
    Io(#[from] std::io::Error),
    /// A line that is no event of this protocol.
    #[error("the appliance sent a malformed event ({source}): {line}")]
    Malformed {
        /// The line as read.
        line: String,
        /// Why it is not an event.
        #[source]
        source: serde_json::Error,
    },
    /// An event of the wrong kind for the request.
    #[error("unexpected answer to {what}: {event}")]
    Unexpected {
        /// The request.
        what: &'static str,
        /// The event, as read.
        event: String,
    },
    /// The sending side was closed already.
    #[error("the connection's sending side is already closed")]
    SendClosed,
}

impl ClientError {
    /// The protocol code of a refusal.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Result of client calls.
pub type ClientResult<T> = std::result::Result<T, ClientError>;

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
    pub fn next_event(&mut self) -> ClientResult<Option<OwnedEvent>> {
        loop {
            self.line.clear();
            if self.reader.read_line(&mut self.line)? == 0 {
                return Ok(None);
            }
            let line = self.line.trim_end();
            if !line.is_empty() {
                return kore_protocol::parse_event(line)
                    .map(Some)
                    .map_err(|source| ClientError::Malformed { line: line.into(), source });
            }
        }
    }

    /// Moves reading to a thread: events arrive on the returned channel, the
    /// last one an error ([`ClientError::Closed`] at end of stream).
    pub fn spawn_reader(mut self) -> std::io::Result<EventChannel> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name("kore-launch-events".into()).spawn(move || loop {
            let item = match self.next_event() {
                Ok(Some(ev)) => Ok(ev),
                Ok(None) => Err(ClientError::Closed(String::new())),
                Err(e) => Err(e),
            };
            let last = item.is_err();
            if tx.send(item).is_err() || last {
                return;
            }
        })?;
        Ok(EventChannel { rx })
    }
}

/// Events from a reader thread ([`Events::spawn_reader`]).
#[derive(Debug)]
pub struct EventChannel {
    rx: Receiver<ClientResult<OwnedEvent>>,
}

impl EventChannel {
    /// The next event, or `None` when none came within `timeout`.
    pub fn next_timeout(&self, timeout: Duration) -> Option<ClientResult<OwnedEvent>> {
        match self.rx.recv_timeout(timeout) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(ClientError::Closed(String::new()))),
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
    /// Sends one request as a line.
    pub fn send(&mut self, request: &Request) -> ClientResult<()> {
        self.send_all(std::slice::from_ref(request))
    }

    /// Sends requests as lines in one write, so that the service reads them
    /// together and starts them in the same step.
    pub fn send_all(&mut self, requests: &[Request]) -> ClientResult<()> {
        let w = self.writer.as_mut().ok_or(ClientError::SendClosed)?;
        let bytes: Vec<u8> = requests.iter().flat_map(Request::to_line).collect();
        w.write_all(&bytes)?;
        Ok(w.flush()?)
    }

    /// A fresh numeric id for this connection.
    pub fn next_id(&mut self) -> Id {
        self.next_id += 1;
        Id::from(self.next_id)
    }

    /// Cancels request `id` (harmless if it already ended).
    pub fn cancel(&mut self, id: &Id) -> ClientResult<()> {
        self.send(&Request::Cancel(id.clone()))
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

    /// Sends a request as is.
    pub fn send(&mut self, request: &Request) -> ClientResult<()> {
        self.requests.send(request)
    }

    /// The next event (`None` once the service closed the connection).
    pub fn next_event(&mut self) -> ClientResult<Option<OwnedEvent>> {
        self.events.next_event()
    }

    /// Reads until the terminal event of `id`, passing its deltas to
    /// `on_delta`; events of other requests are skipped. A protocol error
    /// event becomes [`ClientError::Refused`].
    pub fn wait(
        &mut self,
        id: &Id,
        mut on_delta: impl FnMut(&DeltaEvent<'_>),
    ) -> ClientResult<OwnedEvent> {
        loop {
            match self.next_event()? {
                None => return Err(ClientError::Closed(format!(" request {id}"))),
                Some(Event::Delta(d)) if *d.id == *id => on_delta(&d),
                Some(Event::Error(e)) if *e.id == *id || e.id.is_null() => {
                    return Err(ClientError::Refused {
                        id: e.id.into_owned(),
                        code: e.error.code,
                        message: e.error.message.into_owned(),
                    })
                }
                Some(ev) if ev.is_terminal() && ev.id() == id => return Ok(ev),
                Some(_) => {}
            }
        }
    }

    /// Runs one generation (a fresh id replaces the request's) and returns
    /// its `done` event.
    pub fn generate(
        &mut self,
        mut request: GenerateRequest,
        on_delta: impl FnMut(&DeltaEvent<'_>),
    ) -> ClientResult<Done> {
        let id = self.requests.next_id();
        request.id = id.clone();
        self.send(&Request::Generate(request))?;
        match self.wait(&id, on_delta)? {
            Event::Done(d) => Ok(d),
            other => Err(unexpected("a generation", &other)),
        }
    }

    /// `{"op":"info"}`: model, context limit, queue state.
    pub fn info(&mut self) -> ClientResult<InfoBody> {
        let id = self.requests.next_id();
        self.send(&Request::Info(id.clone()))?;
        match self.wait(&id, |_| {})? {
            Event::Info(i) => Ok(i.info.into_owned()),
            other => Err(unexpected("info", &other)),
        }
    }

    /// `{"op":"bench", ...}`: the report.
    pub fn bench(&mut self, request: BenchRequest) -> ClientResult<BenchReport> {
        let id = self.requests.next_id();
        self.send(&Request::Bench(id.clone(), request))?;
        match self.wait(&id, |_| {})? {
            Event::Bench(b) => Ok(b.bench.into_owned()),
            other => Err(unexpected("bench", &other)),
        }
    }
}

fn unexpected(what: &'static str, event: &OwnedEvent) -> ClientError {
    let mut line = Vec::new();
    kore_protocol::write_line(&mut line, event);
    ClientError::Unexpected { what, event: String::from_utf8_lossy(&line).trim_end().into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A client whose service "answers" with `lines` and records what is sent.
    fn scripted(lines: &str) -> Client {
        Client::new(Connection {
            reader: Box::new(Cursor::new(lines.as_bytes().to_vec())),
            writer: Box::new(std::io::sink()),
        })
    }

    #[test]
    fn generate_reads_its_deltas_and_done() {
        let mut c = scripted(concat!(
            r#"{"id":9,"delta":"other","phase":"answer"}"#,
            "\n",
            r#"{"id":1,"delta":"hi","phase":"answer"}"#,
            "\n",
            r#"{"id":1,"done":true,"finish":"stop","token_ids":[5,6],"text":"hi","stats":{"prompt_tokens":3}}"#,
            "\n"
        ));
        let mut seen = String::new();
        let done = c.generate(GenerateRequest::completion("x"), |d| seen += &d.delta).unwrap();
        assert_eq!((seen.as_str(), &done.token_ids[..]), ("hi", &[5, 6][..]));
        assert_eq!((done.finish, done.stats.prompt_tokens), (kore_protocol::Finish::Stop, 3));
    }

    #[test]
    fn refusals_closes_and_garbage_are_typed_errors() {
        let line = r#"{"id":1,"error":{"code":"prompt_too_long","message":"m"}}"#;
        let e = scripted(line).info().unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::PromptTooLong), "{e}");
        assert!(matches!(scripted("").info().unwrap_err(), ClientError::Closed(_)));
        let e = scripted("not json\n").info().unwrap_err();
        assert!(matches!(e, ClientError::Malformed { .. }), "{e}");
        let e = scripted(r#"{"id":1,"info":{"model":"m"}}"#).bench(BenchRequest::default());
        assert!(matches!(e.unwrap_err(), ClientError::Unexpected { .. }));
    }
}
