//! The tokenizer's fuzz body (`kore_tokenizer::fuzz::run`, also the `tokenizer`
//! cargo-fuzz target) over pseudo-random text, ids and JSON, with the default
//! pack's tokenizer: so every `cargo test` exercises it without nightly.

use kore_tokenizer::{fuzz, Tokenizer};

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn fuzz_body_survives_random_cases() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../model-packs/tiny/tokenizer.json");
    let json = std::fs::read(path).expect("the default pack's tokenizer");
    let tok = Tokenizer::from_json(&json).unwrap();
    let samples: [&[u8]; 5] = [
        "Héllo wörld <|im_end|> 123  \n\t".as_bytes(),
        "日本語 テキスト 🙂".as_bytes(),
        b"\xf0\x9f",
        b"{\"model\":",
        &json[..300],
    ];
    let mut x = 0x1234_5678_9abc_def1u64;
    for i in 0..3_000 {
        let mode = (i % 3) as u8;
        let mut data = vec![mode];
        let base = samples[(next(&mut x) % 5) as usize];
        for _ in 0..next(&mut x) % 64 {
            match next(&mut x) % 3 {
                0 => data.push(next(&mut x) as u8),
                _ => data.push(base[(next(&mut x) as usize) % base.len()]),
            }
        }
        fuzz::run(&tok, &data);
    }
}
