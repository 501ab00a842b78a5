//! The grammar against the Python `jsonschema` package (fixture from
//! scripts/reference/gen_grammar_fixtures.py): every document the grammar
//! accepts is one jsonschema calls valid, and the canonical valid documents
//! (compact, properties in schema order) are accepted.

mod common;

use std::sync::Arc;

use common::accepts;
use kore_grammar::json::Value;
use kore_grammar::{Grammar, Options};

#[test]
fn accepted_documents_are_valid_and_canonical_valid_ones_accepted() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jsonschema_docs.json");
    let cases = Value::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (mut accepted, mut valid, mut total) = (0, 0, 0);
    for case in cases.as_array().unwrap() {
        let schema = case.get("schema").unwrap();
        let g = Arc::new(Grammar::json_schema(schema, Options::default()).unwrap());
        for d in case.get("docs").and_then(Value::as_array).unwrap() {
            let text = d.get("text").and_then(Value::as_str).unwrap();
            let is_valid = d.get("valid") == Some(&Value::Bool(true));
            let canonical = d.get("canonical") == Some(&Value::Bool(true));
            let ok = accepts(&g, text);
            assert!(
                !ok || is_valid,
                "accepted an invalid document {text} for {}",
                schema.to_compact_json()
            );
            if canonical {
                assert!(ok, "refused canonical valid {text} for {}", schema.to_compact_json());
            }
            accepted += ok as usize;
            valid += is_valid as usize;
            total += 1;
        }
    }
    eprintln!("{total} documents: {valid} valid by jsonschema, {accepted} accepted");
    assert!(total > 250 && valid > 60 && accepted >= 30, "{total} {valid} {accepted}");
}
