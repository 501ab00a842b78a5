//! Counters of the HTTP server and their Prometheus text exposition
//! (`GET /metrics`): HTTP requests by path and status, generations by how
//! they ended, prompt and generated tokens, the last request's speeds, the
//! requests in flight here, the appliance's own queue and its prefix cache
//! (hits, misses, tokens and bytes per tier, evictions).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kore_protocol::{CacheInfo, Finish, InfoBody};

use crate::client::Done;

/// The server's counters (shared by all handlers and relay threads).
#[derive(Debug, Default)]
pub struct Metrics {
    http: Mutex<BTreeMap<(String, u16), u64>>,
    finished: Mutex<BTreeMap<String, u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    in_flight: AtomicI64,
    last: Mutex<(f64, f64, f64)>,
}

/// Decrements the in-flight gauge when dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Counts one HTTP answer.
    pub fn record_http(&self, path: &str, status: u16) {
        let mut m = self.http.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((path.to_string(), status)).or_default() += 1;
    }

    /// Counts a generation's end and its tokens and speeds.
    pub fn record_done(&self, done: &Done) {
        let s = &done.stats;
        self.prompt_tokens.fetch_add(u64::from(s.prompt_tokens), Ordering::Relaxed);
        self.generated_tokens.fetch_add(done.token_ids.len() as u64, Ordering::Relaxed);
        *self
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(done.finish.as_str().to_owned())
            .or_default() += 1;
        if done.finish != Finish::Cancelled {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
                (s.prefill_tok_per_s, s.decode_tok_per_s, s.tokens_per_step);
        }
    }

    /// Marks a generation in flight until the guard drops.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Generations that ended with `finish` so far.
    #[cfg(test)]
    pub fn finished(&self, finish: &str) -> u64 {
        self.finished.lock().unwrap_or_else(|p| p.into_inner()).get(finish).copied().unwrap_or(0)
    }

    /// The Prometheus text; `info` is the appliance's `info` object (or
    /// `None` when it did not answer).
    pub fn render(&self, info: Option<&InfoBody>) -> String {
        let mut text = String::new();
        metric(
            &mut text,
            "kore_http_requests_total",
            "counter",
            "HTTP requests answered, by path and status.",
            None,
        );
        for ((path, status), n) in self.http.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                text,
                "kore_http_requests_total{{path=\"{path}\",status=\"{status}\"}} {n}"
            );
        }
        metric(
            &mut text,
            "kore_generations_total",
            "counter",
            "Generations ended, by finish (stop, length, cancelled).",
            None,
        );
        for (finish, n) in self.finished.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(text, "kore_generations_total{{finish=\"{finish}\"}} {n}");
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric(
            &mut text,
            "kore_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            Some(load(&self.prompt_tokens)),
        );
        metric(
            &mut text,
            "kore_generated_tokens_total",
            "counter",
            "Tokens generated.",
            Some(load(&self.generated_tokens)),
        );
        let (prefill, decode, per_step) = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        metric(
            &mut text,
            "kore_last_prefill_tokens_per_second",
            "gauge",
            "Prefill speed of the last finished generation.",
            Some(prefill),
        );
        metric(
            &mut text,
            "kore_last_decode_tokens_per_second",
            "gauge",
            "Decode speed of the last finished generation.",
            Some(decode),
        );
        metric(
            &mut text,
            "kore_last_tokens_per_step",
            "gauge",
            "Tokens per engine step of the last finished generation.",
            Some(per_step),
        );
        let in_flight = self.in_flight.load(Ordering::Relaxed) as f64;
        metric(
            &mut text,
            "kore_requests_in_flight",
            "gauge",
            "Generations this server is relaying now.",
            Some(in_flight),
        );
        let up = info.is_some();
        metric(
            &mut text,
            "kore_appliance_up",
            "gauge",
            "Whether the appliance answered info.",
            Some(f64::from(u8::from(up))),
        );
        if let Some(info) = info {
            let busy = info.busy;
            metric(
                &mut text,
                "kore_queue_depth",
                "gauge",
                "Requests waiting in the appliance's queue.",
                Some(info.queued as f64),
            );
            metric(
                &mut text,
                "kore_queue_limit",
                "gauge",
                "The appliance's queue limit.",
                Some(info.queue_limit as f64),
            );
            metric(
                &mut text,
                "kore_engine_busy",
                "gauge",
                "Whether the engine is generating.",
                Some(f64::from(u8::from(busy))),
            );
            metric(
                &mut text,
                "kore_context_limit_tokens",
                "gauge",
                "Context limit of the model.",
                Some(f64::from(info.context_limit)),
            );
            if let Some(cache) = &info.cache {
                render_cache(&mut text, cache);
            }
        }
        text
    }
}

/// The prefix cache's families, by tier (`memory`, `disk`).
fn render_cache(text: &mut String, c: &CacheInfo) {
    let tiers = |text: &mut String, name: &str, kind: &str, help: &str, mem: u64, disk: u64| {
        metric(text, name, kind, help, None);
        let _ = writeln!(text, "{name}{{tier=\"memory\"}} {mem}\n{name}{{tier=\"disk\"}} {disk}");
    };
    let help = "Requests that started from a prefix-cache checkpoint, by tier.";
    tiers(text, "kore_cache_hits_total", "counter", help, c.hits_memory, c.hits_disk);
    let help = "Prompt tokens served from the prefix cache, by tier.";
    tiers(text, "kore_cache_tokens_total", "counter", help, c.tokens_memory, c.tokens_disk);
    let help = "Bytes the prefix cache holds, by tier.";
    tiers(text, "kore_cache_bytes", "gauge", help, c.bytes_memory, c.bytes_disk);
    let help = "The prefix cache's budget in bytes, by tier.";
    tiers(text, "kore_cache_budget_bytes", "gauge", help, c.budget_memory, c.budget_disk);
    let help = "Checkpoints (memory) and files (disk) dropped for the budget, by tier.";
    tiers(
        text,
        "kore_cache_evictions_total",
        "counter",
        help,
        c.evictions_memory,
        c.evictions_disk,
    );
    let help = "Requests that could use the prefix cache and found nothing.";
    metric(text, "kore_cache_misses_total", "counter", help, Some(c.misses as f64));
    let help = "Checkpoint files found bad (truncated, corrupt, foreign) and ignored.";
    metric(text, "kore_cache_rejected_files_total", "counter", help, Some(c.rejected as f64));
}

/// One metric family's header, and its sample when it has no labels.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: Option<f64>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    if let Some(v) = value {
        let _ = writeln!(out, "{name} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kore_protocol::{Id, Stats};
    use std::borrow::Cow;

    #[test]
    fn renders_counters_and_queue_in_prometheus_text() {
        let m = Arc::new(Metrics::default());
        m.record_http("/v1/completions", 200);
        m.record_http("/v1/completions", 200);
        let stats = Stats { prompt_tokens: 4, decode_tok_per_s: 12.5, ..Stats::default() };
        let done = Done {
            id: Cow::Owned(Id::from(1)),
            done: true,
            finish: Finish::Length,
            token_ids: Cow::Owned(vec![1, 2, 3]),
            text: "abc".into(),
            thinking: None,
            stats: Cow::Owned(stats),
            tool_calls: Cow::Owned(Vec::new()),
            logprobs: None,
            stop_sequence: None,
        };
        m.record_done(&done);
        let _guard = m.start();
        let cache = CacheInfo { hits_disk: 3, bytes_memory: 7, misses: 2, ..CacheInfo::default() };
        let info = InfoBody {
            queued: 2,
            busy: true,
            queue_limit: 64,
            cache: Some(cache),
            ..InfoBody::default()
        };
        let text = m.render(Some(&info));
        for line in [
            "kore_http_requests_total{path=\"/v1/completions\",status=\"200\"} 2",
            "kore_generations_total{finish=\"length\"} 1",
            "kore_prompt_tokens_total 4",
            "kore_generated_tokens_total 3",
            "kore_last_decode_tokens_per_second 12.5",
            "kore_requests_in_flight 1",
            "kore_queue_depth 2",
            "kore_engine_busy 1",
            "kore_cache_hits_total{tier=\"disk\"} 3",
            "kore_cache_bytes{tier=\"memory\"} 7",
            "kore_cache_misses_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert_eq!(m.finished("length"), 1);
    }
}
