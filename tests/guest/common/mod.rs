//! Shared by the appliance boot tests: the tiny pack and the host engine as reference.
#![allow(dead_code)]

pub mod client;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The appliance's readiness marker (`READY_MARKER` in appliance/src/main.rs).
pub const READY_MARKER: u32 = b'R' as u32;

/// The default pack, `model-packs/tiny`.
pub fn tiny_pack() -> &'static Path {
    static PACK: OnceLock<PathBuf> = OnceLock::new();
    PACK.get_or_init(kore_e2e::tiny_pack)
}

pub fn pack_files(dir: &Path) -> Vec<PathBuf> {
    ["pack.toml", "weights.safetensors", "tokenizer.json"].iter().map(|f| dir.join(f)).collect()
}

/// The host engine's greedy continuation over the same pack.
pub fn host_greedy(pack_dir: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let pack = kore_pack::Pack::open(pack_dir).unwrap();
    let model = pack.model().unwrap();
    let mut state = model.new_state();
    let opts = kore_engine::GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
        sampling: kore_engine::SamplingParams::greedy(),
    };
    kore_engine::generate(&model, &mut state, prompt, &opts, |_| true).unwrap().tokens
}

/// The host engine's greedy continuation with the service's stop ids (the config's EOS ids,
/// `<|im_end|>`, `<|endoftext|>`): (ids, finish).
pub fn host_generate(prompt: &[u32], n: usize) -> (Vec<u32>, &'static str) {
    let dir = tiny_pack();
    let pack = kore_pack::Pack::open(dir).unwrap();
    let model = pack.model().unwrap();
    let tok = kore_tokenizer::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let mut stops = model.config.eos_token_ids.clone();
    stops.extend(["<|im_end|>", "<|endoftext|>"].iter().filter_map(|t| tok.token_to_id(t)));
    let mut state = model.new_state();
    let opts = kore_engine::GenerateOptions {
        max_tokens: n,
        stop_tokens: stops,
        sampling: kore_engine::SamplingParams::greedy(),
    };
    let g = kore_engine::generate(&model, &mut state, prompt, &opts, |_| true).unwrap();
    let finish = if g.stop == kore_engine::StopReason::StopToken { "stop" } else { "length" };
    (g.tokens, finish)
}
