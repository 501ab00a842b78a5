//! [`ModelEngine`]: `kore_service::Engine` over kore-engine.
//!
//! One request at a time, as the service schedules them:
//! - `start` checks the prompt against the vocabulary and the context limit
//!   and keeps it; nothing runs yet.
//! - the first `step` prefills the whole prompt in one batched forward (the
//!   same call `kore_engine::generate` makes, so greedy output is identical)
//!   and samples the first token; every later `step` runs one decode forward
//!   of the last token and samples the next.
//! - with MTP drafting (`mtp` > 0, the model has an MTP head) the steps are
//!   kore-engine's [`Speculator`]: the first step prefills and picks the first
//!   token, every later step drafts, verifies in one batch and returns the
//!   accepted drafts plus a bonus token (greedy output equals plain decoding;
//!   the service's `tokens_per_step` is then > 1).
//! - `finish` (end, cancel or failure) resets the sequence state, keeping its
//!   allocations for the next request.
//!
//! Stop tokens end a request in the service (the codec's stop ids); the
//! engine also refuses to step past one, or past `max_tokens` or the context
//! limit, so a caller bug cannot run the model off the end.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use kore_engine::spec::MAX_DRAFTS;
use kore_engine::{
    ForwardError, Logits, Model, MtpError, Sampler, SamplingParams, SpecOptions, Speculator, State,
};
use kore_service::{BenchReport, BenchRequest, Engine, EngineError, EngineInfo, GenParams};

use crate::bench::{self, NsClock};

/// How the current request decodes.
enum Decoder<'m> {
    /// One token a step.
    Plain {
        sampler: Sampler,
        /// The prompt, until the first step prefills it.
        prompt: Option<Vec<u32>>,
        /// The last sampled token (input of the next decode step).
        last: Option<u32>,
    },
    /// MTP drafting, before the first step: the prompt, sampler and options.
    SpecPending { prompt: Vec<u32>, sampler: Sampler, opts: SpecOptions },
    /// MTP drafting after the prefill.
    Spec(Box<Speculator<'m, 'm>>),
}

/// The request being generated.
struct Current<'m> {
    decoder: Decoder<'m>,
    generated: u32,
    max_tokens: u32,
    ended: bool,
}

/// The real engine behind the chat service: a model (borrowed for `'m`, so
/// that a speculative decoder can borrow it too), one reusable sequence
/// state, the stop ids and the context limit.
pub struct ModelEngine<'m> {
    model: &'m Model<'m>,
    name: String,
    state: State,
    stop_ids: Vec<u32>,
    context_limit: u32,
    default_mtp: u32,
    clock: Option<NsClock>,
    bench_bytes: usize,
    current: Option<Current<'m>>,
}

impl fmt::Debug for ModelEngine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelEngine")
            .field("name", &self.name)
            .field("context_limit", &self.context_limit)
            .field("default_mtp", &self.default_mtp)
            .field("busy", &self.current.is_some())
            .finish_non_exhaustive()
    }
}

impl<'m> ModelEngine<'m> {
    /// Serves `model` under `name`. The context limit is the model's
    /// `max_position_embeddings` (for a pack: its manifest's context length);
    /// `stop_ids` end a generation (normally the codec's stop ids). Requests
    /// without `mtp` decode one token a step (see [`Self::with_default_mtp`]).
    pub fn new(model: &'m Model<'m>, name: impl Into<String>, stop_ids: Vec<u32>) -> Self {
        let limit = u32::try_from(model.config.max_position_embeddings).unwrap_or(u32::MAX);
        let state = model.new_state();
        Self {
            model,
            name: name.into(),
            state,
            stop_ids,
            context_limit: limit,
            default_mtp: 0,
            clock: bench::default_clock(),
            bench_bytes: bench::DEFAULT_BUFFER_BYTES,
            current: None,
        }
    }

    /// Lowers the context limit to `limit` tokens (never above the model's).
    pub fn with_context_limit(mut self, limit: u32) -> Self {
        self.context_limit = self.context_limit.min(limit.max(1));
        self
    }

    /// Drafts per step for requests without `mtp` (used only when the model
    /// has an MTP head; at most kore-engine's `MAX_DRAFTS`).
    pub fn with_default_mtp(mut self, drafts: u32) -> Self {
        self.default_mtp = drafts.min(MAX_DRAFTS as u32);
        self
    }

    /// The clock `{"op":"bench"}` measures with (nanoseconds, monotonic).
    /// With feature `std` the default is `std::time::Instant`; without it
    /// there is none and bench answers `unsupported` until one is set.
    pub fn with_clock(mut self, clock: NsClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Bytes of the benchmark's read-bandwidth buffer (default 1 GiB, as
    /// `kore-launch bench --native`; halved while the allocation fails).
    pub fn with_bench_buffer(mut self, bytes: usize) -> Self {
        self.bench_bytes = bytes;
        self
    }

    /// The served model.
    pub fn model(&self) -> &'m Model<'m> {
        self.model
    }

    /// Tokens (prompt + generated) a request may use.
    pub fn context_limit(&self) -> u32 {
        self.context_limit
    }

    /// The decoder for a request asking for `mtp` drafts per step.
    fn decoder(&self, prompt: &[u32], params: &GenParams) -> Result<Decoder<'m>, EngineError> {
        let sampler = Sampler::new(sampling(params));
        let drafts = match params.mtp {
            Some(n) if n as usize > MAX_DRAFTS => {
                return Err(EngineError::BadParams(format!(
                    "mtp {n}: this engine drafts at most {MAX_DRAFTS} tokens per step"
                )))
            }
            Some(n) if n > 0 && !self.model.has_mtp() => {
                return Err(EngineError::BadParams(format!(
                    "mtp {n}: this model has no MTP head (no mtp.* weights); send \"mtp\": 0"
                )))
            }
            Some(n) => n as usize,
            None if self.model.has_mtp() => self.default_mtp as usize,
            None => 0,
        };
        if drafts == 0 {
            return Ok(Decoder::Plain { sampler, prompt: Some(prompt.to_vec()), last: None });
        }
        let vocab = self.model.config.vocab_size;
        let opts = SpecOptions {
            draft_vocab: kore_engine::spec::draft_vocab(vocab),
            ..SpecOptions::new(drafts)
        };
        Ok(Decoder::SpecPending { prompt: prompt.to_vec(), sampler, opts })
    }
}

/// Maps a forward failure to the service's error kinds.
fn forward_error(e: ForwardError) -> EngineError {
    match e {
        ForwardError::ContextFull { .. } => EngineError::PromptTooLong(e.to_string()),
        ForwardError::TokenOutOfRange { .. } | ForwardError::Empty => {
            EngineError::BadParams(e.to_string())
        }
        ForwardError::StateMismatch => EngineError::Internal(format!("engine: {e}")),
    }
}

fn mtp_error(e: MtpError) -> EngineError {
    match e {
        MtpError::Forward(f) => forward_error(f),
        other => EngineError::Internal(format!("engine: {other}")),
    }
}

fn sampling(p: &GenParams) -> SamplingParams {
    SamplingParams {
        temperature: p.temperature,
        top_k: p.top_k as usize,
        top_p: p.top_p,
        min_p: p.min_p,
        seed: p.seed,
    }
}

impl Engine for ModelEngine<'_> {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            model: self.name.clone(),
            context_limit: self.context_limit,
            vocab_size: u32::try_from(self.model.config.vocab_size).unwrap_or(u32::MAX),
        }
    }

    fn start(&mut self, prompt: &[u32], params: &GenParams) -> Result<(), EngineError> {
        if self.current.is_some() {
            return Err(EngineError::Internal(String::from(
                "engine: a request is already running (finish was not called)",
            )));
        }
        if prompt.is_empty() {
            return Err(EngineError::BadParams(String::from("the prompt has no tokens")));
        }
        let vocab = self.model.config.vocab_size;
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::BadParams(format!(
                "prompt token {bad} is outside the vocabulary 0..{vocab}"
            )));
        }
        let len = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        if len >= self.context_limit {
            return Err(EngineError::PromptTooLong(format!(
                "prompt is {len} tokens but the context limit is {} (prompt plus at least one \
                 generated token); shorten the prompt",
                self.context_limit
            )));
        }
        let decoder = self.decoder(prompt, params)?;
        let room = self.context_limit - len;
        self.current = Some(Current {
            decoder,
            generated: 0,
            max_tokens: params.max_tokens.min(room),
            ended: params.max_tokens == 0,
        });
        Ok(())
    }

    fn step(&mut self, out: &mut Vec<u32>) -> Result<(), EngineError> {
        let Some(mut cur) = self.current.take() else {
            return Err(EngineError::Internal(String::from("engine: step without a request")));
        };
        let result = self.step_current(&mut cur, out);
        self.current = Some(cur);
        result
    }

    fn finish(&mut self) {
        self.current = None;
        self.state.reset();
    }

    fn bench(&mut self, request: &BenchRequest) -> Result<BenchReport, EngineError> {
        if self.current.is_some() {
            return Err(EngineError::Internal(String::from(
                "engine: bench while a request is running (finish was not called)",
            )));
        }
        let clock = self.clock.ok_or_else(|| {
            EngineError::Unsupported(String::from(
                "this engine has no clock to measure with (ModelEngine::with_clock)",
            ))
        })?;
        bench::run(self.model, clock, self.bench_bytes, request)
    }
}

impl<'m> ModelEngine<'m> {
    fn step_current(
        &mut self,
        cur: &mut Current<'m>,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        if cur.ended || cur.generated >= cur.max_tokens {
            cur.ended = true;
            return Err(EngineError::Internal(String::from(
                "engine: step after the request ended (stop token, max_tokens or context limit)",
            )));
        }
        let start = out.len();
        let left = (cur.max_tokens - cur.generated) as usize;
        self.decode(&mut cur.decoder, left, out)?;
        out.truncate(start + left);
        let produced = &out[start..];
        cur.generated += produced.len() as u32;
        cur.ended =
            produced.iter().any(|t| self.stop_ids.contains(t)) || cur.generated >= cur.max_tokens;
        Ok(())
    }

    /// Runs one step of `decoder`, appending its tokens (at least one) to `out`.
    fn decode(
        &mut self,
        decoder: &mut Decoder<'m>,
        left: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        let model = self.model;
        match decoder {
            Decoder::Plain { sampler, prompt, last } => {
                let logits = match (prompt.take(), *last) {
                    (Some(p), _) => {
                        self.state.reset();
                        model.forward(&mut self.state, &p, Logits::Last)
                    }
                    (None, Some(t)) => model.forward(&mut self.state, &[t], Logits::Last),
                    (None, None) => {
                        return Err(EngineError::Internal(String::from("engine: no input")))
                    }
                }
                .map_err(forward_error)?;
                let next = sampler.sample(&logits);
                *last = Some(next);
                out.push(next);
            }
            Decoder::SpecPending { prompt, sampler, opts } => {
                self.state.reset();
                let sampler = core::mem::replace(sampler, Sampler::new(SamplingParams::greedy()));
                let sp = Speculator::start(model, &mut self.state, prompt, sampler, *opts)
                    .map_err(mtp_error)?;
                out.push(sp.pending());
                *decoder = Decoder::Spec(Box::new(sp));
            }
            // Drafts beyond the remaining budget would be wasted: `left - 1`.
            Decoder::Spec(sp) => {
                out.extend(sp.step(&mut self.state, left.saturating_sub(1)).map_err(mtp_error)?)
            }
        }
        Ok(())
    }
}
