//! The wire types of tool calls, structured outputs and log-probabilities:
//! request fields (`tools`, `tool_choice`, `response_format`, a message's
//! `tool_calls`) and what events report (`tool_call` deltas, the `done`
//! event's `tool_calls` and `logprobs`).
//!
//! JSON Schemas and tool lists travel as [`RawJson`]: their text exactly as
//! the client wrote it, because key order matters (the chat template prints
//! tools as given; a schema's properties are generated in its order) and
//! `serde_json`'s map sorts keys.

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// Most alternatives `logprobs` may ask for per token.
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// A JSON value kept as the text the client sent (key order included).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawJson(pub String);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        &self.0
    }

    /// The value read with `serde_json` (keys sorted; for type checks only).
    pub fn value(&self) -> Result<Value, String> {
        serde_json::from_str(&self.0).map_err(|e| e.to_string())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match RawValue::from_string(self.0.clone()) {
            Ok(raw) => raw.serialize(s),
            Err(e) => Err(serde::ser::Error::custom(e)),
        }
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: Box<RawValue> = Deserialize::deserialize(d)?;
        Ok(RawJson(raw.get().to_string()))
    }
}

/// A call an earlier assistant message made (OpenAI's
/// `tool_calls[].function`, flattened).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageCall {
    /// The call's id (kept for the client; the template does not print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The function's name.
    pub name: String,
    /// The arguments: the JSON text of an object.
    pub arguments: String,
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema",
/// "json_schema": {"name", "schema", "strict", "description"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema of `json_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// The inside of `response_format.json_schema`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (not used for generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it is for (not used for generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema (absent: any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<RawJson>,
    /// OpenAI's strict mode: Kore always enforces the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// What `response_format` asks for, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format<'a> {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this schema (`None`: any JSON value).
    JsonSchema(Option<&'a RawJson>),
}

impl ResponseFormat {
    /// The checked format; the error names what is wrong.
    pub fn format(&self) -> Result<Format<'_>, String> {
        match (self.kind.as_str(), &self.json_schema) {
            ("text", None) => Ok(Format::Text),
            ("json_object", None) => Ok(Format::JsonObject),
            ("json_schema", Some(s)) => Ok(Format::JsonSchema(s.schema.as_ref())),
            ("json_schema", None) => {
                Err("\"response_format\" of type json_schema needs \"json_schema\"".into())
            }
            ("text" | "json_object", Some(_)) => {
                Err("\"response_format.json_schema\" goes only with type json_schema".into())
            }
            (other, _) => Err(format!(
                "\"response_format\" type {other:?} is not supported \
                 (text, json_object or json_schema)"
            )),
        }
    }
}

/// `tool_choice`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Text or calls, as the model likes (the default with tools).
    Auto,
    /// No calls.
    None,
    /// At least one call.
    Required,
    /// Calls of this function.
    Named(String),
}

/// Reads `tool_choice`: `"auto"`, `"none"`, `"required"` or
/// `{"type": "function", "function": {"name": ...}}`.
pub fn tool_choice(v: &Value) -> Result<Choice, String> {
    let bad = || {
        String::from(
            "\"tool_choice\" must be \"auto\", \"none\", \"required\" or \
             {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    match v {
        Value::String(s) if s == "auto" => Ok(Choice::Auto),
        Value::String(s) if s == "none" => Ok(Choice::None),
        Value::String(s) if s == "required" => Ok(Choice::Required),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| Choice::Named(n.into()))
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// A call the model made, as the `done` event reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallOut {
    /// Unique within the connection's requests (`call_...`).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object's text, values typed by the schema.
    pub arguments: String,
}

/// A piece of a call streamed as it is generated: the first piece of a call
/// carries `id` and `name`, later ones more `arguments` text; the pieces of
/// one `index` concatenate to the `done` event's call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallDelta<'a> {
    /// The call's position: 0, 1, ...
    pub index: u32,
    /// Set on the call's first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Cow<'a, str>>,
    /// Set on the call's first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Cow<'a, str>>,
    /// More of the arguments' JSON text.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub arguments: Cow<'a, str>,
}

/// One alternative token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token id.
    pub id: u32,
    /// Its text (lossy UTF-8 of `bytes`).
    pub token: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability (the model's log-softmax, before sampling filters).
    pub logprob: f32,
}

/// One generated token's log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token id.
    pub id: u32,
    /// Its text (lossy UTF-8 of `bytes`).
    pub token: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The `logprobs` most likely tokens, most likely first.
    #[serde(default)]
    pub top: Vec<TopLogprob>,
}
