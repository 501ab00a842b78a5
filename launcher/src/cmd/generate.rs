//! `kore-launch generate`: raw completion of a prompt (no chat template).
//! Both placements go through the chat protocol to the appliance: with
//! `--native` the service runs in-process on the host, otherwise in the Kore
//! VM (booted for the command or attached from `kore-launch up`); the
//! service checks the request (drafts, sampling, context) in one place.

use std::io::Write;

use kore_protocol::{DoneEvent, Finish, GenerateRequest};
use serde_json::json;

use crate::appliance::Appliance;
use crate::cli::{GenerateArgs, SamplingArgs};
use crate::error::{LaunchError, Result};

/// Tokens generated when `--max-tokens` is absent.
const DEFAULT_MAX_TOKENS: u32 = 128;

/// Runs `generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let request = request(&args)?;
    let (appliance, path) = Appliance::open_for(args.model.as_deref(), args.native, true)?;
    let done = appliance.client()?.generate(request, |_| {});
    appliance.shutdown();
    let done = done?;
    // The text of the generated ids as the tokenizer decodes them (a final
    // stop token's text included); the service's answer text (which leaves
    // stop tokens out) if the tokenizer is not at hand.
    let text = match host_tokenizer(&path) {
        Some(t) => t.decode(&done.token_ids),
        None => done.text.to_string(),
    };
    print_output(args.json.json, &done, &text)
}

/// The protocol request: the prompt, `--max-tokens` (default 128) and the
/// sampling flags (greedy unless a temperature above 0 is given; any other
/// sampling flag without a temperature samples at temperature 1).
fn request(args: &GenerateArgs) -> Result<GenerateRequest> {
    let mut req = match (&args.prompt_ids, &args.prompt) {
        (Some(ids), _) if ids.is_empty() => None,
        (None, Some(text)) if text.is_empty() => None,
        (Some(ids), _) => Some(GenerateRequest::completion_ids(ids.clone())),
        (None, Some(text)) => Some(GenerateRequest::completion(text.clone())),
        (None, None) => return Err(LaunchError::Usage("give --prompt or --prompt-ids".into())),
    }
    .ok_or_else(|| LaunchError::Usage("the prompt is empty".into()))?;
    let s: &SamplingArgs = &args.sampling;
    let any_filter = s.top_k.is_some() || s.top_p.is_some() || s.min_p.is_some();
    req.temperature = Some(s.temperature.unwrap_or(if any_filter { 1.0 } else { 0.0 }));
    req.max_tokens = Some(DEFAULT_MAX_TOKENS);
    req.seed = Some(s.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }));
    super::session::add_sampling(&mut req, s);
    if let Some(m) = s.max_tokens {
        req.max_tokens = Some(u32::try_from(m).unwrap_or(u32::MAX));
    }
    req.validate().map_err(|e| LaunchError::Usage(format!("{e} (check the flags)")))?;
    Ok(req)
}

/// Prints a generation: the JSON object (`--json`, docs/contract.md), else
/// the text (or the ids when there is no text) on stdout and a summary on
/// stderr.
fn print_output(json: bool, done: &DoneEvent<'_>, text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |source| LaunchError::Io { path: "stdout".into(), source };
    let stop_reason = match done.finish {
        Finish::Stop => "stop_token",
        Finish::Length => "max_tokens",
        other => other.as_str(),
    };
    if json {
        let obj = json!({
            "token_ids": done.token_ids,
            "text": text,
            "stop_reason": stop_reason,
            "stats": done.stats,
        });
        return writeln!(out, "{obj}").map_err(io);
    }
    if text.is_empty() && !done.token_ids.is_empty() {
        let ids: Vec<String> = done.token_ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", ids.join(",")).map_err(io)?;
    } else {
        writeln!(out, "{text}").map_err(io)?;
    }
    let s = &done.stats;
    eprintln!(
        "prompt {} tokens, prefill {:.1} ms ({:.1} tok/s); generated {} tokens, decode {:.1} tok/s, {:.2} tokens/step",
        s.prompt_tokens,
        s.prefill_ms,
        s.prefill_tok_per_s,
        done.token_ids.len(),
        s.decode_tok_per_s,
        s.tokens_per_step
    );
    Ok(())
}

/// The model's tokenizer on the host, if its directory has one.
fn host_tokenizer(path: &std::path::Path) -> Option<kore_tokenizer::Tokenizer> {
    kore_tokenizer::Tokenizer::from_file(crate::model::tokenizer_path(path)).ok()
}
