//! One client connection as a state machine: bytes in (framed into bounded
//! lines), response bytes out (bounded), and the set of request ids it has in
//! flight. The [`crate::Service`] owns connections and decides what each line
//! means; a transport only moves bytes.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use serde::Serialize;

use crate::framing::{Frame, LineFramer};
use kore_protocol::write_line;

/// Handle of one connection inside a [`crate::Service`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// Lifecycle of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Reading requests.
    Open,
    /// The client finished sending (EOF) or the service refused the
    /// connection: no more input; close once its requests are answered and
    /// its output is flushed.
    Draining,
    /// The client stopped reading and its output overflowed the limit: its
    /// requests were cancelled; close now.
    Killed,
}

/// Per-connection protocol state.
#[derive(Debug)]
pub struct Connection {
    framer: LineFramer,
    out: Vec<u8>,
    max_output: usize,
    /// In-flight request id keys with their counts (only `null` repeats).
    in_flight: BTreeMap<String, u32>,
    state: ConnState,
}

impl Connection {
    /// A connection accepting lines of up to `max_line` bytes and holding at
    /// most `max_output` bytes of unsent responses.
    pub fn new(max_line: usize, max_output: usize) -> Self {
        Self {
            framer: LineFramer::new(max_line),
            out: Vec::new(),
            max_output,
            in_flight: BTreeMap::new(),
            state: ConnState::Open,
        }
    }

    /// Current lifecycle state.
    pub fn state(&self) -> ConnState {
        self.state
    }

    /// Frames `bytes` into lines (appended to `frames`); ignored unless open.
    pub fn on_bytes(&mut self, bytes: &[u8], frames: &mut Vec<Frame>) {
        if self.state == ConnState::Open {
            self.framer.push(bytes, frames);
        }
    }

    /// The client will send nothing more: a final unterminated line is still
    /// a request; then the connection drains.
    pub fn on_eof(&mut self, frames: &mut Vec<Frame>) {
        if self.state == ConnState::Open {
            self.framer.finish(frames);
            self.state = ConnState::Draining;
        }
    }

    /// Stop reading and close once drained (used when refusing a connection).
    pub fn drain(&mut self) {
        if self.state == ConnState::Open {
            self.state = ConnState::Draining;
        }
    }

    /// Queues one response line. Returns false (and kills the connection)
    /// if the unsent output would exceed the limit.
    pub fn send<T: Serialize>(&mut self, event: &T) -> bool {
        if self.state == ConnState::Killed {
            return false;
        }
        write_line(&mut self.out, event);
        if self.out.len() > self.max_output {
            self.out = Vec::new();
            self.state = ConnState::Killed;
            return false;
        }
        true
    }

    /// Unsent response bytes.
    pub fn output(&self) -> &[u8] {
        &self.out
    }

    /// Marks the first `n` output bytes as sent.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.out.len());
        self.out.drain(..n);
    }

    /// Takes all unsent output.
    pub fn take_output(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.out)
    }

    /// Whether a request with this id key is queued or running here.
    pub fn has_in_flight(&self, key: &str) -> bool {
        self.in_flight.contains_key(key)
    }

    /// Records a request id key as in flight.
    pub fn add_in_flight(&mut self, key: String) {
        *self.in_flight.entry(key).or_insert(0) += 1;
    }

    /// Forgets an in-flight id key.
    pub fn remove_in_flight(&mut self, key: &str) {
        if let Some(n) = self.in_flight.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(key);
            }
        }
    }

    /// Requests queued or running for this connection.
    pub fn in_flight(&self) -> usize {
        self.in_flight.values().map(|&n| n as usize).sum()
    }

    /// True when the transport should close the connection now: killed, or
    /// draining with nothing in flight and nothing left to send.
    pub fn should_close(&self) -> bool {
        match self.state {
            ConnState::Open => false,
            ConnState::Killed => true,
            ConnState::Draining => self.in_flight.is_empty() && self.out.is_empty(),
        }
    }
}
