//! `selftest=N`: greedy generation on the console, for boot tests of pack + engine + tokenizer
//! without a vsock device.

use alloc::vec::Vec;

use kore_engine::{generate, GenerateOptions, Model, SamplingParams};
use kore_rt::{clock, println};
use kore_tokenizer::Tokenizer;

use crate::{announce_ready, exit, SELFTEST_TEXT};

/// Generates `n` greedy tokens (no stop tokens) and prints prompt and output ids.
pub fn run(model: &Model<'_>, tok: &Tokenizer, n: usize, prompt: Option<&[u32]>) -> u32 {
    let prompt: Vec<u32> = match prompt {
        Some(p) => p.to_vec(),
        None => tok.encode(SELFTEST_TEXT),
    };
    announce_ready("selftest");
    let opts = GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
        sampling: SamplingParams::greedy(),
    };
    let mut state = model.new_state();
    let t0 = clock::now_ns();
    let mut first_ns = 0;
    let r = generate(model, &mut state, &prompt, &opts, |_| {
        if first_ns == 0 {
            first_ns = clock::now_ns() - t0;
        }
        true
    });
    let total_ns = clock::now_ns() - t0;
    let g = match r {
        Ok(g) => g,
        Err(e) => {
            println!("kore-appliance: selftest failed: {e}");
            return exit::ENGINE;
        }
    };
    let decode_ns = total_ns - first_ns;
    let decoded = g.tokens.len().saturating_sub(1);
    println!(
        "kore-appliance: selftest prefill {} tokens in {} us, decode {} tokens in {} us",
        prompt.len(),
        first_ns / 1000,
        decoded,
        decode_ns / 1000
    );
    println!("kore-appliance: selftest text={:?}", tok.decode(&g.tokens));
    println!("kore-appliance: selftest prompt_ids={:?} ids={:?}", prompt, g.tokens);
    0
}
