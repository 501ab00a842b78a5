//! One sequence of [`crate::ModelEngine`]: its state, how it decodes, and
//! the limits that end it.
//!
//! Plain sequences (no drafting) keep the tokens they still have to run:
//! first the prompt, taken in chunks of the engine's prefill chunk size, then
//! the last sampled token. The engine runs every plain sequence's next input
//! in one batched forward ([`kore_engine::Model::forward_batch`]); a sequence
//! samples when its input was complete (the prompt's last chunk, or a decode
//! token). MTP sequences run kore-engine's [`Speculator`] on their own.

use alloc::boxed::Box;
use alloc::vec::Vec;

use alloc::string::String;

use kore_engine::{Sampler, SpecOptions, Speculator, State};
use kore_grammar::Matcher;
use kore_service::{EngineError, TokenLogprobs};

use crate::sessions::Checkpoint;

/// Tokens a chunk may leave behind at most before the rest joins it: a
/// prompt's tail of this many tokens or fewer runs with the chunk before it
/// (attention over a long context splits work differently for calls of at
/// most 16 tokens; keeping prompt chunks longer keeps prefill arithmetic
/// that of one call wherever the chunk size allows).
const MIN_TAIL: usize = 16;

/// How a sequence decodes.
pub(crate) enum Phase<'m> {
    /// One token a step, batched with the others.
    Plain {
        /// Token selection.
        sampler: Sampler,
        /// Tokens still to run: the rest of the prompt, or the last sample.
        input: Vec<u32>,
    },
    /// MTP drafting, before its first step: prompt, sampler and options.
    SpecPending { prompt: Vec<u32>, sampler: Sampler, opts: SpecOptions },
    /// MTP drafting after the prefill.
    Spec(Box<Speculator<'m, 'm>>),
}

/// A started sequence.
pub(crate) struct Seq<'m> {
    pub(crate) state: State,
    pub(crate) phase: Phase<'m>,
    pub(crate) generated: u32,
    pub(crate) max_tokens: u32,
    /// KV positions the sequence may use: prompt plus `max_tokens`.
    pub(crate) reserved: usize,
    pub(crate) ended: bool,
    /// The session the state is kept for when the sequence ends.
    pub(crate) session: Option<String>,
    /// Tokens the state has run (kept with it), tracked for sessions.
    pub(crate) ran: Vec<u32>,
    /// With a session: the position (tokens run) to checkpoint at inside
    /// the prompt; `None` checkpoints at the prompt's end.
    pub(crate) mark: Option<usize>,
    /// Checkpoints taken so far, for the session.
    pub(crate) checkpoints: Vec<Checkpoint>,
    /// With a session: the end of a prefix other sessions may share.
    pub(crate) shared_at: Option<usize>,
    /// The state at `shared_at`, once reached.
    pub(crate) shared: Option<Checkpoint>,
    /// Constrained decoding: the grammar's state, and its mask buffer.
    pub(crate) constraint: Option<Matcher>,
    pub(crate) mask: Vec<u32>,
    /// `Some(n)`: log-probabilities with `n` alternatives, kept until taken.
    pub(crate) logprobs: Option<u8>,
    pub(crate) taken_logprobs: Vec<TokenLogprobs>,
}

/// The next token from `logits`: plain sampling, or among the tokens the
/// constraint allows (greedy first tries the best token alone, which is the
/// masked argmax whenever it is allowed, and computes the mask only if not).
fn pick(sampler: &mut Sampler, m: Option<&mut Matcher>, mask: &mut Vec<u32>, l: &[f32]) -> u32 {
    let Some(m) = m else { return sampler.sample(l) };
    if sampler.params().is_greedy() {
        let best = kore_engine::sampling::argmax(l);
        if m.allows(best) {
            return best;
        }
    }
    mask.resize(m.vocab().mask_words(), 0);
    m.fill_mask(mask);
    sampler.sample_masked(l, mask)
}

impl Seq<'_> {
    /// Tokens of the next plain step (`None` for MTP sequences): at most
    /// `chunk` prompt tokens, all of them when only a short tail would be
    /// left, and whether this completes the input (then the step samples).
    pub(crate) fn next_input(&self, chunk: usize) -> Option<(usize, bool)> {
        let Phase::Plain { input, .. } = &self.phase else { return None };
        let len = input.len();
        let mut n = if len <= chunk + MIN_TAIL { len } else { chunk };
        for m in [self.mark, self.shared_at].into_iter().flatten() {
            if m > self.ran.len() && self.session.is_some() {
                n = n.min(m - self.ran.len());
            }
        }
        Some((n, n == len))
    }

    /// Takes a plain step's outcome: drops the `n` tokens that ran and, when
    /// `logits` came back, samples the next token into `out` (an error only
    /// if the constraint refuses what it allowed: a bug).
    pub(crate) fn absorb(
        &mut self,
        n: usize,
        logits: Option<&[f32]>,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        let Phase::Plain { sampler, input } = &mut self.phase else { return Ok(()) };
        if self.session.is_some() {
            self.ran.extend_from_slice(&input[..n]);
        }
        input.drain(..n);
        if self.session.is_some() && self.shared_at == Some(self.ran.len()) {
            let (tokens, state) = (self.ran.clone(), self.state.clone());
            self.shared = Some(Checkpoint { tokens, state });
        }
        let at_mark = self.mark == Some(self.ran.len());
        let prompt_end = logits.is_some() && self.generated == 0 && self.mark.is_none();
        if self.session.is_some() && (at_mark || prompt_end) {
            let (tokens, state) = (self.ran.clone(), self.state.clone());
            self.checkpoints.push(Checkpoint { tokens, state });
        }
        if let Some(l) = logits {
            let next = pick(sampler, self.constraint.as_mut(), &mut self.mask, l);
            if let Some(top) = self.logprobs {
                let lp = kore_engine::logprobs(l, next, top as usize);
                let (token, logprob, top) = (lp.token, lp.logprob, lp.top);
                self.taken_logprobs.push(TokenLogprobs { token, logprob, top });
            }
            if let Some(m) = &mut self.constraint {
                m.accept(next).map_err(|e| EngineError::Internal(alloc::format!("engine: {e}")))?;
            }
            input.clear();
            input.push(next);
            out.push(next);
        }
        Ok(())
    }

    /// Records tokens produced (already cut to the budget) and whether they end it.
    pub(crate) fn count(&mut self, produced: &[u32], stop_ids: &[u32]) {
        self.generated += produced.len() as u32;
        self.ended =
            produced.iter().any(|t| stop_ids.contains(t)) || self.generated >= self.max_tokens;
    }

    /// Tokens it may still produce.
    pub(crate) fn left(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated) as usize
    }
}
