//! Streamed answers: a relay's updates as OpenAI server-sent events
//! (`chat.completion.chunk` or `text_completion` chunks, an optional usage
//! chunk, then `data: [DONE]`). Dropping the stream (the client went away)
//! drops the relay, which cancels the generation.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;

use super::error::ApiError;
use super::mapping::{finish_reason, usage, Envelope};
use super::metrics::InFlight;
use super::relay::{Relay, Update};
use super::tools::{chat_logprobs, chunk_call, completion_logprobs};
use super::wire::{ChunkChoice, ChunkDelta, TextChoice};
use crate::client::{Delta, Done};
use kore_protocol::{Phase, TokenLogprob};

/// Keep-alive comments while no token flows (also how a vanished client is
/// noticed while its request waits in the queue).
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Which endpoint's chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `chat.completion.chunk`.
    Chat,
    /// `text_completion`.
    Completion,
}

/// What a stream sends.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Id, time and model of every chunk.
    pub env: Envelope,
    /// The endpoint.
    pub kind: Kind,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
}

/// What turns a relay's updates into server-sent events: OpenAI's chunks
/// ([`Chunks`]) or Anthropic's events (`anthropic::stream`).
pub trait Events: Send + 'static {
    /// The events for one update (`None`: the relay ended without one).
    fn events(&mut self, update: Option<Update>) -> Vec<Event>;
    /// Whether the last event has been given.
    fn ended(&self) -> bool;
}

/// The SSE response for `relay` (`first`: an update already taken from it),
/// its updates turned into events by `events`; `in_flight` counts it until
/// the stream is dropped.
pub fn pump<E: Events>(
    relay: Relay,
    first: Option<Update>,
    events: E,
    in_flight: InFlight,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let state = Streaming { relay, first, events, pending: VecDeque::new(), _in_flight: in_flight };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.pending.pop_front() {
                return Some((Ok(event), st));
            }
            if st.events.ended() {
                return None;
            }
            let update = match st.first.take() {
                Some(u) => Some(u),
                None => st.relay.next().await,
            };
            st.pending.extend(st.events.events(update));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// OpenAI's stream of `plan`'s chunks for `relay`.
pub fn sse(
    relay: Relay,
    first: Option<Update>,
    plan: Plan,
    in_flight: InFlight,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    pump(relay, first, Chunks::new(plan), in_flight)
}

struct Streaming<E> {
    relay: Relay,
    first: Option<Update>,
    events: E,
    pending: VecDeque<Event>,
    _in_flight: InFlight,
}

impl Events for Chunks {
    fn events(&mut self, update: Option<Update>) -> Vec<Event> {
        self.on_update(update).into_iter().map(|data| Event::default().data(data)).collect()
    }

    fn ended(&self) -> bool {
        self.ended
    }
}

/// Turns updates into the `data:` payloads of the stream.
#[derive(Debug)]
pub struct Chunks {
    plan: Plan,
    started: bool,
    /// Tokens whose log-probabilities earlier chunks carried, and the
    /// bytes of their text (completions' `text_offset` goes on from it).
    logprobs_sent: usize,
    logprobs_bytes: usize,
    /// Set once `[DONE]` is queued.
    pub ended: bool,
}

impl Chunks {
    /// A stream that has sent nothing yet.
    pub fn new(plan: Plan) -> Self {
        Self { plan, started: false, logprobs_sent: 0, logprobs_bytes: 0, ended: false }
    }

    /// The payloads for one update (`None`: the relay ended without one).
    pub fn on_update(&mut self, update: Option<Update>) -> Vec<String> {
        let mut out = Vec::new();
        if !self.started && self.plan.kind == Kind::Chat {
            let role = ChunkDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            };
            out.push(self.chat_chunk(role, None, None));
        }
        self.started = true;
        match update {
            Some(Update::Delta(d)) => out.push(self.delta(&d)),
            Some(Update::Done(d)) => self.finish(&d, &mut out),
            Some(Update::Failed(e)) => self.fail(&e, &mut out),
            None => {
                self.fail(&ApiError::unavailable("the relay ended without an answer"), &mut out)
            }
        }
        out
    }

    fn delta(&mut self, d: &Delta) -> String {
        let logprobs = d.logprobs.as_deref().map(|l| self.logprobs_chunk(l));
        match self.plan.kind {
            Kind::Chat => {
                let mut delta = ChunkDelta::default();
                match (&d.tool_call, d.phase) {
                    (Some(c), _) => delta.tool_calls = Some(vec![chunk_call(c)]),
                    (None, Phase::Thinking) => delta.reasoning_content = Some(d.delta.to_string()),
                    (None, Phase::Answer) => delta.content = Some(d.delta.to_string()),
                }
                self.chat_chunk(delta, None, logprobs)
            }
            Kind::Completion => self.text_chunk(d.delta.to_string(), None, None, logprobs),
        }
    }

    /// `list` (the tokens after those already sent) in the endpoint's shape.
    fn logprobs_chunk(&mut self, list: &[TokenLogprob]) -> serde_json::Value {
        let value = match self.plan.kind {
            Kind::Chat => chat_logprobs(list),
            Kind::Completion => completion_logprobs(list, self.logprobs_bytes),
        };
        self.logprobs_sent += list.len();
        self.logprobs_bytes += list.iter().map(|t| t.token.len()).sum::<usize>();
        value
    }

    /// The log-probabilities no delta carried (`None` when the request
    /// wanted none, or the deltas carried them all).
    fn unsent_logprobs(&mut self, done: &Done) -> Option<serde_json::Value> {
        let list = done.logprobs.as_deref()?;
        let rest = &list[self.logprobs_sent.min(list.len())..];
        if rest.is_empty() && self.logprobs_sent > 0 {
            return None;
        }
        Some(self.logprobs_chunk(rest))
    }

    fn finish(&mut self, done: &Done, out: &mut Vec<String>) {
        let reason = Some(finish_reason(done.finish, !done.tool_calls.is_empty()));
        let stats = Some(done.stats.clone().into_owned());
        let logprobs = self.unsent_logprobs(done);
        out.push(match self.plan.kind {
            Kind::Chat => {
                let mut a = self.plan.env.answer(
                    "chat.completion.chunk",
                    vec![ChunkChoice {
                        index: 0,
                        delta: ChunkDelta::default(),
                        logprobs,
                        finish_reason: reason,
                    }],
                );
                a.kore_stats = stats;
                to_json(&a)
            }
            Kind::Completion => self.text_chunk(String::new(), reason, stats, logprobs),
        });
        if self.plan.include_usage {
            let object = match self.plan.kind {
                Kind::Chat => "chat.completion.chunk",
                Kind::Completion => "text_completion",
            };
            let mut a = self.plan.env.answer::<ChunkChoice>(object, Vec::new());
            a.usage = Some(usage(&done.stats));
            out.push(to_json(&a));
        }
        self.end(out);
    }

    fn fail(&mut self, e: &ApiError, out: &mut Vec<String>) {
        out.push(to_json(&e.body_json()));
        self.end(out);
    }

    fn end(&mut self, out: &mut Vec<String>) {
        out.push("[DONE]".into());
        self.ended = true;
    }

    fn chat_chunk(
        &self,
        delta: ChunkDelta,
        finish: Option<String>,
        logprobs: Option<serde_json::Value>,
    ) -> String {
        let choice = ChunkChoice { index: 0, delta, logprobs, finish_reason: finish };
        to_json(&self.plan.env.answer("chat.completion.chunk", vec![choice]))
    }

    fn text_chunk(
        &self,
        text: String,
        finish: Option<String>,
        stats: Option<kore_protocol::Stats>,
        logprobs: Option<serde_json::Value>,
    ) -> String {
        let choice = TextChoice { index: 0, text, logprobs, finish_reason: finish };
        let mut a = self.plan.env.answer("text_completion", vec![choice]);
        a.kore_stats = stats;
        to_json(&a)
    }
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":{{\"message\":\"{e}\"}}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kore_protocol::{Finish, Id, Stats};
    use serde_json::{json, Value};
    use std::borrow::Cow;

    fn delta(text: &str, phase: Phase) -> Update {
        Update::Delta(Delta {
            id: Cow::Owned(Id::from(1)),
            delta: text.to_owned().into(),
            phase,
            tool_call: None,
            logprobs: None,
        })
    }

    fn logprob(id: u32, token: &str) -> TokenLogprob {
        let bytes = token.as_bytes().to_vec();
        TokenLogprob { id, token: token.into(), bytes, logprob: -(id as f32), top: Vec::new() }
    }

    fn done(finish: Finish, text: &str, thinking: Option<&str>, prompt: u32, gen: u32) -> Done {
        let stats = Stats { prompt_tokens: prompt, generated_tokens: gen, ..Stats::default() };
        Done {
            id: Cow::Owned(Id::from(1)),
            done: true,
            finish,
            token_ids: Cow::Owned(vec![1; gen as usize]),
            text: text.to_owned().into(),
            thinking: thinking.map(|t| t.to_owned().into()),
            stats: Cow::Owned(stats),
            tool_calls: Cow::Owned(Vec::new()),
            logprobs: None,
            stop_sequence: None,
        }
    }

    fn chunks(kind: Kind, include_usage: bool) -> Chunks {
        let env = Envelope { id: "x-1".into(), created: 1, model: "m".into() };
        Chunks::new(Plan { env, kind, include_usage })
    }

    fn parse(data: &[String]) -> Vec<Value> {
        data.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect()
    }

    #[test]
    fn chat_chunks_start_with_the_role_and_split_thinking_from_answer() {
        let mut c = chunks(Kind::Chat, true);
        let first = parse(&c.on_update(Some(delta("hmm", Phase::Thinking))));
        assert_eq!(first[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(first[1]["choices"][0]["delta"], json!({"reasoning_content": "hmm"}));
        let next = parse(&c.on_update(Some(delta("Hi", Phase::Answer))));
        assert_eq!(next.len(), 1);
        assert_eq!(next[0]["choices"][0]["delta"], json!({"content": "Hi"}));
        let done = done(Finish::Stop, "Hi", Some("hmm"), 3, 2);
        let end = c.on_update(Some(Update::Done(done)));
        assert_eq!(end.last().map(String::as_str), Some("[DONE]"));
        let end = parse(&end);
        assert_eq!(end[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(end[1]["choices"], json!([]));
        assert_eq!(end[1]["usage"]["total_tokens"], 5);
        assert!(c.ended);
    }

    #[test]
    fn a_failure_mid_stream_is_an_error_event_then_done() {
        let mut c = chunks(Kind::Completion, false);
        assert_eq!(
            parse(&c.on_update(Some(delta("a", Phase::Answer))))[0]["choices"][0]["text"],
            "a"
        );
        let out = c.on_update(Some(Update::Failed(ApiError::unavailable("gone"))));
        assert_eq!(out.len(), 2);
        assert_eq!(parse(&out)[0]["error"]["message"], "gone");
        assert_eq!(out[1], "[DONE]");
        let mut lost = chunks(Kind::Completion, false);
        assert_eq!(parse(&lost.on_update(None))[0]["error"]["code"], "unavailable");
    }

    #[test]
    fn logprobs_ride_with_their_deltas_and_the_rest_with_the_last_chunk() {
        let all = vec![logprob(1, "Hi"), logprob(2, " there"), logprob(3, "!")];
        for kind in [Kind::Chat, Kind::Completion] {
            let mut c = chunks(kind, false);
            let mut first = delta("Hi there", Phase::Answer);
            if let Update::Delta(d) = &mut first {
                d.logprobs = Some(Cow::Owned(all[..2].to_vec()));
            }
            let mut got = parse(&c.on_update(Some(first)));
            let end = Done {
                logprobs: Some(Cow::Owned(all.clone())),
                ..done(Finish::Stop, "", None, 1, 3)
            };
            got.extend(parse(&c.on_update(Some(Update::Done(end)))));
            let lps: Vec<&Value> = got.iter().map(|v| &v["choices"][0]["logprobs"]).collect();
            let lps: Vec<&Value> = lps.into_iter().filter(|v| !v.is_null()).collect();
            assert_eq!(lps.len(), 2, "{kind:?}: {got:?}");
            match kind {
                Kind::Chat => {
                    let tokens: Vec<&Value> = lps
                        .iter()
                        .flat_map(|v| v["content"].as_array().unwrap())
                        .map(|t| &t["token"])
                        .collect();
                    assert_eq!(tokens, [&json!("Hi"), &json!(" there"), &json!("!")]);
                }
                Kind::Completion => {
                    assert_eq!(lps[0]["text_offset"], json!([0, 2]));
                    assert_eq!(lps[1]["tokens"], json!(["!"]));
                    assert_eq!(lps[1]["text_offset"], json!([8]));
                }
            }
        }
    }

    #[test]
    fn no_empty_logprobs_chunk_when_the_deltas_carried_all() {
        let mut c = chunks(Kind::Chat, false);
        let mut first = delta("Hi", Phase::Answer);
        if let Update::Delta(d) = &mut first {
            d.logprobs = Some(Cow::Owned(vec![logprob(1, "Hi")]));
        }
        c.on_update(Some(first));
        let end = Done {
            logprobs: Some(Cow::Owned(vec![logprob(1, "Hi")])),
            ..done(Finish::Stop, "Hi", None, 1, 1)
        };
        let end = parse(&c.on_update(Some(Update::Done(end))));
        assert!(end[0]["choices"][0]["logprobs"].is_null());
    }
}
