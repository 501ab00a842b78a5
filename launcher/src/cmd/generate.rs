//! `kore-launch generate`: raw completion of a prompt (no chat template).
//! With `--native` the engine runs in-process on the host; otherwise the
//! request goes through the chat protocol to the appliance (the Kore VM,
//! booted for the command or attached from `kore-launch up`).

use std::io::Write;
use std::time::Instant;

use kore_engine::pool::ThreadPool;
use kore_engine::{GenerateOptions, SamplingParams, SpecOptions, StopReason};
use serde_json::json;

use crate::appliance::Appliance;
use crate::cli::{GenerateArgs, SamplingArgs};
use crate::error::{LaunchError, Result};
use crate::model;

/// Tokens generated when `--max-tokens` is absent.
const DEFAULT_MAX_TOKENS: usize = 128;

/// Drafts per step when `--mtp` is absent. Chosen by measurement
/// (docs/benchmarks.md, "MTP"): with today's kernels a batched verify costs
/// nearly as much per token as single-token decoding on the tiny model, so
/// drafting (2.0-2.8 tokens per step) still decodes slower than plain
/// decoding there; drafting stays opt-in until faster batched kernels change
/// that (re-measure with the `mtp_bench` test).
pub const DEFAULT_MTP: usize = 0;

/// Runs `generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    if !args.native {
        return through_appliance(&args);
    }
    // Rows of every matrix product split across all cores (bit-identical to one thread).
    let pool = ThreadPool::with_all_cores();
    let files = model::open(args.model.as_deref())?;
    let mut model = files.model()?;
    model.set_pool(&pool);
    let prompt = match (&args.prompt_ids, &args.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => match &files.tokenizer {
            Some(t) => t.encode(text),
            None => {
                return Err(LaunchError::Model(format!(
                    "{}: no tokenizer.json, so --prompt text cannot be tokenized; use --prompt-ids",
                    files.path.display()
                )))
            }
        },
        (None, None) => return Err(LaunchError::Usage("give --prompt or --prompt-ids".into())),
    };
    if prompt.is_empty() {
        return Err(LaunchError::Usage("the prompt is empty".into()));
    }
    let vocab = model.config.vocab_size;
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(LaunchError::Usage(format!(
            "prompt token id {bad} is outside the vocabulary of {} (size {vocab})",
            files.path.display()
        )));
    }
    let mtp = mtp_drafts(&model, args.sampling.mtp)?;
    let params = sampling_params(&args.sampling)?;
    // The configured context limits the engine here as in the appliance.
    let overrides = crate::config::Overrides { model: args.model.clone(), ..Default::default() };
    let context =
        usize::try_from(crate::config::effective(&overrides)?.context).unwrap_or(usize::MAX);
    if prompt.len() >= context {
        return Err(LaunchError::Usage(format!(
            "prompt_too_long: the prompt has {} tokens and the context limit is {context} \
             (the `context` setting: --context on setup, KORE_CONTEXT or the config file)",
            prompt.len()
        )));
    }
    let max_tokens =
        args.sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(context - prompt.len());
    let run = decode(&model, &prompt, max_tokens, &files.stop_tokens, params, mtp)?;
    let text = match &files.tokenizer {
        Some(t) => t.decode(&run.tokens),
        None => {
            tracing::warn!("no tokenizer.json in {}: `text` is empty", files.path.display());
            String::new()
        }
    };
    print_result(&args, &prompt, &run, &text)
}

/// Greedy unless a temperature above 0 is given; any other sampling flag
/// without a temperature samples at temperature 1.
fn sampling_params(s: &SamplingArgs) -> Result<SamplingParams> {
    let any_filter = s.top_k.is_some() || s.top_p.is_some() || s.min_p.is_some();
    let temperature = s.temperature.unwrap_or(if any_filter { 1.0 } else { 0.0 });
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(LaunchError::Usage(format!(
            "--temperature {temperature}: must be 0 or positive"
        )));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(LaunchError::Usage(format!("--top-p {top_p}: must be in (0, 1]")));
    }
    let min_p = s.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(LaunchError::Usage(format!("--min-p {min_p}: must be in [0, 1]")));
    }
    let seed = s.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    Ok(SamplingParams { temperature, top_k: s.top_k.unwrap_or(0), top_p, min_p, seed })
}

/// Drafts per step: `--mtp N` (at most 7), or [`DEFAULT_MTP`] when the
/// model has an MTP head; 0 without one.
pub fn mtp_drafts(model: &kore_engine::Model<'_>, asked: Option<usize>) -> Result<usize> {
    match asked {
        Some(n) if n > kore_engine::spec::MAX_DRAFTS => Err(LaunchError::Usage(format!(
            "--mtp {n}: at most {} drafts per step",
            kore_engine::spec::MAX_DRAFTS
        ))),
        Some(n) if n > 0 && !model.has_mtp() => Err(LaunchError::Usage(format!(
            "--mtp {n}: this model has no MTP head (no mtp.* weights); use --mtp 0"
        ))),
        Some(n) => Ok(n),
        None => Ok(if model.has_mtp() { DEFAULT_MTP } else { 0 }),
    }
}

/// Generated ids and timings.
struct Run {
    tokens: Vec<u32>,
    stopped: bool,
    prefill_s: f64,
    decode_s: f64,
    /// Tokens produced by decode steps (all but the first).
    decode_tokens: usize,
    tokens_per_step: f64,
    /// Acceptance rate per draft position (empty without MTP).
    acceptance: Vec<f64>,
}

/// Generates with the engine's own loops ([`kore_engine::generate`], or
/// [`kore_engine::generate_spec`] when `mtp > 0`), timing prefill as the time
/// to the first token and decode as the rest.
fn decode(
    model: &kore_engine::Model<'_>,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
    params: SamplingParams,
    mtp: usize,
) -> Result<Run> {
    let engine_err = |e: &dyn std::fmt::Display| LaunchError::Other(format!("engine: {e}"));
    let opts = GenerateOptions { max_tokens, stop_tokens: stop.to_vec(), sampling: params };
    let mut state = model.new_state();
    let t0 = Instant::now();
    let mut first: Option<Instant> = None;
    let on_token = |_: u32| {
        first.get_or_insert_with(Instant::now);
        true
    };
    let (generation, tokens_per_step, acceptance) = if mtp > 0 {
        let spec = SpecOptions {
            draft_vocab: kore_engine::spec::draft_vocab(model.config.vocab_size),
            ..SpecOptions::new(mtp)
        };
        let (g, stats) =
            kore_engine::generate_spec(model, &mut state, prompt, &opts, &spec, on_token)
                .map_err(|e| engine_err(&e))?;
        (g, stats.tokens_per_step(), stats.acceptance())
    } else {
        let g = kore_engine::generate(model, &mut state, prompt, &opts, on_token)
            .map_err(|e| engine_err(&e))?;
        (g, 1.0, Vec::new())
    };
    let first = first.unwrap_or(t0);
    Ok(Run {
        decode_tokens: generation.tokens.len().saturating_sub(1),
        stopped: generation.stop == StopReason::StopToken,
        tokens: generation.tokens,
        prefill_s: (first - t0).as_secs_f64(),
        decode_s: first.elapsed().as_secs_f64(),
        tokens_per_step,
        acceptance,
    })
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn print_result(args: &GenerateArgs, prompt: &[u32], run: &Run, text: &str) -> Result<()> {
    let stats = json!({
        "prompt_tokens": prompt.len(),
        "generated_tokens": run.tokens.len(),
        "prefill_ms": run.prefill_s * 1e3,
        "prefill_tok_per_s": rate(prompt.len(), run.prefill_s),
        "decode_tok_per_s": rate(run.decode_tokens, run.decode_s),
        "tokens_per_step": run.tokens_per_step,
        "mtp_acceptance": run.acceptance,
    });
    let summary = format!(
        "prompt {} tokens, prefill {:.1} ms ({:.1} tok/s); generated {} tokens, decode {:.1} tok/s, {:.2} tokens/step",
        prompt.len(),
        run.prefill_s * 1e3,
        rate(prompt.len(), run.prefill_s),
        run.tokens.len(),
        rate(run.decode_tokens, run.decode_s),
        run.tokens_per_step
    );
    let stop_reason = if run.stopped { "stop_token" } else { "max_tokens" };
    print_output(args.json.json, &run.tokens, text, stop_reason, &stats, &summary)
}

/// Prints a generation: the JSON object (`--json`, CONTRACT.md), else the
/// text (or the ids when there is no text) on stdout and `summary` on stderr.
fn print_output(
    json: bool,
    token_ids: &[u32],
    text: &str,
    stop_reason: &str,
    stats: &serde_json::Value,
    summary: &str,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |source| LaunchError::Io { path: "stdout".into(), source };
    if json {
        let obj = json!({
            "token_ids": token_ids,
            "text": text,
            "stop_reason": stop_reason,
            "stats": stats,
        });
        writeln!(out, "{obj}").map_err(io)?;
    } else {
        if text.is_empty() && !token_ids.is_empty() {
            let ids: Vec<String> = token_ids.iter().map(u32::to_string).collect();
            writeln!(out, "{}", ids.join(",")).map_err(io)?;
        } else {
            writeln!(out, "{text}").map_err(io)?;
        }
        eprintln!("{summary}");
    }
    Ok(())
}

/// `generate` through the appliance: a raw prompt request, printed as the
/// native path prints it.
fn through_appliance(args: &GenerateArgs) -> Result<()> {
    let params = sampling_params(&args.sampling)?;
    let mut request = match (&args.prompt_ids, &args.prompt) {
        (Some(ids), _) => json!({ "prompt_ids": ids }),
        (None, Some(text)) => json!({ "prompt": text }),
        (None, None) => return Err(LaunchError::Usage("give --prompt or --prompt-ids".into())),
    };
    if matches!(&args.prompt_ids, Some(ids) if ids.is_empty())
        || matches!(&args.prompt, Some(t) if t.is_empty())
    {
        return Err(LaunchError::Usage("the prompt is empty".into()));
    }
    request["max_tokens"] = json!(args.sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    request["temperature"] = json!(params.temperature);
    request["top_p"] = json!(params.top_p);
    request["top_k"] = json!(params.top_k);
    request["min_p"] = json!(params.min_p);
    request["seed"] = json!(params.seed);
    if let Some(mtp) = args.sampling.mtp {
        request["mtp"] = json!(mtp);
    }
    let (appliance, path) = Appliance::open_for(args.model.as_deref(), false, true)?;
    let done = appliance.client()?.generate(request, |_| {})?;
    appliance.shutdown();
    // The text of the generated ids as the native path gives it (tokenizer
    // decode, a final stop token's text included); the service's answer text
    // (which leaves stop tokens out) if the tokenizer is not at hand.
    let text = match host_tokenizer(&path) {
        Some(t) => t.decode(&done.token_ids),
        None => done.text.clone(),
    };
    let stat = |k: &str| done.stats.get(k).cloned().unwrap_or(json!(0));
    let stop_reason = match done.finish.as_str() {
        "stop" => "stop_token",
        "length" => "max_tokens",
        other => other,
    };
    let summary = format!(
        "prompt {} tokens, prefill {} ms ({} tok/s); generated {} tokens, decode {} tok/s",
        stat("prompt_tokens"),
        stat("prefill_ms"),
        stat("prefill_tok_per_s"),
        done.token_ids.len(),
        stat("decode_tok_per_s"),
    );
    print_output(args.json.json, &done.token_ids, &text, stop_reason, &done.stats, &summary)
}

/// The model's tokenizer on the host, if its directory has one.
fn host_tokenizer(path: &std::path::Path) -> Option<kore_tokenizer::Tokenizer> {
    kore_tokenizer::Tokenizer::from_file(path.join("tokenizer.json")).ok()
}
