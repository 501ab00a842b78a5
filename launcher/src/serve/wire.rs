//! The OpenAI HTTP API's wire types (the subset `serve` speaks): request
//! bodies of `/v1/chat/completions` and `/v1/completions`, their answers,
//! stream chunks, `/v1/models` and the error body. Unknown request fields that
//! change nothing (`user`, `metadata`, ...) are accepted and ignored, as
//! OpenAI-compatible servers do; the fields that would change the answer are
//! read, and refused with a 400 where `serve` cannot honour their value (see
//! [`super::mapping`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

/// The body of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatRequest {
    /// The model's name (as `/v1/models` lists it).
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Sampling and length options shared with completions.
    #[serde(flatten)]
    pub options: Options,
    /// Template switches; `enable_thinking` turns thinking on or off.
    #[serde(default)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// Thinking on or off (Kore's own spelling of the same switch).
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

/// `chat_template_kwargs`, as vLLM and llama-server accept it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateKwargs {
    /// Thinking on or off.
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// A string, a list of text parts, or null (an assistant turn).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant's earlier reasoning.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// An assistant's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// One call of an assistant message (request side).
#[derive(Debug, Clone, Deserialize)]
pub struct MessageToolCall {
    /// The call's id.
    #[serde(default)]
    pub id: Option<String>,
    /// Its function (`{"name", "arguments"}`).
    #[serde(default)]
    pub function: Option<CallFunction>,
    /// The name, in the bare form `{"name", "arguments"}` (transformers'
    /// templates accept both).
    #[serde(default)]
    pub name: Option<String>,
    /// The arguments' JSON text, in the bare form.
    #[serde(default)]
    pub arguments: Option<String>,
}

/// `{"name", "arguments"}` of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallFunction {
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object's text.
    #[serde(default)]
    pub arguments: String,
}

/// One call of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnswerToolCall {
    /// `call_...`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The call.
    pub function: CallFunction,
}

/// One piece of a streamed call (`delta.tool_calls[]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkToolCall {
    /// Which call.
    pub index: u32,
    /// Set on a call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` on a call's first piece.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first piece) and more of the arguments.
    pub function: ChunkFunction,
}

/// The function part of a streamed call piece.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkFunction {
    /// Set on a call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More argument text.
    pub arguments: String,
}

/// The fields of a body whose key order matters (the template prints tools
/// as written; a schema's properties are generated in its order), read
/// from the body text a second time (`serde_json`'s maps sort keys).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Ordered {
    /// `tools`, as written.
    #[serde(default)]
    pub tools: Option<kore_protocol::RawJson>,
    /// `response_format`, its schema as written.
    #[serde(default)]
    pub response_format: Option<kore_protocol::ResponseFormat>,
}

/// Message content: text, or a list of parts of which only text is served.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": ...}, ...]`.
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (other kinds are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// The body of `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The model's name.
    pub model: String,
    /// Text, one text in a list, or token ids.
    pub prompt: Value,
    /// Sampling and length options.
    #[serde(flatten)]
    pub options: Options,
    /// Echo the prompt (not served: must be false).
    #[serde(default)]
    pub echo: Option<bool>,
}

/// Options both endpoints take.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Options {
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage`: a last chunk with the usage.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Generated tokens at most (older name).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Generated tokens at most (newer name; wins over `max_tokens`).
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature; absent or 0 is greedy.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus threshold.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Keep the K most likely tokens (0 off).
    #[serde(default)]
    pub top_k: Option<u64>,
    /// Drop tokens below this fraction of the top one's probability.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// Random stream of the request.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<OneOrMany>,
    /// Choices wanted (only 1 is served).
    #[serde(default)]
    pub n: Option<u64>,
    /// Fields that would change the answer and are not served yet: a value
    /// other than their default is refused with a 400 naming them.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// See `presence_penalty`.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// See `presence_penalty` (vLLM's and llama-server's extension).
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    /// See `presence_penalty`.
    #[serde(default)]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// See `presence_penalty` (a bool on chat, a number on completions).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// See `presence_penalty`.
    #[serde(default)]
    pub top_logprobs: Option<u64>,
    /// See `presence_penalty`.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// See `presence_penalty` (the legacy name of `tools`).
    #[serde(default)]
    pub functions: Option<Vec<Value>>,
    /// `auto`, `none`, `required` or a named function.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Several calls in one answer (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// See `presence_penalty` (completions).
    #[serde(default)]
    pub suffix: Option<String>,
    /// See `presence_penalty` (completions).
    #[serde(default)]
    pub best_of: Option<u64>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk carrying `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Token counts of a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// The sum.
    pub total_tokens: u64,
    /// `cached_tokens`: prompt tokens served from kept state.
    pub prompt_tokens_details: PromptDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptDetails {
    /// Prompt tokens served from kept state (0 without sessions).
    pub cached_tokens: u64,
}

/// The assistant message of a chat answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnswerMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The answer text (null when the answer is only calls).
    pub content: Option<String>,
    /// The thinking text, when the model thought.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls, when the model made any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<AnswerToolCall>,
}

/// One choice of a non-streamed chat answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The message.
    pub message: AnswerMessage,
    /// Log-probabilities (`{"content": [...]}`) when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
}

/// One choice of a completion (streamed or not).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextChoice {
    /// Always 0.
    pub index: u32,
    /// The generated text (a piece of it in a chunk).
    pub text: String,
    /// Log-probabilities in the legacy completions shape, when asked.
    pub logprobs: Option<Value>,
    /// Set on the last chunk / the answer.
    pub finish_reason: Option<String>,
}

/// A streamed chat delta.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChunkDelta {
    /// `assistant` on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// Answer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Thinking text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Pieces of calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ChunkToolCall>>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice {
    /// Always 0.
    pub index: u32,
    /// The delta.
    pub delta: ChunkDelta,
    /// Log-probabilities (on the last chunk: all of them), when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Set on the last chunk.
    pub finish_reason: Option<String>,
}

/// An answer or stream chunk: `object` says which; `choices` holds
/// [`ChatChoice`], [`ChunkChoice`] or [`TextChoice`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer<C> {
    /// `chatcmpl-...` or `cmpl-...`, the same in every chunk of a stream.
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix time of the request.
    pub created: u64,
    /// The model's name.
    pub model: String,
    /// The choices (empty in a usage-only chunk).
    pub choices: Vec<C>,
    /// Token counts (answers, and the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Kore's measurements (the protocol's `stats`) on answers and last chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kore_stats: Option<kore_protocol::Stats>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// One model of the list.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// Its name.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// When the server started.
    pub created: u64,
    /// Always `kore`.
    pub owned_by: &'static str,
    /// Context limit in tokens (as llama-server's and vLLM's `max_model_len`).
    pub max_model_len: u64,
}

/// OpenAI's error body: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The inside of an error body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    /// What went wrong and what to do.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`, ...
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The offending parameter, when one is.
    pub param: Option<String>,
    /// A stable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<String>,
}
