//! [`ModelEngine`]: `kore_service::Engine` over kore-engine.
//!
//! One request at a time, as the service schedules them:
//! - `start` checks the prompt against the vocabulary and the context limit
//!   and keeps it; nothing runs yet.
//! - the first `step` prefills the whole prompt in one batched forward (the
//!   same call `kore_engine::generate` makes, so greedy output is identical)
//!   and samples the first token; every later `step` runs one decode forward
//!   of the last token and samples the next.
//! - `finish` (end, cancel or failure) resets the sequence state, keeping its
//!   allocations for the next request.
//!
//! Stop tokens end a request in the service (the codec's stop ids); the
//! engine also refuses to step past one, or past `max_tokens` or the context
//! limit, so a caller bug cannot run the model off the end.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use kore_engine::{ForwardError, Logits, Model, Sampler, SamplingParams, State};
use kore_service::{BenchReport, BenchRequest, Engine, EngineError, EngineInfo, GenParams};

/// The request being generated.
#[derive(Debug)]
struct Current {
    /// The prompt, until the first step prefills it.
    prompt: Option<Vec<u32>>,
    sampler: Sampler,
    /// The last sampled token (input of the next decode step).
    last: Option<u32>,
    generated: u32,
    max_tokens: u32,
    ended: bool,
}

/// The real engine behind the chat service: a model (borrowing its weights
/// for `'m`), one reusable sequence state, the stop ids and the context limit.
#[derive(Debug)]
pub struct ModelEngine<'m> {
    model: Model<'m>,
    name: String,
    state: State,
    stop_ids: Vec<u32>,
    context_limit: u32,
    current: Option<Current>,
}

impl<'m> ModelEngine<'m> {
    /// Serves `model` under `name`. The context limit is the model's
    /// `max_position_embeddings` (for a pack: its manifest's context length);
    /// `stop_ids` end a generation (normally the codec's stop ids).
    pub fn new(model: Model<'m>, name: impl Into<String>, stop_ids: Vec<u32>) -> Self {
        let limit = u32::try_from(model.config.max_position_embeddings).unwrap_or(u32::MAX);
        let state = model.new_state();
        Self { model, name: name.into(), state, stop_ids, context_limit: limit, current: None }
    }

    /// Lowers the context limit to `limit` tokens (never above the model's).
    pub fn with_context_limit(mut self, limit: u32) -> Self {
        self.context_limit = self.context_limit.min(limit.max(1));
        self
    }

    /// The served model.
    pub fn model(&self) -> &Model<'m> {
        &self.model
    }

    /// Tokens (prompt + generated) a request may use.
    pub fn context_limit(&self) -> u32 {
        self.context_limit
    }

    /// Runs the prefill of `prompt`; returns the logits of its last position.
    fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.state.reset();
        self.model.forward(&mut self.state, prompt, Logits::Last).map_err(forward_error)
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
        // MTP drafting (`params.mtp`) is not in kore-engine yet: requests
        // decode one token per step, which the stats report (tokens_per_step 1).
        let room = self.context_limit - len;
        self.current = Some(Current {
            prompt: Some(prompt.to_vec()),
            sampler: Sampler::new(sampling(params)),
            last: None,
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
        let _ = request;
        Err(EngineError::Unsupported(String::from(
            "the in-guest benchmark is not available: kore-engine has no benchmark entry point \
             yet; run `kore-launch bench --native` on the host",
        )))
    }
}

impl ModelEngine<'_> {
    fn step_current(&mut self, cur: &mut Current, out: &mut Vec<u32>) -> Result<(), EngineError> {
        if cur.ended || cur.generated >= cur.max_tokens {
            cur.ended = true;
            return Err(EngineError::Internal(String::from(
                "engine: step after the request ended (stop token, max_tokens or context limit)",
            )));
        }
        let logits = match (cur.prompt.take(), cur.last) {
            (Some(prompt), _) => self.prefill(&prompt)?,
            (None, Some(last)) => {
                self.model.forward(&mut self.state, &[last], Logits::Last).map_err(forward_error)?
            }
            (None, None) => return Err(EngineError::Internal(String::from("engine: no input"))),
        };
        let next = cur.sampler.sample(&logits);
        cur.last = Some(next);
        cur.generated += 1;
        cur.ended = self.stop_ids.contains(&next) || cur.generated >= cur.max_tokens;
        out.push(next);
        Ok(())
    }
}
