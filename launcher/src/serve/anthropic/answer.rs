//! The protocol's `done` event as an Anthropic message: content blocks
//! (thinking, text, tool_use), `stop_reason`, `stop_sequence` and `usage`.
//! The stream ([`super::stream`]) uses the same pieces, so a streamed answer
//! accumulates to the whole one.

use kore_protocol::{Finish, RawJson, Stats};

use super::wire::{AnswerUsage, MessageAnswer, OutBlock};
use crate::client::Done;
use crate::serve::error::ApiError;

/// Names an answer: `msg_...` and the model.
#[derive(Debug, Clone)]
pub struct Naming {
    /// `msg_...`.
    pub id: String,
    /// The model's name.
    pub model: String,
    /// The request's `max_tokens` (tells `max_tokens` from a full context).
    pub max_tokens: u32,
}

impl Naming {
    /// The id of call `index`: `toolu_` + this message's id + the index
    /// (unique per server run, unlike the protocol's per-connection ids).
    pub fn tool_id(&self, index: usize) -> String {
        format!("toolu_{}_{index}", self.id.trim_start_matches("msg_"))
    }

    /// A message with `content` and no stop yet (`message_start`'s).
    pub fn message(&self, content: Vec<OutBlock>) -> MessageAnswer {
        MessageAnswer {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content,
            stop_reason: None,
            stop_sequence: None,
            usage: AnswerUsage::default(),
        }
    }
}

/// The non-streamed answer.
pub fn answer(n: &Naming, done: &Done) -> Result<MessageAnswer, ApiError> {
    let mut content = Vec::new();
    if let Some(t) = done.thinking.as_deref().filter(|t| !t.is_empty()) {
        content.push(OutBlock::Thinking { thinking: t.to_owned(), signature: String::new() });
    }
    if keeps_text(&done.text, !done.tool_calls.is_empty()) {
        content.push(OutBlock::Text { text: done.text.to_string() });
    }
    for (i, c) in done.tool_calls.iter().enumerate() {
        content.push(OutBlock::ToolUse {
            id: n.tool_id(i),
            name: c.name.clone(),
            input: input(&c.arguments)?,
        });
    }
    let mut m = n.message(content);
    m.stop_reason = Some(stop_reason(n, done));
    m.stop_sequence = stop_sequence(done);
    m.usage = usage(&done.stats);
    Ok(m)
}

/// Whether the answer has a text block: always without calls (a message
/// is never empty), and with calls unless the text is only white space.
pub fn keeps_text(text: &str, calls: bool) -> bool {
    !calls || !text.trim().is_empty()
}

/// A call's arguments as a `tool_use` block's `input` (checked JSON, in
/// the order generated).
pub fn input(arguments: &str) -> Result<RawJson, ApiError> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    match serde_json::from_str::<&serde_json::value::RawValue>(text) {
        Ok(_) if text.trim_start().starts_with('{') => Ok(RawJson(text.to_owned())),
        _ => Err(ApiError::internal(format!(
            "the appliance returned call arguments that are not a JSON object: {arguments}"
        ))),
    }
}

/// `stop_reason`.
pub fn stop_reason(n: &Naming, done: &Done) -> &'static str {
    match done.finish {
        _ if !done.tool_calls.is_empty() => "tool_use",
        Finish::Length if done.stats.generated_tokens < n.max_tokens => {
            "model_context_window_exceeded"
        }
        Finish::Length => "max_tokens",
        Finish::Stop if done.stop_sequence.is_some() => "stop_sequence",
        Finish::Stop | Finish::Cancelled => "end_turn",
    }
}

/// `stop_sequence`.
pub fn stop_sequence(done: &Done) -> Option<String> {
    done.stop_sequence.as_deref().map(str::to_owned).filter(|_| done.tool_calls.is_empty())
}

/// `usage`: prompt tokens split into uncached and cache-read, as Anthropic
/// counts them.
pub fn usage(stats: &Stats) -> AnswerUsage {
    let cached = u64::from(stats.cached_tokens.min(stats.prompt_tokens));
    AnswerUsage {
        input_tokens: u64::from(stats.prompt_tokens) - cached,
        output_tokens: u64::from(stats.generated_tokens),
        cache_read_input_tokens: cached,
    }
}
