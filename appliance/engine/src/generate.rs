//! The generation loop: prefill a prompt in one batched forward, then decode
//! one token at a time until a stop token or the token limit.

use alloc::vec::Vec;

use crate::model::{ForwardError, Logits, Model};
use crate::sampling::{Sampler, SamplingParams};
use crate::state::State;

/// Options of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation ends after any of these is produced (it is included in the output).
    pub stop_tokens: Vec<u32>,
    /// Token selection.
    pub sampling: SamplingParams,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token was produced.
    StopToken,
    /// `max_tokens` were produced.
    MaxTokens,
    /// The callback asked to stop.
    Cancelled,
}

/// Result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The generated ids (not the prompt).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub stop: StopReason,
}

/// Generates a continuation of `prompt` into `state` (which may already hold
/// earlier tokens). `on_token` sees each new token and returns `false` to stop.
pub fn generate(
    model: &Model<'_>,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation, ForwardError> {
    let mut sampler = Sampler::new(opts.sampling);
    let mut tokens = Vec::new();
    if opts.max_tokens == 0 {
        model.forward_hidden(state, prompt)?;
        return Ok(Generation { tokens, stop: StopReason::MaxTokens });
    }
    let mut logits = model.forward(state, prompt, Logits::Last)?;
    loop {
        let next = sampler.sample(&logits);
        tokens.push(next);
        if !on_token(next) {
            return Ok(Generation { tokens, stop: StopReason::Cancelled });
        }
        if opts.stop_tokens.contains(&next) {
            return Ok(Generation { tokens, stop: StopReason::StopToken });
        }
        if tokens.len() >= opts.max_tokens {
            return Ok(Generation { tokens, stop: StopReason::MaxTokens });
        }
        logits = model.forward(state, &[next], Logits::Last)?;
    }
}
