//! The one place that assembles the appliance's chat service from a model,
//! its tokenizer and [`Settings`]: the guest image (from its command line and
//! pack) and kore-launch's in-process placement (from its configuration) both
//! call [`service`], so the stop rule, the limits, the budgets and the bench
//! prompt cannot drift apart between them.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use kore_engine::Model;
use kore_service::{Clock, Config, Service};
use kore_tokenizer::Tokenizer;

use crate::bench::{BufferAlloc, NsClock, BENCH_TEXT};
use crate::{CheckpointStore, ModelEngine, TokenizerCodec};

/// Where the prefix cache's checkpoints persist beyond memory, and the pack
/// identity (its digest) they belong to: the disk tier natively, the host's
/// disk tier over vsock in the guest (docs/architecture.md, "Prefix cache").
pub struct Store<'m> {
    /// The store.
    pub store: Box<dyn CheckpointStore + 'm>,
    /// The pack's identity (`Identity.pack` of every file).
    pub pack: [u8; 32],
}

/// How the appliance serves, besides its model and tokenizer. `None` keeps
/// [`ModelEngine`]'s default.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The model's name in `info` (a pack's `name`).
    pub name: String,
    /// The pack's `eos_token` text: a stop token besides the config's ids.
    pub eos_token: Option<String>,
    /// More end-of-sequence ids (a Hugging Face directory's
    /// `generation_config.json`).
    pub extra_eos_ids: Vec<u32>,
    /// Context limit in tokens (prompt + generated; never above the model's).
    pub context: Option<u32>,
    /// KV positions the running sequences may reserve together (requests
    /// beyond it wait); the guest's memory is sized for it.
    pub kv_tokens: Option<usize>,
    /// Bytes of the prefix cache's memory tier (0: no cache; `None`: the
    /// engine's default, `engine::DEFAULT_CACHE_BYTES`).
    pub cache_bytes: Option<usize>,
    /// The benchmark's clock (the guest's TSC; `Instant` natively by default).
    pub bench_clock: Option<NsClock>,
    /// How the benchmark allocates its read-bandwidth buffer.
    pub bench_alloc: Option<BufferAlloc>,
}

/// Ids that end a generation: `eos_ids` (the config's end-of-sequence ids),
/// and the tokenizer's `<|im_end|>`, `<|endoftext|>` and `eos_token` where it
/// has them; sorted, deduplicated and below `vocab_size` (the model's, which
/// may be larger or smaller than the tokenizer's).
pub fn stop_ids(
    tokenizer: Option<&Tokenizer>,
    eos_ids: &[u32],
    eos_token: Option<&str>,
    vocab_size: usize,
) -> Vec<u32> {
    let mut ids = eos_ids.to_vec();
    if let Some(tokenizer) = tokenizer {
        let names = ["<|im_end|>", "<|endoftext|>"].into_iter().chain(eos_token);
        ids.extend(names.filter_map(|t| tokenizer.token_to_id(t)));
    }
    ids.sort_unstable();
    ids.dedup();
    ids.retain(|&id| (id as usize) < vocab_size);
    ids
}

/// The engine serving `model` as `settings` say, stopping at [`stop_ids`].
pub fn engine<'m>(
    model: &'m Model<'m>,
    tokenizer: Option<&Arc<Tokenizer>>,
    settings: &Settings,
) -> ModelEngine<'m> {
    let shared = tokenizer;
    let tokenizer = shared.map(|t| &**t);
    let mut eos = model.config.eos_token_ids.clone();
    eos.extend(&settings.extra_eos_ids);
    let stops = stop_ids(tokenizer, &eos, settings.eos_token.as_deref(), model.config.vocab_size);
    let prompt = tokenizer.map(|t| t.encode(BENCH_TEXT)).unwrap_or_default();
    let mut engine =
        ModelEngine::new(model, settings.name.clone(), stops).with_bench_prompt(prompt);
    if let Some(limit) = settings.context {
        engine = engine.with_context_limit(limit);
    }
    if let Some(tokens) = settings.kv_tokens {
        engine = engine.with_kv_token_budget(tokens);
    }
    if let Some(bytes) = settings.cache_bytes {
        engine = engine.with_cache_budget(bytes);
    }
    if let Some(clock) = settings.bench_clock {
        engine = engine.with_clock(clock);
    }
    if let Some(alloc) = settings.bench_alloc {
        engine = engine.with_bench_alloc(alloc);
    }
    // Constrained decoding (tools, response_format) masks over the
    // tokenizer's vocabulary: built by the first constrained request.
    if let Some(t) = shared {
        engine = engine.with_grammar_tokenizer(Arc::clone(t), model.config.vocab_size);
    }
    engine
}

/// The chat service over `model` and its tokenizer as `settings` say, timed
/// with `clock`, its prefix cache persisting to `store` where given. Without
/// a tokenizer (a bare model directory) it serves `prompt_ids` only.
pub fn service<'m, K: Clock>(
    model: &'m Model<'m>,
    tokenizer: Option<Arc<Tokenizer>>,
    settings: &Settings,
    clock: K,
    store: Option<Store<'m>>,
) -> Service<ModelEngine<'m>, TokenizerCodec, K> {
    let mut engine = engine(model, tokenizer.as_ref(), settings);
    if let Some(s) = store {
        engine = engine.with_store(s.store, s.pack);
    }
    let stops = engine.stop_ids().to_vec();
    let codec = match tokenizer {
        Some(t) => TokenizerCodec::new(t, stops),
        None => TokenizerCodec::ids_only(stops),
    };
    Service::new(engine, codec, clock, Config::default())
}
