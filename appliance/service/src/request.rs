//! Request lines: strict parsing and validation of one JSON object into a
//! typed [`Request`], or a [`LineError`] with a stable code and a message
//! that says what to fix. Nothing here panics on any input.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::codec::{ChatMessage, Role};
use crate::engine::BenchRequest;

/// Most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 8;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Largest accepted `mtp` draft count.
pub const MAX_MTP: u64 = 16;

/// Stable error codes of the protocol (the `error.code` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not valid UTF-8 or not a JSON object.
    BadJson,
    /// Valid JSON, but a field is missing, unknown, or of the wrong type/range.
    BadRequest,
    /// The line exceeds the line-length limit; it was skipped up to its newline.
    LineTooLong,
    /// Prompt tokens leave no room to generate within the context limit.
    PromptTooLong,
    /// The request queue (or the connection table) is full; retry later.
    Overloaded,
    /// The id is already in flight on this connection.
    DuplicateId,
    /// The operation is not available in this build.
    Unsupported,
    /// The engine or tokenizer failed; the service keeps running.
    Internal,
}

/// A request id as the client sent it (string or number), echoed verbatim;
/// `null` when the client gave none or it could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Id(pub Value);

impl Id {
    /// The id of lines whose id is missing or unreadable.
    pub const NULL: Id = Id(Value::Null);

    /// A canonical key for comparing ids (their JSON text).
    pub fn key(&self) -> String {
        self.0.to_string()
    }
}

/// A rejected line: the id to answer with, the code and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    /// Echoed id (`null` if unreadable).
    pub id: Id,
    /// Stable error code.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Chat messages rendered through the template.
    Messages(Vec<ChatMessage>),
    /// Raw completion of a text prompt (no template).
    Prompt(String),
    /// Raw completion of token ids (no template).
    PromptIds(Vec<u32>),
}

/// A validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Echoed id.
    pub id: Id,
    /// Prompt.
    pub input: Input,
    /// `max_tokens` if given.
    pub max_tokens: Option<u32>,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: u32,
    /// Min-p (0 = off).
    pub min_p: f32,
    /// Random seed.
    pub seed: u64,
    /// Draft tokens per step.
    pub mtp: Option<u32>,
    /// Thinking on/off (chat only; default on).
    pub thinking: bool,
    /// Stop strings (applied to the answer text).
    pub stop: Vec<String>,
    /// Session whose kept state the request may continue (and then keeps).
    pub session: Option<String>,
}

/// Longest accepted session name in bytes.
pub const MAX_SESSION_BYTES: usize = 256;

/// One parsed request line.
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

/// Parses one line (without its newline). Blank lines yield `Ok(None)`.
pub fn parse_line(line: &[u8]) -> Result<Option<Request>, LineError> {
    let text = core::str::from_utf8(line).map_err(|e| LineError {
        id: Id::NULL,
        code: ErrorCode::BadJson,
        message: format!("line is not valid UTF-8 (bad byte at offset {})", e.valid_up_to()),
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| LineError {
        id: Id::NULL,
        code: ErrorCode::BadJson,
        message: format!("malformed JSON: {e}"),
    })?;
    let Value::Object(obj) = value else {
        return Err(LineError {
            id: Id::NULL,
            code: ErrorCode::BadJson,
            message: String::from("a request must be a JSON object"),
        });
    };
    let id = read_id(&obj)?;
    parse_object(&obj, id.clone()).map(Some).map_err(|message| LineError {
        id,
        code: ErrorCode::BadRequest,
        message,
    })
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

fn parse_object(obj: &Map<String, Value>, id: Id) -> Result<Request, String> {
    let op = match obj.get("op") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(String::from("\"op\" must be a string")),
    };
    match op {
        None if obj.contains_key("cancel") => parse_cancel(obj),
        Some("cancel") => parse_cancel(obj),
        None | Some("generate") => parse_generate(obj, id).map(Request::Generate),
        Some("info") => {
            only_keys(obj, &["op", "id"])?;
            Ok(Request::Info(id))
        }
        Some("bench") => parse_bench(obj).map(|b| Request::Bench(id, b)),
        Some(other) => {
            Err(format!("unknown op {other:?} (expected generate, cancel, info or bench)"))
        }
    }
}

fn only_keys(obj: &Map<String, Value>, allowed: &[&str]) -> Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!("unknown field {k:?} (allowed here: {})", allowed.join(", "))),
        None => Ok(()),
    }
}

fn parse_cancel(obj: &Map<String, Value>) -> Result<Request, String> {
    only_keys(obj, &["op", "cancel", "id"])?;
    match obj.get("cancel") {
        Some(v @ (Value::String(_) | Value::Number(_))) => Ok(Request::Cancel(Id(v.clone()))),
        Some(_) => {
            Err(String::from("\"cancel\" must be the string or number id of the request to cancel"))
        }
        None => Err(String::from("a cancel request needs \"cancel\": <id of the request>")),
    }
}

const GENERATE_KEYS: &[&str] = &[
    "op",
    "id",
    "messages",
    "prompt",
    "prompt_ids",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "thinking",
    "mtp",
    "stop",
    "session",
];

fn parse_generate(obj: &Map<String, Value>, id: Id) -> Result<GenerateRequest, String> {
    only_keys(obj, GENERATE_KEYS)?;
    let input = parse_input(obj)?;
    let is_chat = matches!(input, Input::Messages(_));
    let thinking = match obj.get("thinking") {
        None => true,
        Some(_) if !is_chat => {
            return Err(String::from(
                "\"thinking\" applies only to chat \"messages\", not to raw prompts",
            ))
        }
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s == "on" => true,
        Some(Value::String(s)) if s == "off" => false,
        Some(_) => return Err(String::from("\"thinking\" must be true, false, \"on\" or \"off\"")),
    };
    let max_tokens = opt_uint(obj, "max_tokens", 1, u64::from(u32::MAX))?.map(|v| v as u32);
    let temperature = opt_float(obj, "temperature", 0.0, 1.0e6, true)?.unwrap_or(0.0);
    let top_p = opt_float(obj, "top_p", 0.0, 1.0, false)?.unwrap_or(1.0);
    let top_k = opt_uint(obj, "top_k", 0, u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let min_p = opt_float(obj, "min_p", 0.0, 1.0, true)?.unwrap_or(0.0);
    let seed = opt_uint(obj, "seed", 0, u64::MAX)?.unwrap_or(0);
    let mtp = opt_uint(obj, "mtp", 0, MAX_MTP)?.map(|v| v as u32);
    let stop = parse_stop(obj.get("stop"))?;
    let session = match obj.get("session") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_SESSION_BYTES => Some(s.clone()),
        Some(_) => {
            return Err(format!(
                "\"session\" must be a non-empty string of at most {MAX_SESSION_BYTES} bytes"
            ))
        }
    };
    Ok(GenerateRequest {
        id,
        input,
        max_tokens,
        temperature,
        top_p,
        top_k,
        min_p,
        seed,
        mtp,
        thinking,
        stop,
        session,
    })
}

fn parse_input(obj: &Map<String, Value>) -> Result<Input, String> {
    let given: Vec<&str> =
        ["messages", "prompt", "prompt_ids"].into_iter().filter(|k| obj.contains_key(*k)).collect();
    match given.as_slice() {
        ["messages"] => parse_messages(&obj["messages"]).map(Input::Messages),
        ["prompt"] => match &obj["prompt"] {
            Value::String(s) if !s.is_empty() => Ok(Input::Prompt(s.clone())),
            Value::String(_) => Err(String::from("\"prompt\" must not be empty")),
            _ => Err(String::from("\"prompt\" must be a string")),
        },
        ["prompt_ids"] => parse_ids(&obj["prompt_ids"]).map(Input::PromptIds),
        [] => {
            Err(String::from("a request needs one of \"messages\", \"prompt\" or \"prompt_ids\""))
        }
        _ => Err(format!(
            "give only one of \"messages\", \"prompt\", \"prompt_ids\" (got {})",
            given.join(", ")
        )),
    }
}

fn parse_messages(v: &Value) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = v else {
        return Err(String::from(
            "\"messages\" must be an array of {\"role\", \"content\"} objects",
        ));
    };
    if items.is_empty() {
        return Err(String::from("\"messages\" must not be empty"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return Err(format!("messages[{i}] must be an object"));
        };
        if let Some(k) = m.keys().find(|k| *k != "role" && *k != "content") {
            return Err(format!("messages[{i}]: unknown field {k:?} (allowed: role, content)"));
        }
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => {
                return Err(format!(
                    "messages[{i}].role must be \"system\", \"user\" or \"assistant\""
                ))
            }
        };
        let Some(Value::String(content)) = m.get("content") else {
            return Err(format!("messages[{i}].content must be a string"));
        };
        out.push(ChatMessage { role, content: content.clone() });
    }
    Ok(out)
}

fn parse_ids(v: &Value) -> Result<Vec<u32>, String> {
    let Value::Array(items) = v else {
        return Err(String::from("\"prompt_ids\" must be an array of token ids"));
    };
    if items.is_empty() {
        return Err(String::from("\"prompt_ids\" must not be empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("prompt_ids[{i}] must be an integer in 0..2^32"))
        })
        .collect()
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, String> {
    let list: Vec<&Value> = match v {
        None => return Ok(Vec::new()),
        Some(s @ Value::String(_)) => alloc::vec![s],
        Some(Value::Array(a)) => a.iter().collect(),
        Some(_) => return Err(String::from("\"stop\" must be a string or an array of strings")),
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(format!("at most {MAX_STOP_STRINGS} stop strings"));
    }
    list.into_iter()
        .map(|s| match s {
            Value::String(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.clone()),
            _ => Err(format!(
                "each stop string must be a non-empty string of at most {MAX_STOP_BYTES} bytes"
            )),
        })
        .collect()
}

fn opt_uint(
    obj: &Map<String, Value>,
    key: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(format!("\"{key}\" must be an integer in {min}..={max}")),
        },
    }
}

fn opt_float(
    obj: &Map<String, Value>,
    key: &str,
    min: f64,
    max: f64,
    min_inclusive: bool,
) -> Result<Option<f32>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let ok = v.as_f64().filter(|x| {
                x.is_finite() && *x <= max && (*x > min || (min_inclusive && *x == min))
            });
            match ok {
                Some(x) => Ok(Some(x as f32)),
                None => {
                    let open = if min_inclusive { '[' } else { '(' };
                    Err(format!("\"{key}\" must be a number in {open}{min}, {max}]"))
                }
            }
        }
    }
}

fn parse_bench(obj: &Map<String, Value>) -> Result<BenchRequest, String> {
    only_keys(
        obj,
        &["op", "id", "prompt_tokens", "decode_tokens", "mtp", "threads", "concurrency"],
    )?;
    let small = |k: &str, min: u64, max: u64| -> Result<Option<u32>, String> {
        Ok(opt_uint(obj, k, min, max)?.map(|v| v as u32))
    };
    Ok(BenchRequest {
        prompt_tokens: small("prompt_tokens", 1, 1 << 20)?,
        decode_tokens: small("decode_tokens", 1, 1 << 20)?,
        mtp: small("mtp", 0, MAX_MTP)?,
        threads: small("threads", 1, 4096)?,
        concurrency: small("concurrency", 1, 256)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: &str) -> LineError {
        parse_line(line.as_bytes()).expect_err("line should be rejected")
    }

    fn gen(line: &str) -> GenerateRequest {
        match parse_line(line.as_bytes()) {
            Ok(Some(Request::Generate(g))) => g,
            other => panic!("not a generate request: {other:?}"),
        }
    }

    #[test]
    fn parses_chat_with_all_options() {
        let g = gen(
            r#"{"id":"a","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],
            "max_tokens":5,"temperature":0.7,"top_p":0.9,"top_k":20,"min_p":0.05,"seed":9,"thinking":"off","mtp":2,"stop":["x","yy"]}"#,
        );
        assert_eq!(g.id, Id(Value::String("a".into())));
        assert_eq!(g.max_tokens, Some(5));
        assert!(!g.thinking);
        assert_eq!(g.mtp, Some(2));
        assert_eq!(g.top_k, 20);
        assert_eq!(g.seed, 9);
        assert_eq!(g.stop, ["x", "yy"]);
        let Input::Messages(m) = g.input else { panic!() };
        assert_eq!(m[1].role, Role::User);
    }

    #[test]
    fn defaults() {
        let g = gen(r#"{"id":3,"prompt":"hello"}"#);
        assert_eq!(g.max_tokens, None);
        assert_eq!(g.temperature, 0.0);
        assert_eq!(g.top_p, 1.0);
        assert!(g.thinking);
        assert!(g.stop.is_empty());
        assert_eq!(g.input, Input::Prompt("hello".into()));
    }

    #[test]
    fn blank_lines_are_ignored() {
        assert_eq!(parse_line(b"   \t").unwrap(), None);
    }

    #[test]
    fn error_codes() {
        assert_eq!(err("{").code, ErrorCode::BadJson);
        assert_eq!(err("[1]").code, ErrorCode::BadJson);
        assert_eq!(parse_line(b"{\"id\":\"\xff\"}").unwrap_err().code, ErrorCode::BadJson);
        let e = err(r#"{"id":7,"prompt":"x","max_token":3}"#);
        assert_eq!((e.code, e.id.clone()), (ErrorCode::BadRequest, Id(7.into())));
        assert!(e.message.contains("max_token"));
        assert_eq!(err(r#"{"id":[1],"prompt":"x"}"#).id, Id::NULL);
        assert_eq!(err(r#"{"id":1}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt":"x","prompt_ids":[1]}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt":"x","thinking":true}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt":"x","max_tokens":0}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt":"x","max_tokens":1.5}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt":"x","top_p":0}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt":"x","temperature":-1}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt_ids":[1,-2]}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"id":1,"prompt_ids":[4294967296]}"#).code, ErrorCode::BadRequest);
        assert_eq!(
            err(r#"{"id":1,"messages":[{"role":"tool","content":"x"}]}"#).code,
            ErrorCode::BadRequest
        );
        assert_eq!(err(r#"{"id":1,"op":"dance"}"#).code, ErrorCode::BadRequest);
        assert_eq!(err(r#"{"cancel":true}"#).code, ErrorCode::BadRequest);
    }

    #[test]
    fn ops() {
        assert_eq!(
            parse_line(br#"{"op":"info","id":1}"#).unwrap(),
            Some(Request::Info(Id(1.into())))
        );
        assert_eq!(
            parse_line(br#"{"cancel":"r1"}"#).unwrap(),
            Some(Request::Cancel(Id("r1".into())))
        );
        let Some(Request::Bench(_, b)) =
            parse_line(br#"{"op":"bench","id":2,"mtp":0,"threads":2}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!((b.mtp, b.threads, b.prompt_tokens), (Some(0), Some(2), None));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut s = String::new();
        for _ in 0..100_000 {
            s.push('[');
        }
        assert_eq!(err(&s).code, ErrorCode::BadJson);
    }
}
