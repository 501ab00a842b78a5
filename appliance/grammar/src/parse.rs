//! Reads Qwen3-Coder tool calls out of the model's answer text, streaming:
//! text before the first call, then per call its name and its arguments as
//! fragments of one JSON object (compact, keys in the order written) that
//! concatenate to the final `arguments` string. Values are typed by the
//! tool's schema with [`crate::tools::value_kind`], the rule the grammar uses:
//! raw text for string parameters, JSON otherwise (a value that is not JSON
//! stays a string, for output that was not constrained).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use crate::json::{write_string, Value};
use crate::tools::{params, value_kind, ToolSet, ValueKind};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const END_FUNCTION: &str = "</function>";
const PARAM: &str = "<parameter=";
const END_PARAM: &str = "</parameter>";

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object.
    pub arguments: Value,
}

/// What the parser found in the text so far.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Answer text (before the calls).
    Text(String),
    /// A call begins.
    CallStart {
        /// 0, 1, ... in order.
        index: usize,
        /// The function's name.
        name: String,
    },
    /// More of the call's `arguments` JSON text.
    Arguments {
        /// The call.
        index: usize,
        /// The next piece.
        fragment: String,
    },
    /// A call is complete.
    CallEnd {
        /// The call.
        index: usize,
        /// Its name and typed arguments.
        call: ToolCall,
    },
}

/// Why the text is not well-formed tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed tool call: {}", self.what)
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParseError {}

fn err(what: impl Into<String>) -> ParseError {
    ParseError { what: what.into() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    Head,
    Params,
    Close,
}

/// The streaming parser.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    tools: ToolSet,
    buf: String,
    state: State,
    calls: usize,
    name: String,
    args: Vec<(String, Value)>,
}

/// The longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

impl ToolCallParser {
    /// A parser for calls of `tools`.
    pub fn new(tools: ToolSet) -> Self {
        ToolCallParser {
            tools,
            buf: String::new(),
            state: State::Text,
            calls: 0,
            name: String::new(),
            args: Vec::new(),
        }
    }

    /// Takes more text; returns what it completes.
    pub fn push(&mut self, text: &str) -> Result<Vec<Event>, ParseError> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.advance(&mut out)? {}
        Ok(out)
    }

    /// The end of the text: flushes held-back text; a call left open is an error.
    pub fn finish(mut self) -> Result<Vec<Event>, ParseError> {
        let mut out = Vec::new();
        while self.advance(&mut out)? {}
        match self.state {
            State::Text if !self.buf.is_empty() => {
                if self.calls == 0 || !self.buf.trim().is_empty() {
                    out.push(Event::Text(core::mem::take(&mut self.buf)));
                }
                Ok(out)
            }
            State::Text => Ok(out),
            _ => Err(err("the text ends inside a call")),
        }
    }

    /// One step; false when more text is needed.
    fn advance(&mut self, out: &mut Vec<Event>) -> Result<bool, ParseError> {
        match self.state {
            State::Text => {
                let Some(at) = self.buf.find(OPEN) else {
                    let keep = partial_tag(&self.buf, OPEN);
                    let emit = self.buf.len() - keep;
                    let text: String = self.buf.drain(..emit).collect();
                    // Whitespace between and after calls is not answer text.
                    if !text.is_empty() && (self.calls == 0 || !text.trim().is_empty()) {
                        out.push(Event::Text(text));
                    }
                    return Ok(false);
                };
                let text: String = self.buf.drain(..at).collect();
                if !text.is_empty() && (self.calls == 0 || !text.trim().is_empty()) {
                    out.push(Event::Text(text));
                }
                self.buf.drain(..OPEN.len());
                self.state = State::Head;
                Ok(true)
            }
            State::Head => {
                let Some(gt) = self.buf.find(">\n") else {
                    return if self.buf.len() > 4096 {
                        Err(err("no <function=NAME> line"))
                    } else {
                        Ok(false)
                    };
                };
                let head = self.buf[..gt].trim_start();
                let name =
                    head.strip_prefix(FUNCTION).ok_or_else(|| err("expected <function=NAME>"))?;
                if self.tools.get(name).is_none() {
                    return Err(err(alloc::format!(
                        "the model called {name:?}, which is not a given tool"
                    )));
                }
                self.name = name.to_string();
                self.args.clear();
                self.buf.drain(..gt + 2);
                out.push(Event::CallStart { index: self.calls, name: self.name.clone() });
                self.state = State::Params;
                Ok(true)
            }
            State::Params => self.param(out),
            State::Close => {
                let rest = self.buf.trim_start();
                if rest.len() < CLOSE.len() {
                    return if CLOSE.starts_with(rest) {
                        Ok(false)
                    } else {
                        Err(err("expected </tool_call>"))
                    };
                }
                if !rest.starts_with(CLOSE) {
                    return Err(err("expected </tool_call>"));
                }
                let drop = self.buf.len() - rest.len() + CLOSE.len();
                self.buf.drain(..drop);
                self.state = State::Text;
                Ok(true)
            }
        }
    }

    /// A parameter, or the end of the function.
    fn param(&mut self, out: &mut Vec<Event>) -> Result<bool, ParseError> {
        let rest = self.buf.trim_start();
        let skipped = self.buf.len() - rest.len();
        if rest.starts_with(END_FUNCTION) {
            self.buf.drain(..skipped + END_FUNCTION.len());
            let index = self.calls;
            let fragment = if self.args.is_empty() { "{}" } else { "}" };
            out.push(Event::Arguments { index, fragment: fragment.to_string() });
            let call = ToolCall {
                name: self.name.clone(),
                arguments: Value::Object(core::mem::take(&mut self.args)),
            };
            out.push(Event::CallEnd { index, call });
            self.calls += 1;
            self.state = State::Close;
            return Ok(true);
        }
        if !rest.starts_with(PARAM) {
            let wait = PARAM.starts_with(rest) || END_FUNCTION.starts_with(rest);
            return if wait {
                Ok(false)
            } else {
                Err(err("expected <parameter=KEY> or </function>"))
            };
        }
        let Some(gt) = rest.find('>') else { return Ok(false) };
        let key = &rest[PARAM.len()..gt];
        let json = self.kind(key) != ValueKind::Raw;
        // The value ends at the first `</parameter>` (raw text never holds one);
        // a JSON value may hold one inside a string: the first end after
        // which the value parses.
        let mut from = gt + 1;
        let (end, value) = loop {
            let Some(k) = rest[from..].find(END_PARAM) else { return Ok(false) };
            let end = from + k;
            let value = &rest[gt + 1..end];
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            if !json || Value::parse(value).is_ok() {
                break (end, value);
            }
            from = end + END_PARAM.len();
        };
        let typed = self.typed(key, value);
        let mut fragment = String::from(if self.args.is_empty() { "{" } else { "," });
        write_string(key, &mut fragment);
        fragment.push(':');
        fragment.push_str(&typed.to_compact_json());
        out.push(Event::Arguments { index: self.calls, fragment });
        self.args.push((key.to_string(), typed));
        self.buf.drain(..skipped + end + END_PARAM.len());
        Ok(true)
    }

    /// How parameter `key` of the current tool is written (JSON when unknown).
    fn kind(&self, key: &str) -> ValueKind {
        let tool = self.tools.get(&self.name);
        let schema = tool.and_then(|t| params(t).into_iter().find(|p| p.0 == key).map(|p| p.1));
        schema.map_or(ValueKind::Json, value_kind)
    }

    fn typed(&self, key: &str, value: &str) -> Value {
        match self.kind(key) {
            ValueKind::Raw => Value::String(value.to_string()),
            ValueKind::Json => {
                Value::parse(value).unwrap_or_else(|_| Value::String(value.to_string()))
            }
        }
    }
}

/// Parses a whole answer: `(text before the calls, calls)`.
pub fn parse_tool_calls(
    text: &str,
    tools: &ToolSet,
) -> Result<(String, Vec<ToolCall>), ParseError> {
    let mut p = ToolCallParser::new(tools.clone());
    let mut events = p.push(text)?;
    events.extend(p.finish()?);
    let (mut content, mut calls) = (String::new(), Vec::new());
    for e in events {
        match e {
            Event::Text(t) => content.push_str(&t),
            Event::CallEnd { call, .. } => calls.push(call),
            _ => {}
        }
    }
    Ok((content, calls))
}
