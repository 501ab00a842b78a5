//! A relay's updates as Anthropic's server-sent events: `message_start`,
//! per block `content_block_start`, `content_block_delta` (`text_delta`,
//! `thinking_delta`, `input_json_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`; a failure is an
//! `error` event. The blocks follow [`super::answer`]'s rules, so the
//! events accumulate to the non-streamed message.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use futures_util::Stream;
use kore_protocol::{CallDelta, Phase};
use serde_json::{json, Value};

use super::answer::{stop_reason, stop_sequence, usage, Naming};
use super::error::body as error_body;
use crate::client::{Delta, Done};
use crate::serve::error::ApiError;
use crate::serve::metrics::InFlight;
use crate::serve::relay::{Relay, Update};

/// One event: its `event:` name and `data:` JSON.
pub type Named = (&'static str, String);

/// The open content block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    Tool(u32),
}

/// Turns updates into events.
#[derive(Debug)]
pub struct Events {
    naming: Naming,
    started: bool,
    open: Option<(Open, usize)>,
    blocks: usize,
    text_opened: bool,
    /// Answer text held back while it is only white space (dropped if
    /// calls follow, as [`super::answer::keeps_text`]).
    pending: String,
    /// Set once `message_stop` (or `error`) is queued.
    pub ended: bool,
}

impl Events {
    /// A stream that has sent nothing yet.
    pub fn new(naming: Naming) -> Self {
        Events {
            naming,
            started: false,
            open: None,
            blocks: 0,
            text_opened: false,
            pending: String::new(),
            ended: false,
        }
    }

    /// The events for one update (`None`: the relay ended without one).
    pub fn on_update(&mut self, update: Option<Update>) -> Vec<Named> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let message = self.naming.message(Vec::new());
            out.push(event("message_start", json!({"type": "message_start", "message": message})));
        }
        match update {
            Some(Update::Delta(d)) => self.delta(&d, &mut out),
            Some(Update::Done(d)) => self.finish(&d, &mut out),
            Some(Update::Failed(e)) => self.fail(&e, &mut out),
            None => {
                self.fail(&ApiError::unavailable("the relay ended without an answer"), &mut out)
            }
        }
        out
    }

    fn delta(&mut self, d: &Delta, out: &mut Vec<Named>) {
        match (&d.tool_call, d.phase) {
            (Some(c), _) => self.call(c, out),
            (None, _) if d.delta.is_empty() => {}
            (None, Phase::Thinking) => {
                if !self.is_open(Open::Thinking) {
                    let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                    self.start(Open::Thinking, block, out);
                }
                self.push_delta(json!({"type": "thinking_delta", "thinking": d.delta}), out);
            }
            (None, Phase::Answer) => self.text(&d.delta, out),
        }
    }

    fn text(&mut self, s: &str, out: &mut Vec<Named>) {
        if !self.is_open(Open::Text) {
            self.pending.push_str(s);
            if self.pending.trim().is_empty() {
                return;
            }
            self.start(Open::Text, json!({"type": "text", "text": ""}), out);
            self.text_opened = true;
            let text = std::mem::take(&mut self.pending);
            self.push_delta(json!({"type": "text_delta", "text": text}), out);
            return;
        }
        self.push_delta(json!({"type": "text_delta", "text": s}), out);
    }

    fn call(&mut self, c: &CallDelta<'_>, out: &mut Vec<Named>) {
        self.pending.clear();
        if !self.is_open(Open::Tool(c.index)) {
            let block = json!({
                "type": "tool_use",
                "id": self.naming.tool_id(c.index as usize),
                "name": c.name.as_deref().unwrap_or_default(),
                "input": {},
            });
            self.start(Open::Tool(c.index), block, out);
        }
        if !c.arguments.is_empty() {
            self.push_delta(json!({"type": "input_json_delta", "partial_json": c.arguments}), out);
        }
    }

    fn finish(&mut self, done: &Done, out: &mut Vec<Named>) {
        if done.tool_calls.is_empty() && !self.text_opened {
            // A message always has a text block (answer.rs): maybe empty.
            self.start(Open::Text, json!({"type": "text", "text": ""}), out);
            let text = std::mem::take(&mut self.pending);
            if !text.is_empty() {
                self.push_delta(json!({"type": "text_delta", "text": text}), out);
            }
        }
        self.stop_block(out);
        let u = usage(&done.stats);
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(&self.naming, done),
                      "stop_sequence": stop_sequence(done)},
            "usage": u,
        });
        out.push(event("message_delta", delta));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        self.ended = true;
    }

    fn fail(&mut self, e: &ApiError, out: &mut Vec<Named>) {
        out.push(event("error", error_body(e)));
        self.ended = true;
    }

    fn is_open(&self, kind: Open) -> bool {
        self.open.is_some_and(|(k, _)| k == kind)
    }

    fn start(&mut self, kind: Open, block: Value, out: &mut Vec<Named>) {
        self.stop_block(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((kind, index));
        let data = json!({"type": "content_block_start", "index": index, "content_block": block});
        out.push(event("content_block_start", data));
    }

    fn push_delta(&self, delta: Value, out: &mut Vec<Named>) {
        let index = self.open.map_or(0, |(_, i)| i);
        let data = json!({"type": "content_block_delta", "index": index, "delta": delta});
        out.push(event("content_block_delta", data));
    }

    fn stop_block(&mut self, out: &mut Vec<Named>) {
        if let Some((_, index)) = self.open.take() {
            let data = json!({"type": "content_block_stop", "index": index});
            out.push(event("content_block_stop", data));
        }
    }
}

fn event(name: &'static str, data: Value) -> Named {
    (name, data.to_string())
}

impl crate::serve::stream::Events for Events {
    fn events(&mut self, update: Option<Update>) -> Vec<Event> {
        let named = self.on_update(update);
        named.into_iter().map(|(name, data)| Event::default().event(name).data(data)).collect()
    }

    fn ended(&self) -> bool {
        self.ended
    }
}

/// Anthropic's event stream for `relay` (`first`: an update already taken from it).
pub fn sse(
    relay: Relay,
    first: Option<Update>,
    naming: Naming,
    in_flight: InFlight,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    crate::serve::stream::pump(relay, first, Events::new(naming), in_flight)
}
