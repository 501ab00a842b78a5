//! Micro-benchmark of constrained decoding's mask on a real vocabulary: the
//! time to build the grammar vocabulary, and per lexical state the time of
//! one full mask (and of the one-token fast path), single-threaded.
//!
//! `cargo run --release -p kore-appliance --example mask_bench -- TOKENIZER_JSON [VOCAB_SIZE]`
//! (Qwen3.5's: `bash scripts/tokenizer/make_qwen_tokenizer.sh`, vocabulary 248320).

use std::sync::Arc;
use std::time::Instant;

use kore_appliance::grammar_vocab;
use kore_grammar::json::Value;
use kore_grammar::{Grammar, Matcher, Options, ToolChoice, ToolSet};
use kore_tokenizer::Tokenizer;

const SCHEMA: &str = r#"{"type":"object","properties":{"title":{"type":"string"},
  "count":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},
  "meta":{"type":"object","additionalProperties":true}},"required":["title","count"]}"#;

const TOOLS: &str = r#"[{"type":"function","function":{"name":"write_file","parameters":{
  "type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"},
  "mode":{"type":"integer"}},"required":["path","content"]}}}]"#;

/// Median and worst microseconds of `runs` calls of `f`.
fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[t.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().expect("usage: mask_bench TOKENIZER_JSON [VOCAB_SIZE]");
    let tok = Tokenizer::from_file(path).expect("tokenizer");
    let size: usize = args.get(1).map_or(248_320, |s| s.parse().expect("vocab size"));
    let t = Instant::now();
    let vocab = Arc::new(grammar_vocab(&tok, size));
    println!(
        "vocabulary: {} ids, trie {} nodes, built in {:.0} ms",
        size,
        vocab.trie_nodes(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let ends: Vec<u32> =
        ["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| tok.token_to_id(t)).collect();
    let json =
        Arc::new(Grammar::json_schema(&Value::parse(SCHEMA).unwrap(), Options::default()).unwrap());
    let tools = ToolSet::from_openai(&Value::parse(TOOLS).unwrap()).unwrap();
    let auto = Arc::new(
        Grammar::tools(tools.clone(), ToolChoice::Auto, true, Options::default()).unwrap(),
    );
    let long = "The quick brown fox jumps over the lazy dog while the committee debates the budget";
    let raw = format!("Sure.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\n{long}\nfn main() {{ if a < b");
    let states: [(&str, &Arc<Grammar>, String); 9] = [
        ("start of the value", &json, String::new()),
        ("object, expecting a key", &json, "{\"title\": \"x\", ".into()),
        ("inside a long string", &json, format!("{{\"title\": \"{long}")),
        ("string, after a backslash", &json, format!("{{\"title\": \"{long} \\")),
        ("inside a number", &json, "{\"title\": \"x\", \"count\": 12".into()),
        ("any-object key", &json, "{\"title\": \"x\", \"count\": 1, \"meta\": {\"".into()),
        ("free text before a call", &auto, format!("{long} ")),
        ("raw parameter text", &auto, raw.clone()),
        ("raw text inside </param", &auto, format!("{raw}\n</param")),
    ];
    let mut mask = vec![0u32; vocab.mask_words()];
    println!(
        "{:<28} {:>9} {:>11} {:>11} {:>13}",
        "state", "allowed", "mask med us", "mask max us", "fast path us"
    );
    for (name, g, text) in states.iter() {
        let mut m = Matcher::new((*g).clone(), vocab.clone(), &ends).unwrap();
        for id in tok.encode(text) {
            m.accept(id).unwrap_or_else(|e| panic!("{name}: {e} in {text:?}"));
        }
        m.fill_mask(&mut mask);
        let allowed: u32 = mask.iter().map(|w| w.count_ones()).sum();
        let (med, max) = time(30, || m.fill_mask(&mut mask));
        let probe = tok.encode(" the")[0];
        let (fast, _) = time(200, || {
            std::hint::black_box(m.allows(probe));
        });
        println!("{name:<28} {allowed:>9} {med:>11.0} {max:>11.0} {fast:>13.1}");
    }
}
