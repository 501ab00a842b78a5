//! The tool-call parser: text before calls, typed arguments, streamed
//! fragments that concatenate to the final arguments, JSON values holding
//! `</parameter>`, and errors.

use kore_grammar::json::Value;
use kore_grammar::{parse_tool_calls, Event, ToolCallParser, ToolSet};

fn tools() -> ToolSet {
    let v = Value::parse(
        r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
        "s":{"type":"string"},"n":{"type":"integer"},"o":{"type":"object"},"b":{"type":"boolean"},
        "e":{"type":"string","enum":["1","2"]}}}}}]"#,
    )
    .unwrap();
    ToolSet::from_openai(&v).unwrap()
}

const ANSWER: &str = "Let me do it.\n\n<tool_call>\n<function=f>\n<parameter=s>\n 42 \n</parameter>\n\
<parameter=n>\n42\n</parameter>\n<parameter=o>\n{\"k\": \"</parameter>\", \"z\": [1]}\n</parameter>\n\
<parameter=b>\ntrue\n</parameter>\n<parameter=e>\n2\n</parameter>\n</function>\n</tool_call>\n\
<tool_call>\n<function=f>\n</function>\n</tool_call>";

#[test]
fn parses_calls_with_values_typed_by_the_schema() {
    let (content, calls) = parse_tool_calls(ANSWER, &tools()).unwrap();
    assert_eq!(content, "Let me do it.\n\n");
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0].arguments.to_compact_json(),
        r#"{"s":" 42 ","n":42,"o":{"k":"</parameter>","z":[1]},"b":true,"e":"2"}"#
    );
    assert_eq!(calls[1].arguments, Value::Object(vec![]));
}

#[test]
fn streamed_fragments_concatenate_to_the_arguments_at_any_split() {
    for chunk in [1, 2, 5, 17, 1000] {
        let mut p = ToolCallParser::new(tools());
        let mut events = Vec::new();
        let chars: Vec<char> = ANSWER.chars().collect();
        for c in chars.chunks(chunk) {
            events.extend(p.push(&c.iter().collect::<String>()).unwrap());
        }
        events.extend(p.finish().unwrap());
        let mut args = vec![String::new(); 2];
        let mut text = String::new();
        for e in &events {
            match e {
                Event::Text(t) => text.push_str(t),
                Event::Arguments { index, fragment } => args[*index].push_str(fragment),
                Event::CallEnd { index, call } => {
                    assert_eq!(args[*index], call.arguments.to_compact_json())
                }
                Event::CallStart { name, .. } => assert_eq!(name, "f"),
            }
        }
        assert_eq!(text, "Let me do it.\n\n", "chunk {chunk}");
    }
}

#[test]
fn refuses_unknown_tools_and_open_calls() {
    let t = tools();
    assert!(parse_tool_calls("<tool_call>\n<function=g>\n</function>\n</tool_call>", &t).is_err());
    assert!(parse_tool_calls("<tool_call>\n<function=f>\n<parameter=s>\nx", &t).is_err());
    assert!(parse_tool_calls("<tool_call>\n<function=f>\n<bogus>", &t).is_err());
    let (text, calls) = parse_tool_calls("no calls, a < b", &t).unwrap();
    assert_eq!((text.as_str(), calls.len()), ("no calls, a < b", 0));
}
