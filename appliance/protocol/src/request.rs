//! Request lines: [`Request`] and its parts, derived once for both sides. A
//! client builds them and writes [`Request::to_line`]; the service reads a
//! line with [`parse_line`], which checks every field (unknown fields,
//! types, ranges, exactly one input) and answers a [`LineError`] with a
//! stable code and a message that says what to fix. Nothing here panics on
//! any input.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::bench::BenchRequest;
use crate::error::{ErrorCode, LineError};
use crate::tools::{self, Choice, Format, MessageCall, RawJson, ResponseFormat, MAX_TOP_LOGPROBS};

/// Most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 8;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Largest accepted `mtp` draft count.
pub const MAX_MTP: u32 = 16;
/// Longest accepted session name in bytes.
pub const MAX_SESSION_BYTES: usize = 256;
/// Largest accepted `temperature`.
pub const MAX_TEMPERATURE: f32 = 1.0e6;

/// A request id as the client sent it (string or number), echoed verbatim;
/// `null` when the client gave none or it could not be read.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Id(pub Value);

impl Id {
    /// The id of lines whose id is missing or unreadable.
    pub const NULL: Id = Id(Value::Null);

    /// A canonical key for comparing ids (their JSON text).
    pub fn key(&self) -> String {
        self.0.to_string()
    }

    /// Whether this is the `null` id.
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
}

impl From<u64> for Id {
    fn from(n: u64) -> Self {
        Id(Value::from(n))
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id(Value::from(s))
    }
}

impl core::fmt::Display for Id {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Author of one chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the assistant.
    System,
    /// The person chatting.
    User,
    /// An earlier answer of the model.
    Assistant,
    /// A tool's result (the answer to an assistant's call).
    Tool,
}

impl Role {
    /// The role's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What was written (plain text; special-token text is not special here).
    #[serde(default)]
    pub content: String,
    /// An assistant's reasoning, kept apart from `content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant's calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<MessageCall>,
    /// The call a `tool` message answers (kept for clients; not rendered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// What to generate from (a view of a validated [`GenerateRequest`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Input<'a> {
    /// Chat messages rendered through the template.
    Messages(&'a [Message]),
    /// Raw completion of a text prompt (no template).
    Prompt(&'a str),
    /// Raw completion of token ids (no template).
    PromptIds(&'a [u32]),
}

/// A generation request. Absent options take the protocol's defaults:
/// greedy (`temperature` 0), `top_p` 1, `top_k` 0 and `min_p` 0 (off), seed
/// 0, thinking on, until the context is full.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// Echoed in every event of the request.
    #[serde(default, skip_serializing_if = "Id::is_null")]
    pub id: Id,
    /// Chat messages (exactly one of `messages`, `prompt`, `prompt_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message>>,
    /// A raw text prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Raw prompt token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Generated tokens at most (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Softmax temperature; 0 is greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k (0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Min-p in [0, 1] (0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Seed of the request's random stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Thinking on or off (chat only): `true`/`false`/`"on"`/`"off"`.
    #[serde(default, deserialize_with = "on_off", skip_serializing_if = "Option::is_none")]
    pub thinking: Option<bool>,
    /// Draft tokens per step (0 = drafting off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<u32>,
    /// Stop strings: a string or an array of strings.
    #[serde(default, deserialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Session whose kept state the request may continue (and then keeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// OpenAI `tools` (chat only): rendered into the prompt, and the model's
    /// calls come back as `tool_call` deltas and the `done` event's
    /// `tool_calls`, constrained to parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<RawJson>,
    /// `"auto"` (default), `"none"`, `"required"` or a named function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Several calls in one answer (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// `json_object` or `json_schema`: the output is constrained to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Report each generated token's log-probability and this many (at most
    /// 20) alternatives in the `done` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u8>,
    /// `"generate"` or absent (read from the line, never written).
    #[doc(hidden)]
    #[serde(default, skip_serializing)]
    pub op: Option<String>,
}

impl GenerateRequest {
    /// A chat request of `messages`.
    pub fn chat(messages: Vec<Message>) -> Self {
        GenerateRequest { messages: Some(messages), ..Self::default() }
    }

    /// A raw completion of `prompt`.
    pub fn completion(prompt: impl Into<String>) -> Self {
        GenerateRequest { prompt: Some(prompt.into()), ..Self::default() }
    }

    /// A raw completion of token ids.
    pub fn completion_ids(ids: Vec<u32>) -> Self {
        GenerateRequest { prompt_ids: Some(ids), ..Self::default() }
    }

    /// The input; `None` unless exactly one of the three is given.
    pub fn input(&self) -> Option<Input<'_>> {
        match (&self.messages, &self.prompt, &self.prompt_ids) {
            (Some(m), None, None) => Some(Input::Messages(m)),
            (None, Some(p), None) => Some(Input::Prompt(p)),
            (None, None, Some(ids)) => Some(Input::PromptIds(ids)),
            _ => None,
        }
    }

    /// Whether thinking is on (the default).
    pub fn thinking_on(&self) -> bool {
        self.thinking.unwrap_or(true)
    }

    /// Checks what serde's types cannot: one input, non-empty prompts, the
    /// ranges of the options. The message names the field.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_input()?;
        if self.max_tokens == Some(0) {
            return Err(String::from("\"max_tokens\" must be at least 1"));
        }
        range("temperature", self.temperature, 0.0, MAX_TEMPERATURE, true)?;
        range("top_p", self.top_p, 0.0, 1.0, false)?;
        range("min_p", self.min_p, 0.0, 1.0, true)?;
        if let Some(n) = self.mtp.filter(|&n| n > MAX_MTP) {
            return Err(format!("\"mtp\" is {n}; it must be an integer in 0..={MAX_MTP}"));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(format!("at most {MAX_STOP_STRINGS} stop strings"));
        }
        if self.stop.iter().any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES) {
            return Err(format!(
                "each stop string must be a non-empty string of at most {MAX_STOP_BYTES} bytes"
            ));
        }
        match &self.session {
            Some(s) if s.is_empty() || s.len() > MAX_SESSION_BYTES => {
                return Err(format!(
                    "\"session\" must be a non-empty string of at most {MAX_SESSION_BYTES} bytes"
                ))
            }
            _ => {}
        }
        self.validate_tools()
    }

    /// The checked `tool_choice` (`Auto` when absent).
    pub fn choice(&self) -> Result<Choice, String> {
        self.tool_choice.as_ref().map_or(Ok(Choice::Auto), tools::tool_choice)
    }

    fn validate_tools(&self) -> Result<(), String> {
        if let Some(n) = self.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(format!("\"logprobs\" is {n}; at most {MAX_TOP_LOGPROBS} alternatives"));
        }
        let chat = matches!(self.input(), Some(Input::Messages(_)));
        if let Some(t) = &self.tools {
            if !chat {
                return Err("\"tools\" apply only to chat \"messages\"".into());
            }
            if !matches!(t.value(), Ok(Value::Array(_))) {
                return Err("\"tools\" must be an array of tool objects".into());
            }
        }
        let choice = self.choice()?;
        if self.tools.is_none() && matches!(choice, Choice::Required | Choice::Named(_)) {
            return Err("\"tool_choice\" asks for a call but no \"tools\" are given".into());
        }
        let format = match &self.response_format {
            Some(f) => f.format()?,
            None => Format::Text,
        };
        let calls = self.tools.is_some() && choice != Choice::None;
        if calls && format != Format::Text {
            return Err("\"response_format\" cannot be combined with \"tools\" \
                        unless \"tool_choice\" is \"none\""
                .into());
        }
        if let Some(m) = &self.messages {
            for (i, msg) in m.iter().enumerate() {
                if !msg.tool_calls.is_empty() && msg.role != Role::Assistant {
                    return Err(format!("messages[{i}]: only assistant messages have tool_calls"));
                }
            }
        }
        Ok(())
    }

    fn validate_input(&self) -> Result<(), String> {
        let given: Vec<&str> = [
            ("messages", self.messages.is_some()),
            ("prompt", self.prompt.is_some()),
            ("prompt_ids", self.prompt_ids.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        match self.input() {
            Some(Input::Messages([])) => Err(String::from("\"messages\" must not be empty")),
            Some(Input::Prompt("")) => Err(String::from("\"prompt\" must not be empty")),
            Some(Input::PromptIds([])) => Err(String::from("\"prompt_ids\" must not be empty")),
            Some(Input::Messages(_)) => Ok(()),
            Some(_) if self.thinking.is_some() => Err(String::from(
                "\"thinking\" applies only to chat \"messages\", not to raw prompts",
            )),
            Some(_) => Ok(()),
            None if given.is_empty() => Err(String::from(
                "a request needs one of \"messages\", \"prompt\" or \"prompt_ids\"",
            )),
            None => Err(format!(
                "give only one of \"messages\", \"prompt\", \"prompt_ids\" (got {})",
                given.join(", ")
            )),
        }
    }
}

fn range(
    name: &str,
    v: Option<f32>,
    min: f32,
    max: f32,
    min_inclusive: bool,
) -> Result<(), String> {
    let Some(x) = v else { return Ok(()) };
    if x.is_finite() && x <= max && (x > min || (min_inclusive && x == min)) {
        return Ok(());
    }
    let open = if min_inclusive { '[' } else { '(' };
    Err(format!("\"{name}\" is {x}; it must be a number in {open}{min}, {max}]"))
}

/// `true`/`false`/`"on"`/`"off"` (or `null`).
fn on_off<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OnOff {
        Bool(bool),
        Word(String),
    }
    match Option::<OnOff>::deserialize(d)? {
        None => Ok(None),
        Some(OnOff::Bool(b)) => Ok(Some(b)),
        Some(OnOff::Word(w)) if w == "on" => Ok(Some(true)),
        Some(OnOff::Word(w)) if w == "off" => Ok(Some(false)),
        Some(_) => {
            Err(serde::de::Error::custom("\"thinking\" must be true, false, \"on\" or \"off\""))
        }
    }
}

/// A string or an array of strings (or `null`).
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    match Option::<OneOrMany>::deserialize(d)? {
        None => Ok(Vec::new()),
        Some(OneOrMany::One(s)) => Ok(alloc::vec![s]),
        Some(OneOrMany::Many(v)) => Ok(v),
    }
}

/// One request line.
// A line is parsed once and moved into the queue; boxing the generate
// variant would buy nothing but an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Generate text.
    Generate(GenerateRequest),
    /// Cancel the in-flight request with this id on the same connection.
    Cancel(Id),
    /// Describe the service (`{"op":"info"}`).
    Info(Id),
    /// Run the benchmark (`{"op":"bench"}`).
    Bench(Id, BenchRequest),
}

impl Request {
    /// The request as the JSON object [`parse_line`] reads (keys sorted:
    /// write lines with [`Request::to_line`], which keeps their order).
    pub fn to_value(&self) -> Value {
        let mut obj = Map::new();
        let mut put = |k: &str, v: Value| drop(obj.insert(k.into(), v));
        match self {
            Request::Generate(g) => return serde_json::to_value(g).unwrap_or(Value::Null),
            Request::Cancel(id) => put("cancel", id.0.clone()),
            Request::Info(id) => {
                put("op", Value::from("info"));
                put("id", id.0.clone());
            }
            Request::Bench(id, b) => {
                if let Ok(Value::Object(fields)) = serde_json::to_value(b) {
                    obj.extend(fields);
                }
                obj.insert("op".into(), Value::from("bench"));
                obj.insert("id".into(), id.0.clone());
            }
        }
        Value::Object(obj)
    }

    /// The request as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        // A generate request is written straight from its fields so that
        // `tools` and schemas keep their key order (a `Value` sorts keys).
        let direct = match self {
            Request::Generate(g) => serde_json::to_vec(g).ok(),
            _ => None,
        };
        let mut line = direct.unwrap_or_else(|| self.to_value().to_string().into_bytes());
        line.push(b'\n');
        line
    }
}

/// Parses one line (without its newline). Blank lines yield `Ok(None)`.
pub fn parse_line(line: &[u8]) -> Result<Option<Request>, LineError> {
    let bad_json = |message: String| LineError { id: Id::NULL, code: ErrorCode::BadJson, message };
    let text = core::str::from_utf8(line).map_err(|e| {
        bad_json(format!("line is not valid UTF-8 (bad byte at offset {})", e.valid_up_to()))
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad_json(format!("malformed JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(bad_json(String::from("a request must be a JSON object")));
    };
    let id = read_id(&obj)?;
    let generate = match obj.get("op") {
        None => !obj.contains_key("cancel"),
        Some(op) => op == "generate",
    };
    let parsed = match generate {
        true => generate_from_str(text).map(Request::Generate),
        false => parse_object(obj, id.clone()),
    };
    parsed.map(Some).map_err(|message| LineError { id, code: ErrorCode::BadRequest, message })
}

fn read_id(obj: &Map<String, Value>) -> Result<Id, LineError> {
    match obj.get("id") {
        None | Some(Value::Null) => Ok(Id::NULL),
        Some(v @ (Value::String(_) | Value::Number(_))) => Ok(Id(v.clone())),
        Some(_) => Err(LineError {
            id: Id::NULL,
            code: ErrorCode::BadRequest,
            message: String::from("\"id\" must be a string or a number"),
        }),
    }
}

fn parse_object(mut obj: Map<String, Value>, id: Id) -> Result<Request, String> {
    let op = match obj.remove("op") {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err(String::from("\"op\" must be a string")),
    };
    match op.as_deref() {
        None if obj.contains_key("cancel") => parse_cancel(&obj),
        Some("cancel") => parse_cancel(&obj),
        None | Some("generate") => generate_from_object(obj).map(Request::Generate),
        Some("info") => {
            only_keys(&obj, &["id"])?;
            Ok(Request::Info(id))
        }
        Some("bench") => {
            obj.remove("id");
            let b: BenchRequest = typed(obj)?;
            b.validate()?;
            Ok(Request::Bench(id, b))
        }
        Some(other) => {
            Err(format!("unknown op {other:?} (expected generate, cancel, info or bench)"))
        }
    }
}

/// Reads a generate request from a JSON object without `op`, checked as
/// [`parse_line`] checks it (for clients that read requests from elsewhere,
/// such as `kore-launch batch`'s input lines).
pub fn generate_from_object(obj: Map<String, Value>) -> Result<GenerateRequest, String> {
    let g: GenerateRequest = typed(obj)?;
    g.validate()?;
    Ok(g)
}

/// Reads a generate request from its JSON text (an `"op": "generate"` is
/// allowed), checked as [`parse_line`] checks it. Unlike
/// [`generate_from_object`] it keeps `tools` and schemas in the order written.
pub fn generate_from_str(text: &str) -> Result<GenerateRequest, String> {
    let mut g: GenerateRequest = serde_json::from_str(text).map_err(|e| e.to_string())?;
    g.op = None;
    g.validate()?;
    Ok(g)
}

fn typed<T: serde::de::DeserializeOwned>(obj: Map<String, Value>) -> Result<T, String> {
    serde_json::from_value(Value::Object(obj)).map_err(|e| e.to_string())
}

fn only_keys(obj: &Map<String, Value>, allowed: &[&str]) -> Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("unknown field {k:?} (allowed here: op, {})", allowed.join(", "))),
        None => Ok(()),
    }
}

fn parse_cancel(obj: &Map<String, Value>) -> Result<Request, String> {
    only_keys(obj, &["cancel", "id"])?;
    match obj.get("cancel") {
        Some(v @ (Value::String(_) | Value::Number(_))) => Ok(Request::Cancel(Id(v.clone()))),
        Some(_) => {
            Err(String::from("\"cancel\" must be the string or number id of the request to cancel"))
        }
        None => Err(String::from("a cancel request needs \"cancel\": <id of the request>")),
    }
}

#[cfg(test)]
mod tests;
