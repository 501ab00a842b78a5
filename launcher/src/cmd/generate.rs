//! `kore-launch generate`: raw completion of a prompt (no chat template).
//! With `--native` the engine runs in-process on the host; otherwise it will
//! run in the Kore guest (not available in this build yet).

use std::io::Write;
use std::time::Instant;

use kore_engine::{Logits, Sampler, SamplingParams};
use serde_json::json;

use crate::cli::{GenerateArgs, SamplingArgs};
use crate::error::{LaunchError, Result};
use crate::model;

/// Tokens generated when `--max-tokens` is absent.
const DEFAULT_MAX_TOKENS: usize = 128;

/// Runs `generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    if !args.native {
        return Err(LaunchError::Usage(
            "generate in the Kore guest is not available in this build yet; pass --native to run the engine \
             in-process on the host"
                .into(),
        ));
    }
    let files = model::open(args.model.as_deref())?;
    let model = files.model()?;
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
    if args.sampling.mtp.unwrap_or(0) > 0 {
        tracing::warn!(
            "MTP drafting is not implemented in the native engine yet; generating without drafts"
        );
    }
    let params = sampling_params(&args.sampling)?;
    let max_tokens = args.sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let run = decode(&model, &prompt, max_tokens, &files.stop_tokens, params)?;
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

/// Generated ids and timings.
struct Run {
    tokens: Vec<u32>,
    stopped: bool,
    prefill_s: f64,
    decode_s: f64,
    decode_steps: usize,
}

fn decode(
    model: &kore_engine::Model<'_>,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
    params: SamplingParams,
) -> Result<Run> {
    let engine_err = |e: kore_engine::ForwardError| LaunchError::Other(format!("engine: {e}"));
    let mut state = model.new_state();
    let mut sampler = Sampler::new(params);
    let t0 = Instant::now();
    let mut logits = model.forward(&mut state, prompt, Logits::Last).map_err(engine_err)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let (mut tokens, mut stopped, mut decode_steps) = (Vec::new(), false, 0);
    let t1 = Instant::now();
    while tokens.len() < max_tokens {
        let next = sampler.sample(&logits);
        tokens.push(next);
        if stop.contains(&next) {
            stopped = true;
            break;
        }
        if tokens.len() == max_tokens {
            break;
        }
        logits = model.forward(&mut state, &[next], Logits::Last).map_err(engine_err)?;
        decode_steps += 1;
    }
    Ok(Run { tokens, stopped, prefill_s, decode_s: t1.elapsed().as_secs_f64(), decode_steps })
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
        "decode_tok_per_s": rate(run.decode_steps, run.decode_s),
        "tokens_per_step": 1.0,
    });
    let mut out = std::io::stdout().lock();
    let io = |source| LaunchError::Io { path: "stdout".into(), source };
    if args.json.json {
        let obj = json!({
            "token_ids": run.tokens,
            "text": text,
            "stop_reason": if run.stopped { "stop_token" } else { "max_tokens" },
            "stats": stats,
        });
        writeln!(out, "{obj}").map_err(io)?;
    } else {
        if text.is_empty() && !run.tokens.is_empty() {
            let ids: Vec<String> = run.tokens.iter().map(u32::to_string).collect();
            writeln!(out, "{}", ids.join(",")).map_err(io)?;
        } else {
            writeln!(out, "{text}").map_err(io)?;
        }
        eprintln!(
            "prompt {} tokens, prefill {:.1} ms ({:.1} tok/s); generated {} tokens, decode {:.1} tok/s",
            prompt.len(),
            run.prefill_s * 1e3,
            rate(prompt.len(), run.prefill_s),
            run.tokens.len(),
            rate(run.decode_steps, run.decode_s)
        );
    }
    Ok(())
}
