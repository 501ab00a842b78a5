//! The wire types of Anthropic's Messages API (`POST /v1/messages`) as
//! `serve` speaks it: the request body, the answer and its blocks. Fields
//! whose JSON key order matters (a tool's `input_schema`, a `tool_use`
//! block's `input`) and fields of several shapes (`system`, a message's
//! `content`) are kept as raw JSON text and read in [`super::mapping`].
//! Unknown fields are accepted and ignored; the ones that would change the
//! answer are read so that they can be refused by name.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use kore_protocol::RawJson;

/// The body of `POST /v1/messages`.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// The model's name (as `/v1/models` lists it).
    pub model: String,
    /// The conversation: user and assistant turns.
    pub messages: Vec<InMessage>,
    /// Instructions: a string or a list of text blocks.
    #[serde(default)]
    pub system: Option<Box<RawValue>>,
    /// Generated tokens at most (required).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Sampling temperature (Anthropic's default is 1.0).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus threshold.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Keep the K most likely tokens.
    #[serde(default)]
    pub top_k: Option<u64>,
    /// Strings that end the answer.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// Client tools.
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    /// `{"type": "auto" | "any" | "tool" | "none", ...}`.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
    #[serde(default)]
    pub thinking: Option<Thinking>,
    /// Kore's extension: the random stream of a sampled request.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Fields that would change the answer and are not served: present and
    /// not null, they are refused with a 400 naming them.
    #[serde(default)]
    pub container: Option<Value>,
    /// See `container`.
    #[serde(default)]
    pub mcp_servers: Option<Value>,
    /// See `container`.
    #[serde(default)]
    pub context_management: Option<Value>,
    /// `{"format": {"type": "json_schema", "schema": ...}}`: the answer is
    /// JSON valid under the schema; `effort` is not served.
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    /// The older spelling of `output_config.format`.
    #[serde(default)]
    pub output_format: Option<OutputFormat>,
}

/// `output_config`.
#[derive(Debug, Deserialize)]
pub struct OutputConfig {
    /// How hard the model tries (not served: refused unless null).
    #[serde(default)]
    pub effort: Option<Value>,
    /// The answer's format.
    #[serde(default)]
    pub format: Option<OutputFormat>,
}

/// `output_config.format`: `{"type": "json_schema", "schema": ...}`.
#[derive(Debug, Deserialize)]
pub struct OutputFormat {
    /// Only `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The JSON Schema, as written.
    #[serde(default)]
    pub schema: Option<Box<RawValue>>,
}

/// One turn of `messages`.
#[derive(Debug, Deserialize)]
pub struct InMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or a list of content blocks.
    pub content: Box<RawValue>,
}

/// One content block of a request (the fields of every served kind).
#[derive(Debug, Deserialize)]
pub struct InBlock {
    /// `text`, `tool_use`, `tool_result`, `thinking`, `redacted_thinking`
    /// (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// A `text` block's text.
    #[serde(default)]
    pub text: Option<String>,
    /// A `thinking` block's text.
    #[serde(default)]
    pub thinking: Option<String>,
    /// A `tool_use` block's id.
    #[serde(default)]
    pub id: Option<String>,
    /// A `tool_use` block's tool.
    #[serde(default)]
    pub name: Option<String>,
    /// A `tool_use` block's arguments object, as written.
    #[serde(default)]
    pub input: Option<Box<RawValue>>,
    /// The call a `tool_result` block answers.
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// A `tool_result` block's content: a string or text blocks.
    #[serde(default)]
    pub content: Option<Box<RawValue>>,
    /// Whether the tool failed.
    #[serde(default)]
    pub is_error: Option<bool>,
}

/// One client tool.
#[derive(Debug, Deserialize)]
pub struct Tool {
    /// Absent or `custom` for client tools; Anthropic's server tools
    /// (`web_search_...`, `bash_...`) are refused.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The tool's name.
    #[serde(default)]
    pub name: Option<String>,
    /// What it does.
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON Schema of its input, as written.
    #[serde(default)]
    pub input_schema: Option<Box<RawValue>>,
    /// Constrain the call to the schema (Kore always does).
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`.
#[derive(Debug, Deserialize)]
pub struct ToolChoice {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool of `tool`.
    #[serde(default)]
    pub name: Option<String>,
    /// At most one call.
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`.
#[derive(Debug, Deserialize)]
pub struct Thinking {
    /// `enabled`, `adaptive`, `between_tools` or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Thinking tokens at most (required with `enabled`, as Anthropic's
    /// API; only `max_tokens` bounds the thinking here).
    #[serde(default)]
    pub budget_tokens: Option<u64>,
}

/// The answer of `POST /v1/messages` (also `message_start`'s message).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageAnswer {
    /// `msg_...`.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    /// The model's name.
    pub model: String,
    /// Thinking, text and tool-use blocks, in that order.
    pub content: Vec<OutBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence`, `tool_use` or
    /// `model_context_window_exceeded` (null in `message_start`).
    pub stop_reason: Option<&'static str>,
    /// The stop sequence that ended the answer.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: AnswerUsage,
}

/// One content block of an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutBlock {
    /// The model's thinking (`signature` is empty: nothing to verify here).
    Thinking {
        /// The text.
        thinking: String,
        /// Always empty.
        signature: String,
    },
    /// Answer text.
    Text {
        /// The text.
        text: String,
    },
    /// A call.
    ToolUse {
        /// `toolu_...`.
        id: String,
        /// The tool.
        name: String,
        /// The arguments object, in the order generated (checked JSON).
        input: RawJson,
    },
}

/// `usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AnswerUsage {
    /// Prompt tokens not served from the prefix cache.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cache_read_input_tokens: u64,
}
