//! Constrained decoding's fast mask on the real Qwen3.5 vocabulary (248,320
//! ids with byte-level pieces of characters, long whitespace runs, added
//! tokens): in every lexical state the bench measures, the mask equals asking
//! the matcher token by token. Needs the `qwen35-reference` feature.

mod common;

use std::sync::Arc;

use kore_grammar::json::Value;
use kore_grammar::{mask_allows, Grammar, Matcher, Options, ToolChoice, ToolSet, Vocab};

#[test]
fn masks_equal_token_by_token_checks_on_the_real_vocabulary() {
    let tok = common::load_qwen35();
    let size = 248_320;
    let ids = 0..tok.vocab_size() as u32;
    let vocab = Arc::new(Vocab::new(
        size,
        ids.filter_map(|id| tok.token_bytes(id).map(|b| (id, b, tok.is_added(id)))),
    ));
    let ends = [248046, 248044];
    let schema = Value::parse(
        r#"{"type":"object","properties":{"title":{"type":"string"},"n":{"type":"integer"},
        "meta":{"type":"object","additionalProperties":true}},"required":["title"]}"#,
    )
    .unwrap();
    let json = Arc::new(Grammar::json_schema(&schema, Options::default()).unwrap());
    let tools = Value::parse(
        r#"[{"type":"function","function":{"name":"write","parameters":{"type":"object",
        "properties":{"content":{"type":"string"}},"required":["content"]}}}]"#,
    )
    .unwrap();
    let tools = ToolSet::from_openai(&tools).unwrap();
    let auto = Arc::new(Grammar::tools(tools, ToolChoice::Auto, true, Options::default()).unwrap());
    let call = "ok\n\n<tool_call>\n<function=write>\n<parameter=content>\nfn a() { b <";
    let states: [(&Arc<Grammar>, &str); 8] = [
        (&json, ""),
        (&json, "{\"title\": \"Zürich, 東京 and"),
        (&json, "{\"title\": \"x\\"),
        (&json, "{\"title\": \"x\\ud83d"),
        (&json, "{\"title\": \"x\", \"n\": 12"),
        (&json, "{\"title\": \"x\", \"meta\": {\"k"),
        (&auto, "Some text <tool"),
        (&auto, call),
    ];
    let mut mask = vec![0u32; vocab.mask_words()];
    for (g, text) in states {
        let mut m = Matcher::new(g.clone(), vocab.clone(), &ends).unwrap();
        for id in tok.encode(text) {
            m.accept(id).unwrap_or_else(|e| panic!("{e} in {text:?}"));
        }
        m.fill_mask(&mut mask);
        let mut allowed = 0;
        for id in 0..size as u32 {
            let want = m.allows(id);
            assert_eq!(
                mask_allows(&mask, id),
                want,
                "token {id} {:?} after {text:?}",
                tok.id_to_token(id)
            );
            allowed += want as usize;
        }
        assert!(allowed > 0, "{text:?}");
    }
}
