//! The Qwen3.5 template's layout: messages (and tools) to a list of template
//! text and message text, following the Jinja template statement by statement.

use alloc::borrow::Cow;
use alloc::string::ToString;
use alloc::vec::Vec;

use kore_grammar::json::Value;

use crate::chat::{ChatMessage, ChatOptions, Role};
use crate::TokenizerError;

/// One piece of the rendered chat: template text (may contain special tokens)
/// or message text (never parsed for them).
pub(crate) enum Part<'a> {
    Template(&'static str),
    Text(Cow<'a, str>),
}

const TOOLS_HEAD: &str =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";

const TOOLS_TAIL: &str =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following \
format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n\
<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\n\
This is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n\
</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified \
format: an inner <function=...></function> block must be nested within <tool_call></tool_call> \
XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your \
function call in natural language BEFORE the function call, but NOT after\n- If there is no \
function call available, answer the question like normal with your current knowledge and do not \
tell the user about function calls\n</IMPORTANT>";

fn chat_err(m: &str) -> TokenizerError {
    TokenizerError::Chat(m.to_string())
}

/// `content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')` and
/// `content.split('</think>')[-1].lstrip('\n')` when the content has `</think>`.
pub(crate) fn split_think(content: &str) -> (&str, &str) {
    let Some(first) = content.find("</think>") else { return ("", content) };
    let before = content[..first].trim_end_matches('\n');
    let reasoning = before.rsplit("<think>").next().unwrap_or(before).trim_start_matches('\n');
    let last = content.rfind("</think>").map_or(first, |k| k);
    let after = content[last + "</think>".len()..].trim_start_matches('\n');
    (reasoning, after)
}

/// Python's `str.strip()` (Jinja's `trim`): removes the characters Python calls space.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || matches!(c, '\u{1c}'..='\u{1f}'))
}

/// Whether a user message is a wrapped tool result rather than a real query.
fn is_tool_wrapper(content: &str) -> bool {
    content.starts_with("<tool_response>") && content.ends_with("</tool_response>")
}

/// The system turn: the tools block (with the system text after it), or the
/// plain system message.
fn system_turn<'a>(msgs: &[ChatMessage<'a>], tools: &[Value], parts: &mut Vec<Part<'a>>) {
    let system = msgs.first().filter(|m| m.role == Role::System).map(|m| py_strip(m.content));
    if tools.is_empty() {
        if let Some(content) = system {
            parts.push(Part::Template("<|im_start|>system\n"));
            parts.push(Part::Text(Cow::Borrowed(content)));
            parts.push(Part::Template("<|im_end|>\n"));
        }
        return;
    }
    parts.push(Part::Template(TOOLS_HEAD));
    for tool in tools {
        parts.push(Part::Template("\n"));
        parts.push(Part::Text(Cow::Owned(tool.to_python_json())));
    }
    parts.push(Part::Template(TOOLS_TAIL));
    if let Some(content) = system.filter(|c| !c.is_empty()) {
        parts.push(Part::Template("\n\n"));
        parts.push(Part::Text(Cow::Borrowed(content)));
    }
    parts.push(Part::Template("<|im_end|>\n"));
}

/// An assistant turn: reasoning (after the last query), content, tool calls.
fn assistant_turn<'a>(
    m: &ChatMessage<'a>,
    after_query: bool,
    parts: &mut Vec<Part<'a>>,
) -> Result<(), TokenizerError> {
    let content = py_strip(m.content);
    let (reasoning, content) = match m.reasoning {
        Some(r) => (py_strip(r), content),
        None => {
            let (r, c) = split_think(content);
            (py_strip(r), c)
        }
    };
    if after_query {
        parts.push(Part::Template("<|im_start|>assistant\n<think>\n"));
        parts.push(Part::Text(Cow::Borrowed(reasoning)));
        parts.push(Part::Template("\n</think>\n\n"));
    } else {
        parts.push(Part::Template("<|im_start|>assistant\n"));
    }
    parts.push(Part::Text(Cow::Borrowed(content)));
    for (j, call) in m.tool_calls.iter().enumerate() {
        parts.push(Part::Template(match (j, py_strip(content).is_empty()) {
            (0, false) => "\n\n<tool_call>\n<function=",
            (0, true) => "<tool_call>\n<function=",
            _ => "\n<tool_call>\n<function=",
        }));
        parts.push(Part::Text(Cow::Borrowed(call.name)));
        parts.push(Part::Template(">\n"));
        match call.arguments {
            None => {}
            Some(Value::Object(args)) => {
                for (key, value) in args {
                    parts.push(Part::Template("<parameter="));
                    parts.push(Part::Text(Cow::Owned(key.clone())));
                    parts.push(Part::Template(">\n"));
                    parts.push(Part::Text(match value {
                        Value::String(s) => Cow::Owned(s.clone()),
                        v => Cow::Owned(v.to_python_str()),
                    }));
                    parts.push(Part::Template("\n</parameter>\n"));
                }
            }
            Some(_) => return Err(chat_err("a tool call's arguments must be a JSON object")),
        }
        parts.push(Part::Template("</function>\n</tool_call>"));
    }
    parts.push(Part::Template("<|im_end|>\n"));
    Ok(())
}

/// The whole rendering, as the template's statements produce it.
pub(crate) fn layout<'a>(
    msgs: &[ChatMessage<'a>],
    tools: &[Value],
    options: ChatOptions,
) -> Result<Vec<Part<'a>>, TokenizerError> {
    if msgs.is_empty() {
        return Err(chat_err("no messages provided"));
    }
    let mut parts = Vec::new();
    system_turn(msgs, tools, &mut parts);
    let last_query = msgs
        .iter()
        .rposition(|m| m.role == Role::User && !is_tool_wrapper(py_strip(m.content)))
        .ok_or_else(|| chat_err("no user query found in messages"))?;
    for (i, m) in msgs.iter().enumerate() {
        let content = py_strip(m.content);
        match m.role {
            Role::System if i != 0 => {
                return Err(chat_err("a system message must be the first message"))
            }
            Role::System => {}
            Role::User => {
                parts.push(Part::Template("<|im_start|>user\n"));
                parts.push(Part::Text(Cow::Borrowed(content)));
                parts.push(Part::Template("<|im_end|>\n"));
            }
            Role::Assistant => assistant_turn(m, i > last_query, &mut parts)?,
            Role::Tool => {
                if i > 0 && msgs[i - 1].role != Role::Tool {
                    parts.push(Part::Template("<|im_start|>user"));
                }
                parts.push(Part::Template("\n<tool_response>\n"));
                parts.push(Part::Text(Cow::Borrowed(content)));
                parts.push(Part::Template("\n</tool_response>"));
                if i + 1 == msgs.len() || msgs[i + 1].role != Role::Tool {
                    parts.push(Part::Template("<|im_end|>\n"));
                }
            }
        }
    }
    if options.add_generation_prompt {
        parts.push(Part::Template(if options.thinking {
            "<|im_start|>assistant\n<think>\n"
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        }));
    }
    Ok(parts)
}
