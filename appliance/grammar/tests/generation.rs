//! Whatever path a sampler takes through the masks, the output is valid: random
//! walks over the allowed tokens (a vocabulary with multi-byte tokens) end in
//! documents that parse and that the `jsonschema` crate validates.

mod common;

use common::*;
use kore_grammar::json::Value;

fn doc_tokens() -> Vec<Vec<u8>> {
    let texts = [
        "{\"name\": \"Ann\", \"age\": 42}",
        "[1.5, -2, 0]",
        "\"red\"",
        "true, null",
        "{\"v\": 1, \"kids\": []}",
        "\\n\\\"é中",
        "  \n",
    ];
    let mut out = Vec::new();
    for t in texts {
        let b = t.as_bytes();
        for i in 0..b.len() {
            for n in 2..=4 {
                if i + n <= b.len() {
                    out.push(b[i..i + n].to_vec());
                }
            }
        }
    }
    out
}

#[test]
fn random_walks_end_in_documents_jsonschema_validates() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jsonschema_docs.json");
    let cases = Value::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let v = vocab(&doc_tokens());
    let mut rng = Rng(0x5851_F42D_4C95_7F2D);
    let mut done = 0;
    for case in cases.as_array().unwrap() {
        let schema_text = case.get("schema").unwrap().to_compact_json();
        let g = schema(&schema_text);
        let reference =
            jsonschema::validator_for(&serde_json::from_str(&schema_text).unwrap()).unwrap();
        for _ in 0..30 {
            let (out, complete) = random_walk(&g, &v, &mut rng, 300, false);
            if !complete {
                continue;
            }
            let text = String::from_utf8(out).expect("UTF-8");
            let doc: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{schema_text}: {e}: {text:?}"));
            assert!(reference.is_valid(&doc), "{schema_text}: {text}");
            done += 1;
        }
    }
    eprintln!("{done} of 240 walks completed and validated");
    assert!(done >= 120, "only {done} of 240 walks completed");
}
