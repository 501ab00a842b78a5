//! [`ModelEngine`]: `kore_service::Engine` over kore-engine.
//!
//! Up to [`ModelEngine::max_sequences`] requests at once, as the service
//! schedules them:
//! - `start` checks the prompt against the vocabulary and the context limit
//!   and keeps it with a fresh sequence state; nothing runs yet.
//! - every `step` runs one forward over every plain (non-drafting) sequence
//!   ([`kore_engine::Model::forward_batch`]: weights read once per step): a
//!   prefill chunk of at most the prefill chunk size for a sequence still in
//!   its prompt, one token for a decoding one. A sequence samples its next
//!   token when its prompt's last chunk or its decode token ran. Each
//!   sequence's tokens are those it gets alone (see kore-engine's
//!   `tests/batch.rs` for the arithmetic).
//! - with MTP drafting (`mtp` > 0, the model has an MTP head) a sequence runs
//!   kore-engine's [`Speculator`] on its own within the step (drafting does
//!   not batch yet): the first step prefills and picks the first token, every
//!   later step drafts, verifies in one batch and returns the accepted drafts
//!   plus a bonus token (greedy output equals plain decoding).
//! - `finish` (end, cancel or failure) drops the sequence, keeping its state's
//!   allocations for the next one.
//! - the prefix cache ([`crate::cache`], [`prefix`]): `start` resumes from the
//!   deepest usable checkpoint of the prompt (memory, else the store), or
//!   waits for a running sequence about to checkpoint a longer shared
//!   prefix; plain sequences checkpoint at message boundaries, every
//!   checkpoint interval, the prompt's end and (raw prompts) the
//!   generation's end.
//!
//! Stop tokens end a request in the service (the codec's stop ids); the
//! engine also refuses to step a sequence past one, or past `max_tokens` or
//! the context limit, so a caller bug cannot run the model off the end.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use alloc::sync::Arc;
use kore_engine::spec::MAX_DRAFTS;
use kore_engine::{
    ForwardError, Model, MtpError, Sampler, SamplingParams, SeqInput, SpecOptions, Speculator,
    State,
};
use kore_grammar::{Matcher, Vocab};
use kore_service::{
    BenchReport, BenchRequest, Engine, EngineError, EngineInfo, GenParams, SeqId, StepOut,
    TokenLogprobs,
};

use crate::bench::{self, BufferAlloc, NsClock};
use crate::cache::{CheckpointStore, PrefixCache};
use crate::seq::{Phase, Seq};

mod prefix;

/// Sequences run together by default (see [`ModelEngine::with_max_sequences`]).
pub const DEFAULT_MAX_SEQUENCES: usize = 8;

/// Prompt tokens one sequence prefills per step by default.
pub const DEFAULT_PREFILL_CHUNK: usize = kore_engine::PREFILL_CHUNK;

/// Bytes of the prefix cache's memory tier by default (see [`ModelEngine::with_cache_budget`]).
pub const DEFAULT_CACHE_BYTES: usize = 512 << 20;

/// Prompt positions between checkpoints inside long prompts by default
/// (see [`ModelEngine::with_checkpoint_interval`]).
pub const DEFAULT_CHECKPOINT_INTERVAL: usize = 2048;

/// The real engine behind the chat service: a model (borrowed for `'m`, so
/// that a speculative decoder can borrow it too), the running sequences, the
/// stop ids and the limits.
pub struct ModelEngine<'m> {
    model: &'m Model<'m>,
    name: String,
    seqs: BTreeMap<SeqId, Seq<'m>>,
    /// States of finished sequences, reset, kept for their allocations.
    spare: Vec<State>,
    max_sequences: usize,
    /// KV positions all running sequences may reserve together (`None`: no limit).
    kv_token_budget: Option<usize>,
    prefill_chunk: usize,
    cache: PrefixCache,
    checkpoint_interval: usize,
    store: Option<(alloc::boxed::Box<dyn CheckpointStore + 'm>, [u8; 32])>,
    stop_ids: Vec<u32>,
    context_limit: u32,
    default_mtp: u32,
    bench: bench::Setup,
    /// The vocabulary constrained decoding masks over, once built.
    vocab: Option<Arc<Vocab>>,
    /// What builds it on the first constrained request (the tables take
    /// 0.4-0.5 s that a start serving no such request never spends).
    vocab_source: Option<(Arc<kore_tokenizer::Tokenizer>, usize)>,
}

impl fmt::Debug for ModelEngine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelEngine")
            .field("name", &self.name)
            .field("context_limit", &self.context_limit)
            .field("default_mtp", &self.default_mtp)
            .field("running", &self.seqs.len())
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
        Self {
            model,
            name: name.into(),
            seqs: BTreeMap::new(),
            spare: Vec::new(),
            max_sequences: DEFAULT_MAX_SEQUENCES,
            kv_token_budget: None,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            cache: PrefixCache::new(
                kore_engine::snapshot::Shape::of(&model.config),
                DEFAULT_CACHE_BYTES,
            ),
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            store: None,
            stop_ids,
            context_limit: limit,
            default_mtp: 0,
            bench: bench::Setup::default(),
            vocab: None,
            vocab_source: None,
        }
    }

    /// Runs at most `n` sequences together (at least 1); the service queues
    /// further requests. Each sequence's KV cache grows with its context, up
    /// to the context limit.
    pub fn with_max_sequences(mut self, n: usize) -> Self {
        self.max_sequences = n.max(1);
        self
    }

    /// KV positions a request of `prompt_tokens` may use: the prompt plus
    /// `max_tokens`, clamped to the room the context limit leaves.
    fn reservation(&self, prompt_tokens: usize, max_tokens: u32) -> usize {
        let room =
            self.context_limit.saturating_sub(u32::try_from(prompt_tokens).unwrap_or(u32::MAX));
        prompt_tokens + max_tokens.min(room) as usize
    }

    /// Starts a sequence only while the running ones' prompts plus
    /// `max_tokens` and its own add up to at most `tokens` KV positions (the
    /// guest's memory is sized for its context: one full-context sequence,
    /// or several shorter ones); the service queues the rest.
    pub fn with_kv_token_budget(mut self, tokens: usize) -> Self {
        self.kv_token_budget = Some(tokens.max(1));
        self
    }

    /// Prefills at most `tokens` prompt tokens of a sequence per step, so
    /// that a long prompt does not stall the others' decoding (at least 1).
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = tokens.max(1);
        self
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
        self.bench.clock = Some(clock);
        self
    }

    /// Bytes of the benchmark's read-bandwidth buffer (default 1 GiB, as
    /// `kore-launch bench --native`; halved while the allocation fails).
    pub fn with_bench_buffer(mut self, bytes: usize) -> Self {
        self.bench.buffer_bytes = bytes;
        self
    }

    /// Serves constrained decoding (`GenParams::constraint`) over `vocab`
    /// ([`crate::grammar_vocab`] of the served tokenizer); without it such
    /// requests are refused as unsupported.
    pub fn with_grammar_vocab(mut self, vocab: Arc<Vocab>) -> Self {
        self.vocab = Some(vocab);
        self
    }

    /// As [`Self::with_grammar_vocab`], the vocabulary of `tokenizer` for
    /// `vocab_size` ids built by the first constrained request.
    pub fn with_grammar_tokenizer(
        mut self,
        tokenizer: Arc<kore_tokenizer::Tokenizer>,
        vocab_size: usize,
    ) -> Self {
        self.vocab_source = Some((tokenizer, vocab_size));
        self
    }

    /// Whether the constrained-decoding vocabulary has been built.
    pub fn grammar_vocab_built(&self) -> bool {
        self.vocab.is_some()
    }

    /// The constraint's matcher for a request, if it has one.
    fn matcher(&mut self, params: &GenParams) -> Result<Option<Matcher>, EngineError> {
        let Some(g) = &params.constraint else { return Ok(None) };
        if self.vocab.is_none() {
            let build = |(t, size): &(Arc<kore_tokenizer::Tokenizer>, usize)| {
                Arc::new(crate::grammar_vocab(t, *size))
            };
            self.vocab = self.vocab_source.as_ref().map(build);
        }
        let v = self.vocab.clone().ok_or_else(|| {
            EngineError::Unsupported(String::from(
                "this engine has no vocabulary for constrained decoding (ModelEngine::with_grammar_vocab)",
            ))
        })?;
        let m = Matcher::new(g.clone(), v, &self.stop_ids);
        m.map(Some).map_err(|e| EngineError::BadParams(e.to_string()))
    }

    /// How the benchmark allocates its read-bandwidth buffer.
    pub fn with_bench_alloc(mut self, alloc: BufferAlloc) -> Self {
        self.bench.alloc = alloc;
        self
    }

    /// The benchmark prompt's ids (cycled to its length; ids outside the
    /// vocabulary are dropped); empty: `kore_engine::bench::prompt`.
    pub fn with_bench_prompt(mut self, ids: Vec<u32>) -> Self {
        self.bench.prompt = ids;
        self
    }

    /// The ids that end a generation.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The served model.
    pub fn model(&self) -> &'m Model<'m> {
        self.model
    }

    /// Tokens (prompt + generated) a request may use.
    pub fn context_limit(&self) -> u32 {
        self.context_limit
    }

    /// The decoding phase for a request asking for `mtp` drafts per step.
    fn phase(&self, prompt: &[u32], params: &GenParams) -> Result<Phase<'m>, EngineError> {
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
        // Drafting checks neither constraints nor log-probabilities: one token a step.
        let plain_only = params.constraint.is_some() || params.logprobs.is_some();
        let drafts = if plain_only { 0 } else { drafts };
        if drafts == 0 {
            return Ok(Phase::Plain { sampler, input: prompt.to_vec() });
        }
        let vocab = self.model.config.vocab_size;
        let opts = SpecOptions {
            draft_vocab: kore_engine::spec::draft_vocab(vocab),
            ..SpecOptions::new(drafts)
        };
        Ok(Phase::SpecPending { prompt: prompt.to_vec(), sampler, opts })
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

    fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    fn has_room(&self, prompt_tokens: usize, max_tokens: u32) -> bool {
        let Some(budget) = self.kv_token_budget else { return true };
        let wanted = self.reservation(prompt_tokens, max_tokens);
        let reserved: usize = self.seqs.values().map(|s| s.reserved).sum();
        reserved + wanted <= budget
    }

    fn start(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        params: &GenParams,
    ) -> Result<u32, EngineError> {
        if self.seqs.len() >= self.max_sequences || self.seqs.contains_key(&seq) {
            return Err(EngineError::Internal(format!(
                "engine: cannot start sequence {seq} ({} of {} running, ids must be new)",
                self.seqs.len(),
                self.max_sequences
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
        let phase = self.phase(prompt, params)?;
        let constraint = self.matcher(params)?;
        let room = self.context_limit - len;
        let plain = matches!(phase, Phase::Plain { .. });
        let mut entry = Seq {
            state: self.spare.pop().unwrap_or_else(|| self.model.new_state()),
            phase,
            generated: 0,
            max_tokens: params.max_tokens.min(room),
            reserved: self.reservation(prompt.len(), params.max_tokens),
            ended: params.max_tokens == 0,
            prompt_len: prompt.len(),
            ran: Vec::new(),
            cuts: Vec::new(),
            stops: Vec::new(),
            wanted: Vec::new(),
            keep_end: plain && params.checkpoint_at.is_none(),
            wait: None,
            served: (0, None),
            constraint,
            mask: Vec::new(),
            logprobs: params.logprobs,
            taken_logprobs: Vec::new(),
        };
        if plain {
            self.resume(&mut entry, prompt, params);
        }
        let cached = entry.served.0;
        self.seqs.insert(seq, entry);
        Ok(cached)
    }

    fn cached_tokens(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).map(|s| s.served.0)
    }

    fn cache_tier(&self, seq: SeqId) -> Option<&'static str> {
        self.served_from(seq).and_then(|(_, tier)| tier).map(crate::Tier::name)
    }

    fn cache_info(&self) -> Option<kore_service::protocol::CacheInfo> {
        Some(self.cache_counters())
    }

    fn step(&mut self, out: &mut Vec<StepOut>) {
        let mut produced: BTreeMap<SeqId, Result<Vec<u32>, EngineError>> = BTreeMap::new();
        for (&id, s) in &self.seqs {
            if s.ended || s.generated >= s.max_tokens {
                let e = "engine: step after the request ended (stop token, max_tokens or context \
                         limit)";
                produced.insert(id, Err(EngineError::Internal(String::from(e))));
            }
        }
        // Waiting sequences wait for a running one; should none be left
        // to run (a bug), they run on by themselves rather than stall.
        if self.seqs.values().all(|s| s.wait.is_some() || s.ended) {
            self.seqs.values_mut().for_each(|s| s.wait = None);
        }
        self.step_plain(&mut produced);
        self.step_spec(&mut produced);
        for (seq, result) in produced {
            let result = result.map(|mut tokens| {
                if let Some(s) = self.seqs.get_mut(&seq) {
                    tokens.truncate(s.left());
                    s.count(&tokens, &self.stop_ids);
                }
                tokens
            });
            if result.is_err() {
                if let Some(s) = self.seqs.get_mut(&seq) {
                    s.ended = true;
                }
            }
            out.push(StepOut { seq, result });
        }
    }

    fn finish(&mut self, seq: SeqId) {
        let Some(mut s) = self.seqs.remove(&seq) else { return };
        if s.keeps_end() {
            self.keep(&s.ran, &s.state);
        }
        s.state.reset();
        self.spare.push(s.state);
        self.follow_up();
    }

    fn take_logprobs(&mut self, seq: SeqId) -> Vec<TokenLogprobs> {
        self.seqs.get_mut(&seq).map(|s| core::mem::take(&mut s.taken_logprobs)).unwrap_or_default()
    }

    fn bench(&mut self, request: &BenchRequest) -> Result<BenchReport, EngineError> {
        if !self.seqs.is_empty() {
            return Err(EngineError::Internal(String::from(
                "engine: bench while requests are running (finish was not called)",
            )));
        }
        bench::run(self.model, &self.bench, request)
    }
}

impl<'m> ModelEngine<'m> {
    /// One batched forward over every plain sequence not yet reported in
    /// `produced`; a sequence the model refuses is reported failed and the
    /// rest run without it.
    fn step_plain(&mut self, produced: &mut BTreeMap<SeqId, Result<Vec<u32>, EngineError>>) {
        loop {
            let mut ids = Vec::new();
            let mut inputs = Vec::new();
            for (&id, s) in self.seqs.iter_mut() {
                let Some((n, last)) = s.next_input() else { continue };
                if produced.contains_key(&id) {
                    continue;
                }
                let Phase::Plain { input, .. } = &s.phase else { continue };
                ids.push((id, n));
                inputs.push(SeqInput { state: &mut s.state, tokens: &input[..n], logits: last });
            }
            if inputs.is_empty() {
                return;
            }
            match self.model.forward_batch(&mut inputs) {
                Ok(logits) => {
                    drop(inputs);
                    let mut kept = false;
                    for ((id, n), l) in ids.into_iter().zip(logits) {
                        let mut tokens = Vec::new();
                        let mut result = Ok(false);
                        if let Some(s) = self.seqs.get_mut(&id) {
                            result = s.absorb(n, (!l.is_empty()).then_some(&l[..]), &mut tokens);
                            if matches!(result, Ok(true)) {
                                let s = &self.seqs[&id];
                                let persist =
                                    s.ran.len() == s.prompt_len || s.wanted.contains(&s.ran.len());
                                Self::keep_in(
                                    &mut self.cache,
                                    &mut self.store,
                                    &s.ran,
                                    &s.state,
                                    persist,
                                );
                                kept = true;
                            }
                        }
                        produced.insert(id, result.map(|_| tokens));
                    }
                    if kept {
                        self.follow_up();
                    }
                    return;
                }
                Err(e) => {
                    produced.insert(ids[e.index].0, Err(forward_error(e.error)));
                }
            }
        }
    }

    /// One speculative step of every MTP sequence, one after the other.
    fn step_spec(&mut self, produced: &mut BTreeMap<SeqId, Result<Vec<u32>, EngineError>>) {
        let model = self.model;
        for (&id, s) in self.seqs.iter_mut() {
            if produced.contains_key(&id) || matches!(s.phase, Phase::Plain { .. }) {
                continue;
            }
            let left = s.left();
            let result = match &mut s.phase {
                Phase::SpecPending { prompt, sampler, opts } => {
                    let sampler =
                        core::mem::replace(sampler, Sampler::new(SamplingParams::greedy()));
                    match Speculator::start(model, &mut s.state, prompt, sampler, *opts) {
                        Ok(sp) => {
                            let first = sp.pending();
                            s.phase = Phase::Spec(Box::new(sp));
                            Ok(alloc::vec![first])
                        }
                        Err(e) => Err(mtp_error(e)),
                    }
                }
                // Drafts beyond the remaining budget would be wasted: `left - 1`.
                Phase::Spec(sp) => sp.step(&mut s.state, left.saturating_sub(1)).map_err(mtp_error),
                Phase::Plain { .. } => continue,
            };
            produced.insert(id, result);
        }
    }
}
