use super::*;
use alloc::vec;

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
    assert_eq!(g.id, Id::from("a"));
    assert_eq!(g.max_tokens, Some(5));
    assert!(!g.thinking_on());
    assert_eq!((g.mtp, g.top_k, g.seed), (Some(2), Some(20), Some(9)));
    assert_eq!(g.stop, ["x", "yy"]);
    let Some(Input::Messages(m)) = g.input() else { panic!() };
    assert_eq!(m[1].role, Role::User);
}

#[test]
fn defaults() {
    let g = gen(r#"{"id":3,"prompt":"hello"}"#);
    assert_eq!((g.max_tokens, g.temperature, g.top_p), (None, None, None));
    assert!(g.thinking_on());
    assert!(g.stop.is_empty());
    assert_eq!(g.input(), Some(Input::Prompt("hello")));
    let g = gen(r#"{"id":3,"prompt":"hello","stop":"x","max_tokens":null}"#);
    assert_eq!((g.stop, g.max_tokens), (vec![String::from("x")], None));
    assert_eq!(gen(r#"{"op":"generate","prompt_ids":[1]}"#).prompt_ids, Some(vec![1]));
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
    assert_eq!((e.code, e.id.clone()), (ErrorCode::BadRequest, Id::from(7)));
    assert!(e.message.contains("max_token"), "{}", e.message);
    assert_eq!(err(r#"{"id":[1],"prompt":"x"}"#).id, Id::NULL);
    let bad = [
        r#"{"id":1}"#,
        r#"{"id":1,"prompt":"x","prompt_ids":[1]}"#,
        r#"{"id":1,"prompt":"x","thinking":true}"#,
        r#"{"id":1,"messages":[{"role":"user","content":"x"}],"thinking":"maybe"}"#,
        r#"{"id":1,"prompt":"x","max_tokens":0}"#,
        r#"{"id":1,"prompt":"x","max_tokens":1.5}"#,
        r#"{"id":1,"prompt":"x","top_p":0}"#,
        r#"{"id":1,"prompt":"x","temperature":-1}"#,
        r#"{"id":1,"prompt":"x","temperature":1e300}"#,
        r#"{"id":1,"prompt":"x","mtp":17}"#,
        r#"{"id":1,"prompt":"x","stop":["", "a"]}"#,
        r#"{"id":1,"prompt":"x","stop":[1]}"#,
        r#"{"id":1,"prompt":"x","session":""}"#,
        r#"{"id":1,"prompt":""}"#,
        r#"{"id":1,"prompt_ids":[]}"#,
        r#"{"id":1,"messages":[]}"#,
        r#"{"id":1,"prompt_ids":[1,-2]}"#,
        r#"{"id":1,"prompt_ids":[4294967296]}"#,
        r#"{"id":1,"messages":[{"role":"robot","content":"x"}]}"#,
        r#"{"id":1,"messages":[{"role":"user","content":"x","tool_calls":[{"name":"f","arguments":"{}"}]}]}"#,
        r#"{"id":1,"prompt":"x","logprobs":21}"#,
        r#"{"id":1,"prompt":"x","tools":[]}"#,
        r#"{"id":1,"messages":[{"role":"user","content":"x"}],"tools":{}}"#,
        r#"{"id":1,"prompt":"x","response_format":{"type":"xml"}}"#,
        r#"{"id":1,"prompt":"x","response_format":{"type":"json_schema"}}"#,
        r#"{"id":1,"prompt":"x","tool_choice":"required"}"#,
        r#"{"id":1,"prompt":"x","tool_choice":"sometimes"}"#,
        r#"{"id":1,"messages":[{"role":"user","content":"x"}],"tools":[],"response_format":{"type":"json_object"}}"#,
        r#"{"id":1,"messages":[{"role":"user","content":"x","name":"n"}]}"#,
        r#"{"id":1,"op":"dance"}"#,
        r#"{"id":1,"op":7,"prompt":"x"}"#,
        r#"{"cancel":true}"#,
        r#"{"op":"info","id":1,"x":2}"#,
        r#"{"op":"bench","id":1,"concurrency":0}"#,
        r#"{"op":"bench","id":1,"warp":9}"#,
    ];
    for line in bad {
        let e = err(line);
        assert_eq!(e.code, ErrorCode::BadRequest, "{line}: {}", e.message);
        assert!(!e.message.is_empty());
    }
}

#[test]
fn ops() {
    assert_eq!(parse_line(br#"{"op":"info","id":1}"#).unwrap(), Some(Request::Info(Id::from(1))));
    assert_eq!(parse_line(br#"{"cancel":"r1"}"#).unwrap(), Some(Request::Cancel(Id::from("r1"))));
    let Some(Request::Bench(_, b)) =
        parse_line(br#"{"op":"bench","id":2,"mtp":0,"threads":2}"#).unwrap()
    else {
        panic!()
    };
    assert_eq!((b.mtp, b.threads, b.prompt_tokens), (Some(0), Some(2), None));
}

#[test]
fn every_request_reads_back_as_written() {
    let mut chat = GenerateRequest::chat(vec![
        Message::new(Role::System, "be brief"),
        Message::new(Role::User, "hi \"there\"\n"),
    ]);
    chat.id = Id::from("c");
    chat.thinking = Some(false);
    chat.stop = vec![String::from("END")];
    chat.temperature = Some(0.5);
    chat.seed = Some(u64::MAX);
    let mut ids = GenerateRequest::completion_ids(vec![1, 2, 3]);
    ids.id = Id::from(9);
    ids.session = Some(String::from("s"));
    let requests = [
        Request::Generate(chat),
        Request::Generate(ids),
        Request::Generate(GenerateRequest::completion("once")),
        Request::Cancel(Id::from(4)),
        Request::Info(Id::from("i")),
        Request::Bench(Id::from(5), BenchRequest { mtp: Some(2), ..BenchRequest::default() }),
    ];
    for r in &requests {
        let line = r.to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        let back = parse_line(&line[..line.len() - 1]).unwrap().unwrap();
        assert_eq!(&back, r);
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let s: String = "[".repeat(100_000);
    assert_eq!(err(&s).code, ErrorCode::BadJson);
}

#[test]
fn tool_and_format_fields_keep_their_key_order() {
    let line = r#"{"id":"t","op":"generate","messages":[{"role":"user","content":"x"},
        {"role":"assistant","content":"","reasoning_content":"r",
         "tool_calls":[{"id":"c1","name":"f","arguments":"{\"b\":1,\"a\":2}"}]},
        {"role":"tool","content":"ok","tool_call_id":"c1"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}],
        "tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,
        "logprobs":3}"#;
    let g = gen(line);
    assert_eq!(g.id, Id::from("t"));
    let tools = g.tools.as_ref().unwrap().get();
    assert!(tools.find("\"z\"").unwrap() < tools.find("\"a\"").unwrap(), "{tools}");
    assert_eq!(g.choice(), Ok(crate::tools::Choice::Named("f".into())));
    let m = g.messages.as_ref().unwrap();
    assert_eq!((m[1].tool_calls[0].name.as_str(), m[2].role), ("f", Role::Tool));
    assert_eq!(m[1].reasoning_content.as_deref(), Some("r"));
    // Written and read back: the same request, tools text unchanged.
    let back = gen(core::str::from_utf8(&Request::Generate(g.clone()).to_line()).unwrap().trim());
    assert_eq!(back, g);
    let g = gen(r#"{"prompt":"x","response_format":{"type":"json_schema",
        "json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"y":{},"b":{}}}}}}"#);
    let f = g.response_format.as_ref().unwrap().format().unwrap();
    let crate::tools::Format::JsonSchema(Some(s)) = f else { panic!("{f:?}") };
    assert!(s.get().find("\"y\"").unwrap() < s.get().find("\"b\"").unwrap());
}
