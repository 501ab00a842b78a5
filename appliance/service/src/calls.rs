//! Tool calls in a chat answer: the answer text of a request with `tools`
//! goes through kore-grammar's streaming [`ToolCallParser`], which splits it
//! into the text before the calls and the calls themselves (name and typed
//! arguments), streamed as [`CallDelta`] pieces that concatenate to the
//! `done` event's [`CallOut`]s.

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use kore_grammar::{Event, ToolCallParser, ToolSet};
use kore_protocol::{CallDelta, CallOut};

/// The tool-call state of one request.
#[derive(Debug)]
pub struct Calls {
    parser: Option<ToolCallParser>,
    prefix: String,
    calls: Vec<CallOut>,
    pending: Vec<CallDelta<'static>>,
    error: Option<String>,
}

impl Calls {
    /// Parses calls of `tools`; call ids are `{prefix}{index}`.
    pub fn new(tools: ToolSet, prefix: String) -> Self {
        let parser = Some(ToolCallParser::new(tools));
        Calls { parser, prefix, calls: Vec::new(), pending: Vec::new(), error: None }
    }

    /// Takes answer text; returns the part of it that is plain text.
    pub fn push(&mut self, text: &str) -> String {
        let Some(p) = self.parser.as_mut() else { return String::new() };
        match p.push(text) {
            Ok(events) => self.absorb(events),
            Err(e) => {
                self.error = Some(format!("{e}"));
                self.parser = None;
                String::new()
            }
        }
    }

    /// The end of the answer: returns the plain text still held back. A call
    /// left unfinished (the answer was cut off) is dropped and remembered in
    /// [`Calls::error`].
    pub fn finish(&mut self) -> String {
        let Some(p) = self.parser.take() else { return String::new() };
        match p.finish() {
            Ok(events) => self.absorb(events),
            Err(e) => {
                self.error = Some(format!("{e}"));
                String::new()
            }
        }
    }

    fn absorb(&mut self, events: Vec<Event>) -> String {
        let mut text = String::new();
        for e in events {
            match e {
                Event::Text(t) => text.push_str(&t),
                Event::CallStart { index, name } => self.pending.push(CallDelta {
                    index: index as u32,
                    id: Some(Cow::Owned(format!("{}{index}", self.prefix))),
                    name: Some(Cow::Owned(name)),
                    arguments: Cow::Borrowed(""),
                }),
                Event::Arguments { index, fragment } => match self.pending.last_mut() {
                    Some(d) if d.index == index as u32 => d.arguments.to_mut().push_str(&fragment),
                    _ => self.pending.push(CallDelta {
                        index: index as u32,
                        id: None,
                        name: None,
                        arguments: Cow::Owned(fragment),
                    }),
                },
                Event::CallEnd { index, call } => self.calls.push(CallOut {
                    id: format!("{}{index}", self.prefix),
                    name: call.name,
                    arguments: call.arguments.to_compact_json(),
                }),
            }
        }
        text
    }

    /// Takes the call pieces produced since the last call.
    pub fn take_pending(&mut self) -> Vec<CallDelta<'static>> {
        core::mem::take(&mut self.pending)
    }

    /// The complete calls so far.
    pub fn calls(&self) -> &[CallOut] {
        &self.calls
    }

    /// Why the calls did not parse (only possible for an answer cut off by
    /// `max_tokens` or a cancel: the grammar allows nothing else).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}
