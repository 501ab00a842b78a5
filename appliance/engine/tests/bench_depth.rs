//! `bench::run` with a context depth: the prompt and the decode steps run
//! after `depth` synthetic positions, the prompt whole or in chunks, and the
//! report says how many KV bytes a decode step read.

use std::path::PathBuf;
use std::time::Instant;

use kore_engine::bench::{self, BenchError, BenchOptions};
use kore_engine::hf::HfModelDir;
use kore_engine::state::KvPrecision;
use kore_engine::{EngineOptions, ForwardError};

fn fixture() -> HfModelDir {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixed_f32_untied");
    HfModelDir::open(&dir).unwrap()
}

#[test]
fn depth_puts_the_prompt_and_decode_after_that_much_context() {
    let hf = fixture();
    let mut model = hf.model().unwrap();
    let start = Instant::now();
    let clock = move || start.elapsed().as_nanos() as u64;
    let cfg = model.config.clone();
    let full = cfg.layer_types.iter().filter(|k| **k == kore_engine::LayerKind::Full).count();
    let per_position = 2 * full * cfg.num_key_value_heads * cfg.head_dim;
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        model.set_options(&EngineOptions { kv, ..Default::default() }).unwrap();
        // Chunk 0: the prompt in one forward; 2: forwards of 2, 2 and 1 tokens.
        for (depth, prefill_chunk) in [(0, 0), (300, 0), (0, 2), (300, 2)] {
            let opts = BenchOptions {
                prompt_tokens: 5,
                decode_tokens: 3,
                depth,
                prefill_chunk,
                ..Default::default()
            };
            let r = bench::run(&model, 1.0, &clock, &opts, &mut |_| {}).unwrap();
            assert_eq!(r.depth, depth);
            let want = (depth + 5) * per_position * kv.bytes();
            assert_eq!(r.kv_bytes_per_step as usize, want, "{kv:?} depth {depth}, {opts:?}");
            assert!(r.prefill_tok_per_s > 0.0 && r.decode_tok_per_s > 0.0);
        }
    }
}

#[test]
fn a_depth_past_the_context_is_refused() {
    let hf = fixture();
    let model = hf.model().unwrap();
    let clock = || 0u64;
    let max = model.config.max_position_embeddings;
    let opts =
        BenchOptions { prompt_tokens: 5, decode_tokens: 3, depth: max, ..Default::default() };
    let e = bench::run(&model, 1.0, &clock, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, BenchError::Forward(ForwardError::ContextFull { .. })), "{e:?}");
}
