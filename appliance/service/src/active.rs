//! A request the service is generating: where its output goes, what it
//! produced so far, and its timings (the `done` event's `stats`).

use alloc::string::String;
use alloc::vec::Vec;

use crate::connection::ConnId;
use crate::emit::Emitter;
use kore_protocol::{Id, Stats, TokenLogprob};

/// A request being generated.
#[derive(Debug)]
pub(crate) struct Active<D> {
    pub(crate) conn: ConnId,
    pub(crate) id: Id,
    pub(crate) key: String,
    pub(crate) chat: bool,
    pub(crate) prompt_tokens: u32,
    pub(crate) cached_tokens: u32,
    pub(crate) cache_tier: Option<&'static str>,
    pub(crate) max_tokens: u32,
    pub(crate) emitter: Emitter<D>,
    pub(crate) tokens: Vec<u32>,
    /// Log-probabilities of `tokens`, when the request asked.
    pub(crate) logprobs: Option<Vec<TokenLogprob>>,
    /// How many of `logprobs` deltas have carried so far.
    pub(crate) logprobs_sent: usize,
    pub(crate) t_start: u64,
    pub(crate) t_first: Option<u64>,
    pub(crate) t_last: u64,
    pub(crate) decode_tokens: u32,
    pub(crate) decode_steps: u32,
}

impl<D> Active<D> {
    /// The log-probabilities for a step's `events` delta events: those no
    /// delta has carried yet, counted as carried now (`None`: the request
    /// did not ask, none are new, or there is no event to carry them; they
    /// wait for the next one, or `done` has them).
    pub(crate) fn logprobs_to_send(&mut self, events: usize) -> Option<Vec<TokenLogprob>> {
        let list = self.logprobs.as_ref()?;
        if events == 0 || list.len() <= self.logprobs_sent {
            return None;
        }
        let new = list[self.logprobs_sent..].to_vec();
        self.logprobs_sent = list.len();
        Some(new)
    }

    /// The `done` event's measurements.
    pub(crate) fn stats(&self, context_limit: u32) -> Stats {
        let a = self;
        let generated = a.tokens.len() as u32;
        let ms = |ns: u64| ns as f64 / 1.0e6;
        let per_s = |n: u32, ns: u64| if ns == 0 { 0.0 } else { f64::from(n) * 1.0e9 / ns as f64 };
        let prefill_ns = a.t_first.map_or(0, |t| t.saturating_sub(a.t_start));
        let decode_ns = a.t_first.map_or(0, |t| a.t_last.saturating_sub(t));
        Stats {
            prompt_tokens: a.prompt_tokens,
            cached_tokens: a.cached_tokens,
            cache_tier: a.cache_tier.filter(|_| a.cached_tokens > 0).map(String::from),
            generated_tokens: generated,
            prefill_ms: round3(ms(prefill_ns)),
            prefill_tok_per_s: round3(per_s(a.prompt_tokens, prefill_ns)),
            decode_tok_per_s: round3(per_s(a.decode_tokens, decode_ns)),
            tokens_per_step: if a.decode_steps == 0 {
                0.0
            } else {
                round3(f64::from(a.decode_tokens) / f64::from(a.decode_steps))
            },
            context_used: a.prompt_tokens + generated,
            context_limit,
        }
    }
}

/// Rounds to 3 decimals (without `std`); non-finite values become 0.
fn round3(x: f64) -> f64 {
    if !x.is_finite() || x.abs() > 1.0e15 {
        return 0.0;
    }
    let scaled = x * 1000.0;
    let r = if scaled >= 0.0 { scaled + 0.5 } else { scaled - 0.5 };
    (r as i64) as f64 / 1000.0
}
