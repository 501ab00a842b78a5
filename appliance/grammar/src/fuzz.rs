//! Bodies of the fuzz targets (fuzz/fuzz_targets/grammar_*.rs), also run by
//! this crate's tests on their seeds: whatever the input, no panic, no hang.

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::json::Value;
use crate::{
    parse_tool_calls, Grammar, Matcher, Options, ToolCallParser, ToolChoice, ToolSet, Vocab,
};

/// A vocabulary of single bytes plus the grammar's added tokens (256..259)
/// and an end token (259).
fn byte_vocab() -> Vocab {
    let bytes: Vec<[u8; 1]> = (0..=255u8).map(|b| [b]).collect();
    let mut toks: Vec<(u32, &[u8], bool)> =
        (0..256u32).map(|b| (b, &bytes[b as usize][..], false)).collect();
    toks.push((256, b"<tool_call>", true));
    toks.push((257, b"</tool_call>", true));
    toks.push((258, b"</think>", true));
    Vocab::new(260, toks)
}

/// Feeds `tokens` to a matcher of `g`, checking each against its own mask.
fn drive(g: Grammar, tokens: &[u8]) {
    let v = Arc::new(byte_vocab());
    let Ok(mut m) = Matcher::new(Arc::new(g), v.clone(), &[259]) else { return };
    let mut mask = alloc::vec![0u32; v.mask_words()];
    for &t in tokens.iter().take(256) {
        m.fill_mask(&mut mask);
        let allowed = crate::mask_allows(&mask, u32::from(t));
        assert_eq!(allowed, m.allows(u32::from(t)), "mask and allows disagree on {t}");
        if m.accept(u32::from(t)).is_err() {
            assert!(!allowed);
            return;
        }
    }
}

/// Input: `SCHEMA_JSON \0 BYTES`: compiles the schema (strict and lenient)
/// and drives a matcher with the bytes.
pub fn schema(data: &[u8]) {
    let (schema, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = core::str::from_utf8(schema) else { return };
    let Ok(v) = Value::parse(text) else { return };
    let _ = Grammar::json_schema(&v, Options::default());
    let lenient =
        Options { ignore_unsupported: true, think: rest.first() == Some(&b'T'), max_ws: 4 };
    if let Ok(g) = Grammar::json_schema(&v, lenient) {
        drive(g, rest);
    }
}

/// Input: `TOOLS_JSON \0 ANSWER_TEXT`: reads the tools, parses the answer
/// whole and in chunks (the same result), and drives a `required` matcher.
pub fn tool_calls(data: &[u8]) {
    let (tools, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"[]"[..], data),
    };
    let Ok(text) = core::str::from_utf8(tools) else { return };
    let Ok(v) = Value::parse(text) else { return };
    let Ok(set) = ToolSet::from_openai(&v) else { return };
    let answer = alloc::string::String::from_utf8_lossy(rest);
    let whole = parse_tool_calls(&answer, &set);
    let mut p = ToolCallParser::new(set.clone());
    let mut calls = Vec::new();
    let mut failed = false;
    let chars: Vec<char> = answer.chars().collect();
    for chunk in chars.chunks(3) {
        let s: alloc::string::String = chunk.iter().collect();
        match p.push(&s) {
            Ok(events) => calls.extend(events),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    if !failed {
        match p.finish() {
            Ok(events) => calls.extend(events),
            Err(_) => failed = true,
        }
    }
    let streamed: Vec<_> = calls
        .into_iter()
        .filter_map(|e| match e {
            crate::Event::CallEnd { call, .. } => Some(call),
            _ => None,
        })
        .collect();
    match whole {
        Ok((_, want)) => assert!(!failed && streamed == want, "streamed and whole parses differ"),
        Err(_) => assert!(failed, "a chunked parse accepted what the whole parse refused"),
    }
    if let Ok(g) = Grammar::tools(set, ToolChoice::Required, true, Options::default()) {
        drive(g, rest);
    }
}
