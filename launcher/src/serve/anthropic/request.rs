//! An Anthropic Messages body as the protocol request the OpenAI chat path
//! builds: the turns become OpenAI chat messages (`tool_use` blocks an
//! assistant's `tool_calls`, `tool_result` blocks `tool` messages), the
//! tools OpenAI function tools (their schemas as written), and the result
//! goes through [`crate::serve::mapping::chat_request`], so the template,
//! the tool grammar and the checks are the OpenAI path's own.

use kore_protocol::tools::JsonSchemaFormat;
use kore_protocol::{GenerateRequest, RawJson, ResponseFormat};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::wire::{InBlock, InMessage, MessagesRequest, Tool, ToolChoice};
use crate::serve::error::ApiError;
use crate::serve::mapping::chat_request;
use crate::serve::wire::{
    CallFunction, ChatMessage, ChatRequest, Content, MessageToolCall, OneOrMany, Options, Ordered,
};

/// Anthropic's default temperature (a request without one samples).
const DEFAULT_TEMPERATURE: f64 = 1.0;

/// The protocol request for `body` (without `id`); `fallback_seed` seeds a
/// sampled request that gives no `seed`.
pub fn request(body: &MessagesRequest, fallback_seed: u64) -> Result<GenerateRequest, ApiError> {
    refuse_unserved(body)?;
    let max_tokens = match body.max_tokens {
        None => return Err(ApiError::bad_param("max_tokens", "`max_tokens` is required")),
        Some(0) => return Err(ApiError::bad_param("max_tokens", "`max_tokens` must be >= 1")),
        n => n,
    };
    if body.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty: give a user turn"));
    }
    let mut messages = Vec::new();
    if let Some(system) = &body.system {
        messages.push(chat_message("system", text_of(system, "system")?));
    }
    for (i, m) in body.messages.iter().enumerate() {
        turn(m, i, &mut messages)?;
    }
    if body.messages.last().is_some_and(|m| m.role == "assistant") {
        let why =
            "a last `assistant` turn (a prefilled answer) is not served: end with a user turn";
        return Err(ApiError::bad_param("messages", why));
    }
    let (tool_choice, parallel) = choice(body.tool_choice.as_ref())?;
    let options = Options {
        max_tokens,
        temperature: Some(body.temperature.unwrap_or(DEFAULT_TEMPERATURE)),
        top_p: body.top_p,
        top_k: body.top_k,
        seed: body.seed,
        stop: body.stop_sequences.clone().map(OneOrMany::Many),
        tool_choice,
        parallel_tool_calls: parallel,
        ..Options::default()
    };
    let chat = ChatRequest {
        model: body.model.clone(),
        messages,
        options,
        chat_template_kwargs: None,
        enable_thinking: Some(thinking(body)?),
    };
    let ordered =
        Ordered { tools: tools(body.tools.as_deref())?, response_format: output_format(body)? };
    chat_request(&chat, &ordered, fallback_seed)
}

/// A 400 naming a field that would change the answer but is not served.
fn refuse_unserved(body: &MessagesRequest) -> Result<(), ApiError> {
    for (name, v) in [
        ("container", &body.container),
        ("mcp_servers", &body.mcp_servers),
        ("context_management", &body.context_management),
        ("output_config.effort", &body.output_config.as_ref().and_then(|c| c.effort.clone())),
    ] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            let m = format!("`{name}` is not served: this server would ignore it, so it refuses");
            return Err(ApiError::bad_param(name, m));
        }
    }
    Ok(())
}

/// `output_config.format` (or `output_format`) as OpenAI's `json_schema`
/// `response_format`, the schema as written.
fn output_format(body: &MessagesRequest) -> Result<Option<ResponseFormat>, ApiError> {
    let config = body.output_config.as_ref().and_then(|c| c.format.as_ref());
    let (field, f) = match (config, &body.output_format) {
        (Some(f), _) => ("output_config", f),
        (None, Some(f)) => ("output_format", f),
        (None, None) => return Ok(None),
    };
    let schema = match (f.kind.as_str(), &f.schema) {
        ("json_schema", Some(s)) => RawJson(s.get().to_owned()),
        _ => {
            let m = format!("`{field}` must be {{\"type\": \"json_schema\", \"schema\": ...}}");
            return Err(ApiError::bad_param(field, m));
        }
    };
    let json_schema = JsonSchemaFormat {
        name: None,
        description: None,
        schema: Some(schema),
        strict: Some(true),
    };
    Ok(Some(ResponseFormat { kind: "json_schema".into(), json_schema: Some(json_schema) }))
}

/// `thinking` as the template's `enable_thinking` (off when absent, as
/// Anthropic's API; `budget_tokens` is bounded by `max_tokens` only;
/// `adaptive` and `between_tools` turn it on: the template has no finer switch).
fn thinking(body: &MessagesRequest) -> Result<bool, ApiError> {
    let budget = body.thinking.as_ref().and_then(|t| t.budget_tokens);
    match body.thinking.as_ref().map(|t| t.kind.as_str()) {
        None | Some("disabled") => Ok(false),
        Some("enabled") if budget.is_none() => Err(ApiError::bad_param(
            "thinking",
            "`thinking` `enabled` needs `budget_tokens` (it is bounded by `max_tokens` here)",
        )),
        Some("enabled" | "adaptive" | "between_tools") => Ok(true),
        Some(other) => Err(ApiError::bad_param(
            "thinking",
            format!(
                "`thinking.type` `{other}` is not served (enabled, adaptive, between_tools, \
                 disabled)"
            ),
        )),
    }
}

/// `tool_choice` as OpenAI's, and `parallel_tool_calls`.
fn choice(c: Option<&ToolChoice>) -> Result<(Option<Value>, Option<bool>), ApiError> {
    let Some(c) = c else { return Ok((None, None)) };
    let openai = match (c.kind.as_str(), &c.name) {
        ("auto", _) => json!("auto"),
        ("any", _) => json!("required"),
        ("none", _) => json!("none"),
        ("tool", Some(name)) => json!({"type": "function", "function": {"name": name}}),
        ("tool", None) => {
            return Err(ApiError::bad_param("tool_choice", "`tool_choice` `tool` needs a `name`"))
        }
        (other, _) => {
            return Err(ApiError::bad_param(
                "tool_choice",
                format!("`tool_choice.type` `{other}` is not served (auto, any, tool, none)"),
            ))
        }
    };
    Ok((Some(openai), c.disable_parallel_tool_use.map(|d| !d)))
}

/// `tools` as OpenAI function tools' JSON text, the schemas as written.
fn tools(tools: Option<&[Tool]>) -> Result<Option<RawJson>, ApiError> {
    let Some(tools) = tools.filter(|t| !t.is_empty()) else { return Ok(None) };
    let mut out = Vec::with_capacity(tools.len());
    for t in tools {
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            let m = format!("tool type `{kind}` (a server tool) is not served: give client tools");
            return Err(ApiError::bad_param("tools", m));
        }
        let Some(name) = &t.name else {
            return Err(ApiError::bad_param("tools", "every tool needs a `name`"));
        };
        let Some(schema) = &t.input_schema else {
            return Err(ApiError::bad_param(
                "tools",
                format!("tool `{name}` needs `input_schema`"),
            ));
        };
        let function = Function {
            name,
            description: t.description.as_deref(),
            parameters: schema,
            strict: t.strict,
        };
        out.push(FunctionTool { kind: "function", function });
    }
    let text = serde_json::to_string(&out).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Some(RawJson(text)))
}

/// An OpenAI function tool as `tools` carries it (the schema as written).
#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

/// One Anthropic turn as OpenAI messages, appended to `out`.
fn turn(m: &InMessage, i: usize, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let blocks = match parse_either::<Vec<InBlock>>(&m.content, "messages")? {
        Either::Text(t) => {
            out.push(chat_message(&m.role, t));
            return match m.role.as_str() {
                "user" | "assistant" => Ok(()),
                r => Err(bad_role(r, i)),
            };
        }
        Either::Other(blocks) => blocks,
    };
    match m.role.as_str() {
        "user" => user_blocks(&blocks, out),
        "assistant" => assistant_blocks(&blocks).map(|msg| out.push(msg)),
        r => Err(bad_role(r, i)),
    }
}

fn bad_role(role: &str, i: usize) -> ApiError {
    let m = format!("messages[{i}]: role `{role}` is not served (user, assistant)");
    ApiError::bad_param("messages", m)
}

/// A user turn: text blocks as user messages, `tool_result` blocks as
/// `tool` messages, in order.
fn user_blocks(blocks: &[InBlock], out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let mut text: Option<String> = None;
    for b in blocks {
        match b.kind.as_str() {
            "text" => text.get_or_insert_with(String::new).push_str(block_text(b)?),
            "tool_result" => {
                if let Some(t) = text.take() {
                    out.push(chat_message("user", t));
                }
                out.push(tool_result(b)?);
            }
            other => return Err(unserved_block(other)),
        }
    }
    match text {
        Some(t) => out.push(chat_message("user", t)),
        None if blocks.is_empty() => out.push(chat_message("user", String::new())),
        None => {}
    }
    Ok(())
}

/// A `tool_result` block as a `tool` message (a failed tool's text is
/// prefixed with `Error: `).
fn tool_result(b: &InBlock) -> Result<ChatMessage, ApiError> {
    let text = match &b.content {
        Some(c) => text_of(c, "messages")?,
        None => String::new(),
    };
    let text = if b.is_error == Some(true) { format!("Error: {text}") } else { text };
    let mut m = chat_message("tool", text);
    m.tool_call_id = b.tool_use_id.clone();
    Ok(m)
}

/// An assistant turn: its thinking, text and calls as one message.
fn assistant_blocks(blocks: &[InBlock]) -> Result<ChatMessage, ApiError> {
    let mut m = chat_message("assistant", String::new());
    let (mut text, mut thinking) = (String::new(), String::new());
    for b in blocks {
        match b.kind.as_str() {
            "text" => text.push_str(block_text(b)?),
            "thinking" => thinking.push_str(b.thinking.as_deref().unwrap_or_default()),
            "redacted_thinking" => {}
            "tool_use" => m.tool_calls.get_or_insert_with(Vec::new).push(tool_use(b)?),
            other => return Err(unserved_block(other)),
        }
    }
    m.content = Some(Content::Text(text));
    m.reasoning_content = Some(thinking).filter(|t| !t.is_empty());
    Ok(m)
}

/// A `tool_use` block as an OpenAI call (the input object's text as written).
fn tool_use(b: &InBlock) -> Result<MessageToolCall, ApiError> {
    let (Some(name), Some(input)) = (&b.name, &b.input) else {
        return Err(ApiError::bad_param("messages", "a `tool_use` block needs `name` and `input`"));
    };
    if !input.get().trim_start().starts_with('{') {
        return Err(ApiError::bad_param("messages", "a `tool_use` block's `input` is an object"));
    }
    let function = CallFunction { name: name.clone(), arguments: input.get().to_owned() };
    Ok(MessageToolCall { id: b.id.clone(), function: Some(function), name: None, arguments: None })
}

fn block_text(b: &InBlock) -> Result<&str, ApiError> {
    b.text.as_deref().ok_or_else(|| ApiError::bad_param("messages", "a `text` block needs `text`"))
}

fn unserved_block(kind: &str) -> ApiError {
    let m = format!(
        "content block type `{kind}` is not served (text, tool_use, tool_result, thinking); \
         images and documents need a model that reads them"
    );
    ApiError::bad_param("messages", m)
}

/// A string or a list of `text` blocks (concatenated, as the OpenAI path
/// concatenates text parts).
fn text_of(raw: &RawValue, field: &str) -> Result<String, ApiError> {
    match parse_either::<Vec<InBlock>>(raw, field)? {
        Either::Text(t) => Ok(t),
        Either::Other(blocks) => blocks
            .iter()
            .map(|b| match b.kind.as_str() {
                "text" => block_text(b),
                other => Err(unserved_block(other)),
            })
            .collect::<Result<Vec<&str>, ApiError>>()
            .map(|v| v.concat()),
    }
}

enum Either<T> {
    Text(String),
    Other(T),
}

/// A string, or else a `T` (raw JSON read once more: serde's untagged
/// enums cannot hold raw values).
fn parse_either<T: DeserializeOwned>(raw: &RawValue, field: &str) -> Result<Either<T>, ApiError> {
    let bad = |e: serde_json::Error| {
        ApiError::bad_param(field, format!("`{field}`: a string or a list of blocks: {e}"))
    };
    match raw.get().trim_start().starts_with('"') {
        true => serde_json::from_str(raw.get()).map(Either::Text).map_err(bad),
        false => serde_json::from_str(raw.get()).map(Either::Other).map_err(bad),
    }
}

fn chat_message(role: &str, text: String) -> ChatMessage {
    ChatMessage {
        role: role.to_owned(),
        content: Some(Content::Text(text)),
        reasoning_content: None,
        tool_calls: None,
        tool_call_id: None,
    }
}
