//! The constraint's language, byte by byte: what each JSON Schema form and the
//! tool-call form accept and refuse, and that the fast mask (bulk tables,
//! suffix tries, mid-pattern split) equals asking token by token.

mod common;

use std::sync::Arc;

use common::*;
use kore_grammar::json::Value;
use kore_grammar::{Grammar, GrammarError, Matcher, Options, ToolChoice, ToolSet};

#[test]
fn objects_follow_properties_required_and_order() {
    let g = schema(
        r#"{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
            "c":{"type":"boolean"}},"required":["b"]}"#,
    );
    assert!(accepts(&g, r#"{"b":"x"}"#));
    assert!(accepts(&g, r#"{"a":1,"b":"x","c":true}"#));
    assert!(accepts(&g, "{\n  \"a\": -12,\n  \"b\": \"\\u00e9\\n\"\n}"));
    assert!(!accepts(&g, r#"{"a":1}"#), "b is required");
    assert!(!accepts(&g, r#"{"b":"x","a":1}"#), "schema order");
    assert!(!accepts(&g, r#"{"b":"x","d":1}"#), "no additional properties");
    assert!(!accepts(&g, r#"{"a":1.5,"b":"x"}"#), "integer");
    assert!(!accepts(&g, r#"{"b":"x","b":"y"}"#), "no repeats");
    assert!(!accepts(&g, r#"{"b":"x"} "#), "nothing after the value");
}

#[test]
fn a_gap_holds_one_line_feed_and_twenty_indent_bytes() {
    let g = schema(
        r#"{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}}"#,
    );
    let pretty = "{\n    \"a\": [\n        1,\n        2\n    ]\n}";
    assert!(accepts(&g, pretty));
    assert!(accepts(&g, "{\r\n\t\"a\" :\t[ 1 ,2 ]\r\n}"), "CRLF, tabs");
    assert!(accepts(&g, &format!("{{\n{}\"a\":[]}}", " ".repeat(20))));
    assert!(!accepts(&g, &format!("{{\n{}\"a\":[]}}", " ".repeat(21))), "22 bytes");
    assert!(!accepts(&g, "{\n\n\"a\":[]}"), "a blank line");
    assert!(!accepts(&g, "{\"a\":[1,\n \n2]}"), "two line feeds in one gap");
    assert!(accepts(&g, "{\"a\":[1,\n2,\n3]}"), "one per gap, in every gap");
}

#[test]
fn additional_properties_come_after_declared_ones_and_never_repeat_them() {
    let g = schema(
        r#"{"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"number"}}"#,
    );
    assert!(accepts(&g, r#"{"id":1,"x":2.5,"idx":3}"#));
    assert!(accepts(&g, r#"{"x":2}"#));
    assert!(!accepts(&g, r#"{"x":2,"id":1}"#));
    assert!(!accepts(&g, r#"{"id":1,"id":2}"#));
    assert!(!accepts(&g, r#"{"id":1,"x":"s"}"#));
    let any_obj = schema(r#"{"type":"object"}"#);
    assert!(accepts(&any_obj, r#"{"k\"ey":[1,{"n":null}],"e":{}}"#));
}

#[test]
fn scalars_enums_arrays_anyof_and_refs() {
    let g = schema(r#"{"enum":["red","green",3,null]}"#);
    for ok in [r#""red""#, r#""green""#, "3", "null"] {
        assert!(accepts(&g, ok), "{ok}");
    }
    assert!(!accepts(&g, r#""blue""#) && !accepts(&g, "30"));
    let g = schema(r#"{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3}"#);
    assert!(accepts(&g, "[1, 2.5e-3, -0]") && accepts(&g, "[0]"));
    assert!(!accepts(&g, "[]") && !accepts(&g, "[1,2,3,4]") && !accepts(&g, "[01]"));
    // Every number it allows is a finite f64 (serde_json refuses -27e308).
    assert!(accepts(&g, "[-27e99, 999999999999999.5E-99]"));
    assert!(!accepts(&g, "[-27e308]") && !accepts(&g, "[1e100]"));
    let g = schema(
        r#"{"anyOf":[{"type":"string"},{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}]}"#,
    );
    assert!(accepts(&g, r#""s""#) && accepts(&g, r#"{"n":2}"#) && !accepts(&g, "{}"));
    let g = schema(
        r##"{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
            "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
            "$ref":"#/$defs/node"}"##,
    );
    assert!(accepts(&g, r#"{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}"#));
    assert!(!accepts(&g, r#"{"v":1,"kids":[{"kids":[]}]}"#));
    let g = schema(r#"{"type":["string","null"],"const":"x"}"#);
    assert!(accepts(&g, r#""x""#) && !accepts(&g, "null"));
    let g = schema(r#"{"type":"string"}"#);
    assert!(accepts(&g, r#""\ud83d\ude00 \" \\ \/ \b\f\n\r\t""#));
    assert!(!accepts(&g, r#""\ud83d""#), "lone high surrogate");
    assert!(!accepts(&g, r#""\ude00""#), "lone low surrogate");
    assert!(!accepts(&g, "\"a\u{1}\""), "raw control byte");
    assert!(!accepts(&g, r#""\x""#));
}

#[test]
fn unsupported_keywords_are_named_or_ignored_on_request() {
    for (s, kw) in [
        (r#"{"type":"string","pattern":"^a"}"#, "pattern"),
        (r#"{"type":"object","properties":{"d":{"type":"string","format":"date"}}}"#, "format"),
        (r#"{"type":"integer","minimum":0}"#, "minimum"),
        (r#"{"oneOf":[{"type":"string"}]}"#, "oneOf"),
        (r#"{"type":"array","uniqueItems":true}"#, "uniqueItems"),
    ] {
        let v = Value::parse(s).unwrap();
        match Grammar::json_schema(&v, Options::default()) {
            Err(GrammarError::Unsupported { keyword, .. }) => assert_eq!(keyword, kw),
            other => panic!("{s}: {other:?}"),
        }
        let lenient = Options { ignore_unsupported: true, ..Options::default() };
        let g = Grammar::json_schema(&v, lenient).unwrap();
        assert_eq!(g.ignored(), [kw.to_string()]);
    }
    for bad in [
        r#"{"type":"strin"}"#,
        r##"{"$ref":"#/$defs/none"}"##,
        "false",
        r#"{"enum":[]}"#,
        r#"{"type":"object","properties":{},"required":["x"]}"#,
    ] {
        let v = Value::parse(bad).unwrap();
        assert!(
            matches!(
                Grammar::json_schema(&v, Options::default()),
                Err(GrammarError::Invalid { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn refs_that_never_reach_a_value_and_forks_past_the_limit_are_refused() {
    // Found by the grammar_schema fuzz target: the root is a `$ref` to itself.
    let loops = [
        r##"{"$defs":{"t":{"t":{"$ref":"/x#/t"},"amxItems":2}},"$ref":"#"}"##,
        r##"{"anyOf":[{"type":"string"},{"$ref":"#"}]}"##,
        r##"{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/b"}]},"b":{"$ref":"#/$defs/a"}},
            "type":"object","properties":{"x":{"$ref":"#/$defs/a"}}}"##,
    ];
    for s in loops {
        let err = Grammar::json_schema(&Value::parse(s).unwrap(), Options::default()).unwrap_err();
        assert!(
            matches!(&err, GrammarError::Invalid { what, .. } if what.contains("lead back")),
            "{s}: {err:?}"
        );
    }
    // Ten levels of two-way anyOf fork one value into 1024 shapes; eleven into 2048.
    let forks = |levels: usize| {
        let mut defs = String::from(r#"{"$defs":{"d0":{"type":"string"}"#);
        for i in 1..=levels {
            let p = format!("#/$defs/d{}", i - 1);
            defs += &format!(r#","d{i}":{{"anyOf":[{{"$ref":"{p}"}},{{"$ref":"{p}"}}]}}"#);
        }
        defs + &format!(r##"}},"$ref":"#/$defs/d{levels}"}}"##)
    };
    let ok = Grammar::json_schema(&Value::parse(&forks(10)).unwrap(), Options::default());
    assert!(accepts(&Arc::new(ok.unwrap()), r#""s""#));
    let err = Grammar::json_schema(&Value::parse(&forks(11)).unwrap(), Options::default());
    assert!(
        matches!(err, Err(GrammarError::Unsupported { ref keyword, .. }) if keyword.starts_with("anyOf"))
    );
    // A chain of $refs deeper than the compiler recurses is refused, not a stack overflow.
    let chain = |n: usize| {
        let defs: Vec<String> =
            (0..n).map(|i| format!(r##""d{i}":{{"$ref":"#/$defs/d{}"}}"##, i + 1)).collect();
        format!(
            r##"{{"$defs":{{{},"d{n}":{{"type":"null"}}}},"$ref":"#/$defs/d0"}}"##,
            defs.join(",")
        )
    };
    assert!(Grammar::json_schema(&Value::parse(&chain(200)).unwrap(), Options::default()).is_ok());
    let deep = Grammar::json_schema(&Value::parse(&chain(100_000)).unwrap(), Options::default());
    assert!(
        matches!(deep, Err(GrammarError::Unsupported { ref keyword, .. }) if keyword.contains("nested"))
    );
}

fn weather_tools() -> ToolSet {
    let v = Value::parse(
        r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
        "properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]},
        "days":{"type":"integer"},"opts":{"type":"object","properties":{"x":{"type":"boolean"}}}},
        "required":["city"]}}},
        {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}]"#,
    )
    .unwrap();
    ToolSet::from_openai(&v).unwrap()
}

const CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan </param Francisco\n\
line 2\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

#[test]
fn tool_calls_in_the_qwen3_coder_form() {
    let req = |choice, parallel| {
        Arc::new(Grammar::tools(weather_tools(), choice, parallel, Options::default()).unwrap())
    };
    let required = req(ToolChoice::Required, true);
    assert!(accepts(&required, CALL));
    assert!(accepts(&required, &format!("\n\n{CALL}\n{CALL}")));
    assert!(!accepts(&required, "Sure. <tool_call>"));
    assert!(!accepts(&required, ""));
    let bad_enum =
        CALL.replace("<parameter=days>", "<parameter=unit>\nk\n</parameter>\n<parameter=days>");
    assert!(!accepts(&required, &bad_enum));
    let good_enum =
        CALL.replace("<parameter=days>", "<parameter=unit>\nf\n</parameter>\n<parameter=days>");
    assert!(accepts(&required, &good_enum));
    assert!(!accepts(&required, &CALL.replace("3\n</parameter>", "three\n</parameter>")));
    assert!(!accepts(&required, &CALL.replace("line 2", "x</parameter>y")));
    assert!(!accepts(&required, "<tool_call>\n<function=now>\n</function>\n</tool_call>x"));
    assert!(!accepts(&req(ToolChoice::Required, false), &format!("{CALL}\n{CALL}")));
    let missing_city = "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>";
    assert!(!accepts(&required, missing_city));
    let named = req(ToolChoice::Named("now".into()), true);
    assert!(accepts(&named, "<tool_call>\n<function=now>\n</function>\n</tool_call>"));
    assert!(!accepts(&named, CALL));
    let auto = req(ToolChoice::Auto, true);
    assert!(accepts(&auto, "Just text, no call."));
    assert!(accepts(&auto, ""));
    assert!(accepts(&auto, &format!("Let me check.\n\n{CALL}")));
    assert!(!accepts(&auto, &format!("{CALL} trailing")));
    // Free text never spells the call tag out in bytes (only the token opens a call).
    let mut m = Matcher::new(auto.clone(), common::vocab(&[]), &[END]).unwrap();
    for b in b"say <tool_call" {
        m.accept(u32::from(*b)).unwrap();
    }
    assert!(m.accept(u32::from(b'>')).is_err());
    let object = CALL.replace(
        "<parameter=days>\n3\n</parameter>\n",
        "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"x\": true}\n</parameter>\n",
    );
    assert!(accepts(&required, &object));
}

#[test]
fn thinking_comes_first_and_ends_at_the_think_token() {
    let v =
        Value::parse(r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#)
            .unwrap();
    let g =
        Arc::new(Grammar::json_schema(&v, Options { think: true, ..Options::default() }).unwrap());
    assert!(accepts(&g, "hmm, {\"a\": 'no'}</think>\n\n{\"a\":1}"));
    assert!(!accepts(&g, "{\"a\":1}"));
    assert!(!accepts(&g, "x</think>{\"a\":1}</think>"));
}

/// Tokens for the mask checks: pieces of outputs around every boundary the
/// lexers care about (quotes, escapes, `<`, newlines, `</parameter>` parts,
/// UTF-8 split mid-character).
fn test_tokens() -> Vec<Vec<u8>> {
    let texts = [
        "{\"city\": \"San Francisco\", \"days\": 3}",
        "\\n\\\"x\\u00e9\\ud83d\\ude00",
        "é😀ü中",
        "\n</parameter>\n<parameter=",
        "</param",
        "eter>",
        "<tool_",
        "call>",
        "</function>\n",
        "true, false, null, -12.5e+3",
        "[{\"a\": [1, 2]}]",
        "  \n\t",
        "<b>",
        "a<b",
        "x\n<",
    ];
    let mut out = Vec::new();
    for t in texts {
        let b = t.as_bytes();
        for i in 0..b.len() {
            for n in 2..=5 {
                if i + n <= b.len() {
                    out.push(b[i..i + n].to_vec());
                }
            }
        }
    }
    out
}

#[test]
fn fast_masks_equal_token_by_token_checks() {
    let v = common::vocab(&test_tokens());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let schemas = [
        r#"{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["city"]}"#,
        r#"{"anyOf":[{"type":"string"},{"type":"array","items":{"enum":["a","b"]}}]}"#,
        r#"{"type":"object","additionalProperties":true}"#,
    ];
    let mut completed = 0;
    for s in schemas {
        let g = schema(s);
        for _ in 0..6 {
            let (text, done) = random_walk(&g, &v, &mut rng, 60, true);
            completed += done as usize;
            eprintln!("{done} {:?}", String::from_utf8_lossy(&text));
        }
    }
    for (choice, think) in
        [(ToolChoice::Auto, true), (ToolChoice::Required, false), (ToolChoice::Auto, false)]
    {
        let g = Arc::new(
            Grammar::tools(weather_tools(), choice, true, Options { think, ..Options::default() })
                .unwrap(),
        );
        for _ in 0..8 {
            let (text, done) = random_walk(&g, &v, &mut rng, 120, true);
            completed += done as usize;
            eprintln!("{done} {:?}", String::from_utf8_lossy(&text));
        }
    }
    assert!(completed >= 10, "{completed} of 42 walks completed");
}

#[test]
fn matcher_needs_the_tool_tokens() {
    let bytes: Vec<[u8; 1]> = (0..=255u8).map(|b| [b]).collect();
    let v = Arc::new(kore_grammar::Vocab::new(
        300,
        (0..256u32).map(|b| (b, &bytes[b as usize][..], false)),
    ));
    let g = Arc::new(
        Grammar::tools(weather_tools(), ToolChoice::Auto, true, Options::default()).unwrap(),
    );
    assert!(matches!(Matcher::new(g, v, &[END]), Err(GrammarError::Vocabulary(_))));
}
