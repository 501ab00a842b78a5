//! The OpenAI shapes of tool calls and log-probabilities: the protocol's
//! `done.tool_calls`, `tool_call` deltas and `done.logprobs` as
//! `message.tool_calls`, `delta.tool_calls` and `logprobs` (chat's
//! `{"content": [...]}` and completions' legacy lists).

use kore_protocol::{CallDelta, CallOut, TokenLogprob};
use serde_json::{json, Map, Value};

use super::wire::{AnswerToolCall, CallFunction, ChunkFunction, ChunkToolCall};

/// `message.tool_calls` of an answer.
pub fn answer_calls(calls: &[CallOut]) -> Vec<AnswerToolCall> {
    calls
        .iter()
        .map(|c| AnswerToolCall {
            id: c.id.clone(),
            kind: "function",
            function: CallFunction { name: c.name.clone(), arguments: c.arguments.clone() },
        })
        .collect()
}

/// `delta.tool_calls` of a streamed piece.
pub fn chunk_call(d: &CallDelta<'_>) -> ChunkToolCall {
    ChunkToolCall {
        index: d.index,
        id: d.id.as_ref().map(|i| i.to_string()),
        kind: d.id.as_ref().map(|_| "function"),
        function: ChunkFunction {
            name: d.name.as_ref().map(|n| n.to_string()),
            arguments: d.arguments.to_string(),
        },
    }
}

fn entry(token: &str, logprob: f32, bytes: &[u8]) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("token".into(), Value::from(token));
    m.insert("logprob".into(), Value::from(f64::from(logprob)));
    m.insert("bytes".into(), Value::from(bytes.to_vec()));
    m
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat_logprobs(list: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = list
        .iter()
        .map(|t| {
            let mut m = entry(&t.token, t.logprob, &t.bytes);
            let top: Vec<Value> =
                t.top.iter().map(|a| Value::Object(entry(&a.token, a.logprob, &a.bytes))).collect();
            m.insert("top_logprobs".into(), Value::Array(top));
            Value::Object(m)
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// Completions' `logprobs`: `tokens`, `token_logprobs`, `top_logprobs` (one
/// map per token) and `text_offset` (byte offsets into the text, the first
/// token's at `offset`: a streamed chunk's tokens follow earlier chunks').
pub fn completion_logprobs(list: &[TokenLogprob], mut offset: usize) -> Value {
    let mut offsets = Vec::with_capacity(list.len());
    for t in list {
        offsets.push(offset);
        offset += t.token.len();
    }
    let tops: Vec<Value> = list
        .iter()
        .map(|t| {
            let m: Map<String, Value> = t
                .top
                .iter()
                .map(|a| (a.token.clone(), Value::from(f64::from(a.logprob))))
                .collect();
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": list.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": list.iter().map(|t| f64::from(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}
