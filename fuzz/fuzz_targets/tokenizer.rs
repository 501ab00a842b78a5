//! The tokenizer on arbitrary text, ids and tokenizer.json (`kore_tokenizer::fuzz::run`),
//! with the default pack's tokenizer.
#![no_main]

use libfuzzer_sys::fuzz_target;

use std::sync::OnceLock;

use kore_tokenizer::Tokenizer;

static JSON: &[u8] = include_bytes!("../../model-packs/tiny/tokenizer.json");

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_json(JSON).expect("the default pack's tokenizer"))
}

fuzz_target!(|data: &[u8]| kore_tokenizer::fuzz::run(tokenizer(), data));
