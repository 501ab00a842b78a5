//! One sequence of [`crate::ModelEngine`]: its state, how it decodes, where
//! its prompt is cut into forward calls and checkpointed, and the limits
//! that end it.
//!
//! Plain sequences (no drafting) keep the tokens they still have to run:
//! first the prompt, in the calls [`plan`] cuts, then the last sampled
//! token. The engine runs every plain sequence's next input in one batched
//! forward ([`kore_engine::Model::forward_batch`]); a sequence samples when
//! its input was complete (the prompt's last call, or a decode token). MTP
//! sequences run kore-engine's [`Speculator`] on their own.

use alloc::boxed::Box;
use alloc::vec::Vec;

use kore_engine::{Sampler, SpecOptions, Speculator, State};
use kore_grammar::Matcher;
use kore_service::{EngineError, TokenLogprobs};

use crate::cache::Tier;

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
    /// Prompt tokens.
    pub(crate) prompt_len: usize,
    /// Tokens the state has run (plain sequences).
    pub(crate) ran: Vec<u32>,
    /// Where prompt calls end (absolute positions, ascending, the last one
    /// the prompt's end).
    pub(crate) cuts: Vec<usize>,
    /// Positions to checkpoint at (a subset of `cuts`).
    pub(crate) stops: Vec<usize>,
    /// Positions the caller asked to checkpoint at (message boundaries).
    pub(crate) wanted: Vec<usize>,
    /// Whether the state after the generation is worth keeping.
    pub(crate) keep_end: bool,
    /// Waiting for another sequence to checkpoint this position (then this
    /// one continues from there instead of prefilling the same tokens).
    pub(crate) wait: Option<usize>,
    /// Prompt tokens served from the cache, and from which tier.
    pub(crate) served: (u32, Option<Tier>),
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

/// Cuts a prompt of `len` tokens, of which the state has run `start`,
/// into forward calls: at every multiple of `chunk` and every `wanted`
/// position in between (any cut computes every token as one long call does,
/// `kore_engine::snapshot::cuts_exact`). Returns the call ends and the
/// `wanted` ones among them plus `len` when `wanted` is not empty (the
/// checkpoints).
pub(crate) fn plan(
    start: usize,
    len: usize,
    chunk: usize,
    wanted: &[usize],
) -> (Vec<usize>, Vec<usize>) {
    let chunk = chunk.max(1);
    let mut cuts: Vec<usize> = (start / chunk + 1..)
        .map(|k| k * chunk)
        .take_while(|&c| c < len)
        .chain(wanted.iter().copied().filter(|&w| w > start && w < len))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts.push(len);
    let stops = if wanted.is_empty() {
        Vec::new()
    } else {
        cuts.iter().copied().filter(|c| *c == len || wanted.contains(c)).collect()
    };
    (cuts, stops)
}

impl Seq<'_> {
    /// Tokens of the next plain step (`None` for MTP sequences and while
    /// waiting): up to the next cut in the prompt, and whether this
    /// completes the input (then the step samples).
    pub(crate) fn next_input(&self) -> Option<(usize, bool)> {
        let Phase::Plain { input, .. } = &self.phase else { return None };
        if self.wait.is_some() {
            return None;
        }
        let len = input.len();
        let at = self.ran.len();
        let n = self.cuts.iter().find(|&&c| c > at).map_or(len, |&c| (c - at).min(len));
        Some((n, n == len))
    }

    /// The prompt and every token run since, as far as known: what a
    /// follower can share with this sequence.
    pub(crate) fn known_tokens(&self) -> impl Iterator<Item = &u32> {
        let rest: &[u32] = match &self.phase {
            Phase::Plain { input, .. } if self.ran.len() < self.prompt_len => input,
            _ => &[],
        };
        self.ran.iter().chain(rest)
    }

    /// Takes a plain step's outcome: moves the `n` tokens that ran to `ran`
    /// and, when `logits` came back, samples the next token into `out`.
    /// Returns whether the state now sits at a checkpoint position (an
    /// error only if the constraint refuses what it allowed: a bug).
    pub(crate) fn absorb(
        &mut self,
        n: usize,
        logits: Option<&[f32]>,
        out: &mut Vec<u32>,
    ) -> Result<bool, EngineError> {
        let Phase::Plain { sampler, input } = &mut self.phase else { return Ok(false) };
        self.ran.extend_from_slice(&input[..n]);
        input.drain(..n);
        let at_stop = self.stops.contains(&self.ran.len());
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
        Ok(at_stop)
    }

    /// Whether the state after the generation is worth a checkpoint (it
    /// equals a prefill of the same tokens: decode steps compute as prefill
    /// calls do).
    pub(crate) fn keeps_end(&self) -> bool {
        self.keep_end && self.state.position() > self.prompt_len
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

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn plans_cut_at_chunk_multiples_and_wanted_positions() {
        // Absolute chunk multiples, a boundary, the end.
        assert_eq!(plan(0, 1300, 512, &[700]), (vec![512, 700, 1024, 1300], vec![700, 1300]));
        // From a checkpoint at 600: the next multiple, not 600 + 512.
        assert_eq!(plan(600, 1300, 512, &[]).0, vec![1024, 1300]);
        // Short calls anywhere: past 2048 too (a boundary 5 tokens before a
        // chunk multiple, 10 tokens after it).
        let (cuts, stops) = plan(0, 2570, 512, &[2555, 2570]);
        assert_eq!(cuts, vec![512, 1024, 1536, 2048, 2555, 2560, 2570]);
        assert_eq!(stops, vec![2555, 2570]);
        assert_eq!(plan(0, 530, 512, &[]).0, vec![512, 530]);
        // Without wanted positions there are no checkpoints.
        assert!(plan(0, 100, 512, &[]).1.is_empty());
    }
}
