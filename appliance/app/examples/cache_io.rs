//! What a prefix-cache checkpoint costs on a real model shape (no weights
//! needed): bytes per cached position and per checkpoint (the one sizing,
//! `snapshot::Shape`), and the time to take one into the memory tier
//! (copy out of a state), restore it (copy into a state), encode its file,
//! write and read it back, and decode (check) it.
//!
//! `cargo run --release -p kore-appliance --example cache_io -- [PRESET] [TOKENS]`
//! (PRESET: qwen3.5-2b, qwen3.5-9b, ...; default qwen3.5-2b 8192). One run; the
//! machine's other load shows in the figures.

use std::time::Instant;

use kore_engine::snapshot::file::{self, Identity};
use kore_engine::snapshot::{self, Fixed, KvSpan, Shape};
use kore_engine::state::KvPrecision;
use kore_engine::State;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let preset = args.get(1).map_or("qwen3.5-2b", String::as_str);
    let n: usize = args.get(2).map_or(8192, |s| s.parse().expect("TOKENS: a number"));
    let cfg = kore_pack::synth::preset(preset).expect("a preset").to_model(n as u64 + 1);
    let shape = Shape::of(&cfg);
    let kv = KvPrecision::default();
    println!(
        "{preset}: {} B per cached position (KV {} + token id 4), {} B per checkpoint (fixed part)",
        shape.cache_bytes(1, 0, kv),
        shape.kv_bytes(1, kv),
        shape.fixed_bytes()
    );
    let mut state = State::new(&cfg);
    state.push_synthetic_context(&cfg, n, 7);
    let tokens: Vec<u32> = (0..n as u32).collect();
    let t = Instant::now();
    let span = KvSpan::capture(&state, 0..n);
    let fixed = Fixed::capture(&state);
    let take = ms(t);
    let mut other = State::new(&cfg);
    let t = Instant::now();
    snapshot::restore(&mut other, &[&span], &fixed).unwrap();
    let restore = ms(t);
    let id = Identity { pack: [1; 32], shape, kv };
    let t = Instant::now();
    let bytes = file::encode_to_vec(&id, &tokens, &[&span], &fixed);
    let encode = ms(t);
    let path = std::env::temp_dir().join(format!("kore-cache-io-{}.ckpt", std::process::id()));
    let t = Instant::now();
    std::fs::write(&path, &bytes).unwrap();
    let write = ms(t);
    drop(bytes);
    let t = Instant::now();
    let back = std::fs::read(&path).unwrap();
    let read = ms(t);
    let t = Instant::now();
    let d = file::decode(&back, &id).unwrap();
    let decode = ms(t);
    let _ = std::fs::remove_file(&path);
    assert_eq!(d.tokens.len(), n);
    let mb = back.len() as f64 / 1e6;
    println!(
        "{n} tokens, file {mb:.1} MB: take {take:.1} ms, restore {restore:.1} ms, encode \
         {encode:.1} ms, write {write:.1} ms, read {read:.1} ms (page cache), decode {decode:.1} ms"
    );
}
