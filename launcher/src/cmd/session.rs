//! The seam between the chat/batch commands and whatever runs the engine: a
//! [`Backend`] opens protocol connections ([`Conn`]) that speak the JSON-lines
//! protocol of `docs/protocol.md`, whether the service runs in the Kore guest
//! (over the VM's vsock socket), in-process (`--native`), or — for the
//! launcher's own tests — on kore-service's fake engine (`KORE_LAUNCH_FAKE`).

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::cli::SamplingArgs;
use crate::error::{LaunchError, Result};

/// The two byte streams of one protocol connection (from / to the service).
pub type Streams = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// Something that serves the protocol: a booted VM, an attached background
/// appliance, an in-process engine, or the test fake.
pub trait Backend {
    /// Opens a new connection's byte streams (the daemon relays them).
    fn streams(&self) -> Result<Streams>;
    /// Opens a new protocol connection.
    fn connect(&self) -> Result<Conn> {
        let (reader, writer) = self.streams()?;
        Conn::new(reader, writer)
    }
    /// One line saying what serves the requests (for `status` and logs).
    fn describe(&self) -> String;
    /// The VMM process's confinement, when this backend booted a VM.
    fn vmm(&self) -> Option<serde_json::Value> {
        None
    }
    /// Stops what this backend started (shuts a booted VM down cleanly);
    /// leaves an attached background appliance running.
    fn shutdown(self: Box<Self>) -> Result<()>;
}

/// Where the engine should run, from the command line.
#[derive(Debug, Clone)]
pub struct Placement {
    /// `--native`: in-process on the host.
    pub native: bool,
    /// `--model PATH`, if given.
    pub model: Option<std::path::PathBuf>,
}

/// Opens the backend for `placement`: with `--native` the engine in-process;
/// otherwise the background appliance of `kore-launch up` if one answers,
/// else the Kore VM booted for this command (`Appliance::open_for`).
/// `KORE_LAUNCH_FAKE=echo` (with an optional `KORE_LAUNCH_FAKE_DELAY_MS` per
/// engine step) selects the fake engine of the launcher's tests instead,
/// whatever the placement.
pub fn open(placement: &Placement) -> Result<Box<dyn Backend>> {
    open_with(placement, true)
}

/// Like [`open`] but never attaches to a background appliance (what the
/// `up` daemon itself runs).
pub fn open_fresh(placement: &Placement) -> Result<Box<dyn Backend>> {
    open_with(placement, false)
}

fn open_with(placement: &Placement, attach: bool) -> Result<Box<dyn Backend>> {
    let backend = match std::env::var("KORE_LAUNCH_FAKE").ok().filter(|s| !s.is_empty()) {
        Some(kind) => super::session_fake::open(&kind)?,
        None => super::session_appliance::open(placement, attach)?,
    };
    tracing::info!("engine: {}", backend.describe());
    Ok(backend)
}

/// One event of the protocol, as the commands use it.
#[derive(Debug, Clone)]
pub enum Event {
    /// Streamed text of a request.
    Delta {
        /// The request id.
        id: Value,
        /// The text.
        text: String,
        /// True in the thinking phase, false in the answer phase.
        thinking: bool,
    },
    /// The terminal `done` event; `body` is the whole object.
    Done {
        /// The request id.
        id: Value,
        /// The event object (`finish`, `text`, `thinking`, `token_ids`, `stats`).
        body: Value,
    },
    /// An `error` event (terminal for its request; `id` null for unreadable lines).
    Error {
        /// The request id, or null.
        id: Value,
        /// The stable error code.
        code: String,
        /// The message for people.
        message: String,
    },
    /// An `info` answer.
    Info {
        /// The request id.
        id: Value,
        /// The info object.
        info: Value,
    },
    /// The service closed the connection (or sent something unreadable).
    Closed(String),
}

/// A protocol connection: requests go out through `send`, events come in
/// from a reader thread.
pub struct Conn {
    writer: Box<dyn Write + Send>,
    events: Receiver<Event>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Conn")
    }
}

impl Conn {
    /// Wraps the two halves of a byte stream.
    pub fn new(reader: Box<dyn Read + Send>, writer: Box<dyn Write + Send>) -> Result<Self> {
        let (tx, events) = mpsc::channel();
        thread::Builder::new()
            .name("kore-launch-events".into())
            .spawn(move || {
                let mut reader = BufReader::new(reader);
                let mut line = String::new();
                loop {
                    line.clear();
                    let ev = match reader.read_line(&mut line) {
                        Ok(0) => Event::Closed("the appliance closed the connection".into()),
                        Ok(_) => parse_event(&line),
                        Err(e) => Event::Closed(format!("reading from the appliance: {e}")),
                    };
                    let last = matches!(ev, Event::Closed(_));
                    if tx.send(ev).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(|e| LaunchError::Other(format!("cannot start the reader thread: {e}")))?;
        Ok(Self { writer, events })
    }

    /// Sends one request object as a line.
    pub fn send(&mut self, request: &Value) -> Result<()> {
        self.send_all(core::slice::from_ref(request))
    }

    /// Sends request objects as lines in one write, so that the service
    /// reads them together and starts them in the same step.
    pub fn send_all(&mut self, requests: &[Value]) -> Result<()> {
        let mut lines = String::new();
        for r in requests {
            lines.push_str(&r.to_string());
            lines.push('\n');
        }
        self.writer
            .write_all(lines.as_bytes())
            .and_then(|()| self.writer.flush())
            .map_err(|e| LaunchError::Other(format!("sending to the appliance: {e}")))
    }

    /// The next event, or `None` after `timeout`.
    pub fn next_timeout(&self, timeout: Duration) -> Option<Event> {
        match self.events.recv_timeout(timeout) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Event::Closed("connection ended".into())),
        }
    }

    /// The next event, waiting as long as it takes.
    pub fn next(&self) -> Event {
        self.events.recv().unwrap_or_else(|_| Event::Closed("connection ended".into()))
    }

    /// Asks `{"op":"info"}` and waits for the answer.
    pub fn info(&mut self) -> Result<Value> {
        let id = Value::from("kore-launch-info");
        self.send(&serde_json::json!({"op": "info", "id": id}))?;
        loop {
            match self.next() {
                Event::Info { id: got, info } if got == id => return Ok(info),
                Event::Error { id: got, message, .. } if got == id => {
                    return Err(LaunchError::Other(format!("appliance info: {message}")))
                }
                Event::Closed(why) => return Err(LaunchError::Other(why)),
                _ => {}
            }
        }
    }
}

/// One line as the commands' [`Event`], read by the protocol's one parser
/// (through [`crate::client::Event::parse`]).
fn parse_event(line: &str) -> Event {
    use crate::client::Event as Client;
    match Client::parse(line) {
        Ok(Client::Delta(d)) => Event::Delta {
            id: d.id,
            text: d.text,
            thinking: d.phase == crate::client::Phase::Thinking,
        },
        Ok(Client::Done(_)) => match serde_json::from_str::<Value>(line) {
            Ok(body) => Event::Done { id: body.get("id").cloned().unwrap_or(Value::Null), body },
            Err(e) => Event::Closed(e.to_string()),
        },
        Ok(Client::Error(e)) => Event::Error { id: e.id, code: e.code, message: e.message },
        Ok(Client::Info { id, info }) => Event::Info { id, info },
        Ok(Client::Bench { .. }) => {
            Event::Closed(format!("the appliance sent an unexpected event: {}", line.trim_end()))
        }
        Err(e) => Event::Closed(e.to_string()),
    }
}

/// Adds the sampling flags that were given to a request object.
pub fn add_sampling(req: &mut Map<String, Value>, s: &SamplingArgs) {
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            req.insert(k.into(), v);
        }
    };
    put("max_tokens", s.max_tokens.map(Value::from));
    put("temperature", s.temperature.map(|x| Value::from(f64::from(x))));
    put("top_p", s.top_p.map(|x| Value::from(f64::from(x))));
    put("top_k", s.top_k.map(Value::from));
    put("min_p", s.min_p.map(|x| Value::from(f64::from(x))));
    put("seed", s.seed.map(Value::from));
    put("mtp", s.mtp.map(Value::from));
}

/// The status line after an answer:
/// `806 tokens at 37.9 tok/s · context 2055 of 65536 · 3.88 tokens a step`.
pub fn status_line(stats: &Value) -> String {
    let n = |k: &str| stats.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let line = format!(
        "{} tokens at {:.1} tok/s · context {} of {} · {:.2} tokens a step",
        n("generated_tokens") as u64,
        n("decode_tok_per_s"),
        n("context_used") as u64,
        n("context_limit") as u64,
        n("tokens_per_step"),
    );
    match n("cached_tokens") as u64 {
        0 => line,
        c => format!("{line} · {c} of {} prompt tokens reused", n("prompt_tokens") as u64),
    }
}
