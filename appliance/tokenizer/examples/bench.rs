//! Measures load time and encode throughput of a tokenizer.json.
//!
//! `cargo run --release -p kore-tokenizer --example bench -- TOKENIZER_JSON TEXT_FILE...`

use kore_tokenizer::Tokenizer;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((json_path, texts)) = args.split_first() else {
        eprintln!("usage: bench TOKENIZER_JSON TEXT_FILE...");
        std::process::exit(2);
    };
    let json = std::fs::read(json_path).expect("read tokenizer.json");
    let mut best_load = f64::MAX;
    let mut tok = None;
    for _ in 0..5 {
        let t = Instant::now();
        let loaded = Tokenizer::from_json(&json).expect("load");
        best_load = best_load.min(t.elapsed().as_secs_f64());
        tok = Some(loaded);
    }
    let tok = tok.expect("loaded");
    println!("load: {:.1} ms (best of 5, {:.1} MB json)", best_load * 1e3, json.len() as f64 / 1e6);
    for path in texts {
        let text = std::fs::read_to_string(path).expect("read text");
        let mut best = f64::MAX;
        let mut n = 0;
        for _ in 0..3 {
            let t = Instant::now();
            n = tok.encode(&text).len();
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{path}: {:.2} MB -> {n} tokens, encode {:.1} MB/s ({:.0} ns/token)",
            text.len() as f64 / 1e6,
            text.len() as f64 / 1e6 / best,
            best * 1e9 / n as f64
        );
    }
}
