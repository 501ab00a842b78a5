//! `/v1/messages`: the body mapping (checked against the OpenAI path's
//! request for the same conversation), answers, the event order of a
//! stream, and the route end to end on the tiny test model.

use std::borrow::Cow;

use kore_protocol::{CallDelta, CallOut, Finish, GenerateRequest, Id, Phase, Stats};
use serde_json::{json, Value};

use super::answer::{answer, Naming};
use super::request::request;
use super::stream::Events;
use super::wire::MessagesRequest;
use crate::client::{Delta, Done};
use crate::serve::error::ApiError;
use crate::serve::mapping::chat_request;
use crate::serve::relay::Update;
use crate::serve::wire::{ChatRequest, Ordered};

fn anthropic(body: &str) -> Result<GenerateRequest, ApiError> {
    let req: MessagesRequest = serde_json::from_str(body).expect("parses");
    request(&req, 77)
}

fn openai(body: &str) -> GenerateRequest {
    let req: ChatRequest = serde_json::from_str(body).expect("parses");
    let ordered: Ordered = serde_json::from_str(body).expect("parses");
    chat_request(&req, &ordered, 77).expect("maps")
}

#[test]
fn a_tool_conversation_maps_to_the_openai_paths_request() {
    let a = anthropic(
        r#"{"model":"m","max_tokens":64,"temperature":0,"top_k":5,"stop_sequences":["END"],
        "system":[{"type":"text","text":"Be "},{"type":"text","text":"brief.","cache_control":{"type":"ephemeral"}}],
        "thinking":{"type":"enabled","budget_tokens":1024},"metadata":{"user_id":"u"},"service_tier":"auto",
        "tools":[{"name":"f","description":"Weather","input_schema":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}}}],
        "tool_choice":{"type":"any","disable_parallel_tool_use":true},
        "messages":[{"role":"user","content":"w?"},
          {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},
             {"type":"text","text":"Let me look."},
             {"type":"tool_use","id":"toolu_1","name":"f","input":{"z":1,"a":"x"}}]},
          {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
             {"type":"tool_result","tool_use_id":"toolu_2","is_error":true,
              "content":[{"type":"text","text":"no such city"}]},
             {"type":"text","text":"and now?"}]}]}"#,
    )
    .unwrap();
    let o = openai(
        r#"{"model":"m","max_tokens":64,"temperature":0,"top_k":5,"stop":["END"],
        "chat_template_kwargs":{"enable_thinking":true},
        "tools":[{"type":"function","function":{"name":"f","description":"Weather","parameters":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}}}}],
        "tool_choice":"required","parallel_tool_calls":false,
        "messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"w?"},
          {"role":"assistant","content":"Let me look.","reasoning_content":"hm","tool_calls":[
             {"id":"toolu_1","type":"function","function":{"name":"f","arguments":"{\"z\":1,\"a\":\"x\"}"}}]},
          {"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
          {"role":"tool","tool_call_id":"toolu_2","content":"Error: no such city"},
          {"role":"user","content":"and now?"}]}"#,
    );
    assert_eq!(a, o);
    let tools = a.tools.as_ref().unwrap().get();
    assert!(tools.find("\"z\"").unwrap() < tools.find("\"a\"").unwrap(), "{tools}");
    assert!(a.validate().is_ok());
}

#[test]
fn anthropic_defaults_sample_at_one_without_thinking() {
    let p = anthropic(
        r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
            "tool_choice":{"type":"tool","name":"g"},"tools":[{"name":"g","input_schema":{"type":"object"}}]}"#,
    )
    .unwrap();
    assert_eq!((p.temperature, p.seed, p.thinking), (Some(1.0), Some(77), Some(false)));
    assert_eq!(p.tool_choice, Some(json!({"type": "function", "function": {"name": "g"}})));
    let p = anthropic(
        r#"{"model":"m","max_tokens":5,"seed":9,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .unwrap();
    assert_eq!((p.seed, p.max_tokens), (Some(9), Some(5)));
}

#[test]
fn output_config_format_is_the_openai_json_schema_format() {
    let schema =
        r#"{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"boolean"}}}"#;
    let a = anthropic(&format!(
        r#"{{"model":"m","max_tokens":9,"temperature":0,"messages":[{{"role":"user","content":"x"}}],
            "output_config":{{"effort":null,"format":{{"type":"json_schema","schema":{schema}}}}}}}"#
    ))
    .unwrap();
    let o = openai(&format!(
        r#"{{"model":"m","max_tokens":9,"temperature":0,"messages":[{{"role":"user","content":"x"}}],
            "chat_template_kwargs":{{"enable_thinking":false}},
            "response_format":{{"type":"json_schema","json_schema":{{"strict":true,"schema":{schema}}}}}}}"#
    ));
    assert_eq!(a, o);
    let old = anthropic(&format!(
        r#"{{"model":"m","max_tokens":9,"temperature":0,"messages":[{{"role":"user","content":"x"}}],
            "output_format":{{"type":"json_schema","schema":{schema}}}}}"#
    ))
    .unwrap();
    assert_eq!(old, o);
}

#[test]
fn what_cannot_be_served_is_a_400_naming_the_field() {
    let user = r#"[{"role":"user","content":"x"}]"#;
    let cases = [
        (format!(r#"{{"model":"m","messages":{user}}}"#), "max_tokens"),
        (format!(r#"{{"model":"m","max_tokens":0,"messages":{user}}}"#), "max_tokens"),
        (
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[
                {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}"#
                .into(),
            "messages",
        ),
        (
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result",
                "tool_use_id":"t","content":[{"type":"document","source":{}}]}]}]}"#
                .into(),
            "messages",
        ),
        (
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},
                {"role":"assistant","content":"The answer is"}]}"#
                .into(),
            "messages",
        ),
        (r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}"#.into(), "messages"),
        (r#"{"model":"m","max_tokens":5,"system":"s","messages":[]}"#.into(), "messages"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"output_format":{{"type":"json_schema"}}}}"#), "output_format"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"output_config":{{"format":{{"type":"yaml","schema":{{}}}}}}}}"#), "output_config"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"output_config":{{"effort":"high"}}}}"#), "output_config.effort"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"mcp_servers":[{{}}]}}"#), "mcp_servers"),
        (
            format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"tools":[{{"type":"web_search_20250305","name":"web_search"}}]}}"#),
            "tools",
        ),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"tools":[{{"name":"f"}}]}}"#), "tools"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"tool_choice":{{"type":"tool"}}}}"#), "tool_choice"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"tool_choice":{{"type":"any"}}}}"#), "tool_choice"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"thinking":{{"type":"maybe"}}}}"#), "thinking"),
        (format!(r#"{{"model":"m","max_tokens":5,"messages":{user},"thinking":{{"type":"enabled"}}}}"#), "thinking"),
    ];
    for (body, field) in cases {
        let e = anthropic(&body).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(field)), "{body}: {e}");
    }
}

fn done(text: &str, thinking: Option<&str>, calls: Vec<CallOut>, finish: Finish) -> Done {
    let stats =
        Stats { prompt_tokens: 10, cached_tokens: 4, generated_tokens: 3, ..Stats::default() };
    Done {
        id: Cow::Owned(Id::from(1)),
        done: true,
        finish,
        token_ids: Cow::Owned(vec![1, 2, 3]),
        text: text.to_owned().into(),
        thinking: thinking.map(|t| t.to_owned().into()),
        stats: Cow::Owned(stats),
        tool_calls: Cow::Owned(calls),
        logprobs: None,
        stop_sequence: None,
    }
}

fn naming(max_tokens: u32) -> Naming {
    Naming { id: "msg_ab1".into(), model: "tiny".into(), max_tokens }
}

#[test]
fn done_events_become_messages() {
    let call =
        CallOut { id: "call_0_0".into(), name: "f".into(), arguments: r#"{"z":1,"a":"x"}"#.into() };
    let d = done("\n", Some("hm"), vec![call], Finish::Stop);
    let m = serde_json::to_string(&answer(&naming(3), &d).unwrap()).unwrap();
    assert_eq!(
        m,
        r#"{"id":"msg_ab1","type":"message","role":"assistant","model":"tiny","content":[{"type":"thinking","thinking":"hm","signature":""},{"type":"tool_use","id":"toolu_ab1_0","name":"f","input":{"z":1,"a":"x"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":6,"output_tokens":3,"cache_read_input_tokens":4}}"#
    );
    let reason = |d: &Done, max: u32| {
        let v = serde_json::to_value(answer(&naming(max), d).unwrap()).unwrap();
        (v["stop_reason"].clone(), v["stop_sequence"].clone(), v["content"].clone())
    };
    let plain = done("", None, Vec::new(), Finish::Stop);
    assert_eq!(
        reason(&plain, 3),
        (json!("end_turn"), Value::Null, json!([{"type": "text", "text": ""}]))
    );
    let stopped = Done { stop_sequence: Some("END".into()), ..plain.clone() };
    assert_eq!(reason(&stopped, 3).0, "stop_sequence");
    assert_eq!(reason(&stopped, 3).1, "END");
    let long = Done { finish: Finish::Length, ..plain };
    assert_eq!(reason(&long, 3).0, "max_tokens");
    assert_eq!(reason(&long, 9).0, "model_context_window_exceeded");
}

fn delta(text: &str, phase: Phase, call: Option<CallDelta<'static>>) -> Option<Update> {
    Some(Update::Delta(Delta {
        id: Cow::Owned(Id::from(1)),
        delta: text.to_owned().into(),
        phase,
        tool_call: call,
        logprobs: None,
    }))
}

/// Rebuilds the message from events, as the `anthropic` client does.
fn accumulate(events: &[(&str, String)]) -> Value {
    let mut message = Value::Null;
    let mut partial: Vec<String> = Vec::new();
    for (name, data) in events {
        let e: Value = serde_json::from_str(data).unwrap();
        assert_eq!(e["type"], *name);
        match *name {
            "message_start" => message = e["message"].clone(),
            "content_block_start" => {
                assert_eq!(e["index"], message["content"].as_array().unwrap().len());
                message["content"].as_array_mut().unwrap().push(e["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let i = e["index"].as_u64().unwrap() as usize;
                let block = &mut message["content"][i];
                let d = &e["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        block["text"] = json!(format!(
                            "{}{}",
                            block["text"].as_str().unwrap(),
                            d["text"].as_str().unwrap()
                        ))
                    }
                    "thinking_delta" => {
                        block["thinking"] = json!(format!(
                            "{}{}",
                            block["thinking"].as_str().unwrap(),
                            d["thinking"].as_str().unwrap()
                        ))
                    }
                    "input_json_delta" => {
                        partial[i].push_str(d["partial_json"].as_str().unwrap());
                        block["input"] = serde_json::from_str(&partial[i]).unwrap_or(json!({}));
                    }
                    other => panic!("{other}"),
                }
            }
            "message_delta" => {
                message["stop_reason"] = e["delta"]["stop_reason"].clone();
                message["stop_sequence"] = e["delta"]["stop_sequence"].clone();
                message["usage"] = e["usage"].clone();
            }
            _ => {}
        }
    }
    message
}

#[test]
fn stream_events_come_in_order_and_accumulate_to_the_answer() {
    let first = CallDelta {
        index: 0,
        id: Some("call_0_0".into()),
        name: Some("f".into()),
        arguments: r#"{"z":"#.into(),
    };
    let more = CallDelta { index: 0, id: None, name: None, arguments: "1}".into() };
    let updates = vec![
        delta("hm", Phase::Thinking, None),
        delta("", Phase::Answer, None),
        delta("\n", Phase::Answer, None),
        delta("", Phase::Answer, Some(first)),
        delta("", Phase::Answer, Some(more)),
    ];
    let call = CallOut { id: "call_0_0".into(), name: "f".into(), arguments: r#"{"z":1}"#.into() };
    let d = done("\n", Some("hm"), vec![call], Finish::Stop);
    let mut e = Events::new(naming(3));
    let mut events = Vec::new();
    for u in updates {
        events.extend(e.on_update(u));
    }
    assert!(!e.ended);
    events.extend(e.on_update(Some(Update::Done(d.clone()))));
    assert!(e.ended);
    let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let whole = serde_json::to_value(answer(&naming(3), &d).unwrap()).unwrap();
    assert_eq!(accumulate(&events), whole);
    // A plain answer: one text block; an empty one still has it.
    for text in ["Hi there", ""] {
        let mut e = Events::new(naming(3));
        let mut events = e.on_update(delta(text, Phase::Answer, None));
        let d = done(text, None, Vec::new(), Finish::Stop);
        events.extend(e.on_update(Some(Update::Done(d.clone()))));
        let whole = serde_json::to_value(answer(&naming(3), &d).unwrap()).unwrap();
        assert_eq!(accumulate(&events), whole, "{text:?}");
    }
    let mut e = Events::new(naming(3));
    let events = e.on_update(Some(Update::Failed(ApiError::unavailable("gone"))));
    assert_eq!(events.last().unwrap().0, "error");
    assert!(events.last().unwrap().1.contains("\"api_error\""));
}
