//! The benchmark (`{"op":"bench"}`): its request fields and its report, field
//! for field the `kore-launch bench --json` object.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::request::MAX_MTP;

/// Parameters of `{"op":"bench"}`; every field is optional on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchRequest {
    /// Prompt length for the prefill measurement (`None` = engine default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u32>,
    /// Tokens to decode for the decode measurement (`None` = engine default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_tokens: Option<u32>,
    /// Draft tokens per step (`None` = engine default, `Some(0)` = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<u32>,
    /// Worker threads (`None` = all vCPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Sequences decoding together (`None` = 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// With `mtp` > 0: rounds of plain and speculative decoding compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u32>,
    /// With `mtp` > 0: lm_head rows the drafts score (`None` = engine default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_vocab: Option<u32>,
    /// Positions of context before the prompt: prefill and decode are
    /// measured at this depth (`None` = 0; llama-bench's `-d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

impl BenchRequest {
    /// Checks every given field's range; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("prompt_tokens", self.prompt_tokens, 1, 1 << 20),
            ("decode_tokens", self.decode_tokens, 1, 1 << 20),
            ("mtp", self.mtp, 0, MAX_MTP),
            ("threads", self.threads, 1, 4096),
            ("concurrency", self.concurrency, 1, 256),
            ("rounds", self.rounds, 1, 1000),
            ("draft_vocab", self.draft_vocab, 1, 1 << 24),
            ("depth", self.depth, 0, 1 << 24),
        ];
        for (name, value, min, max) in fields {
            if let Some(v) = value.filter(|v| !(min..=max).contains(v)) {
                return Err(format!("\"{name}\" is {v}; it must be an integer in {min}..={max}"));
            }
        }
        Ok(())
    }
}

/// The [`BenchReport`] fields that are positive numbers in every report
/// (docs/contract.md's `bench --json`): what clients and tests check first.
pub const BENCH_POSITIVE_FIELDS: [&str; 9] = [
    "measured_read_gbps",
    "prefill_tok_per_s",
    "decode_tok_per_s",
    "step_ms",
    "weight_bytes_per_step",
    "achieved_gbps",
    "bandwidth_fraction",
    "tokens_per_step",
    "threads",
];

/// Benchmark results, field for field the `kore-launch bench --json` object.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchReport {
    /// Memory read bandwidth measured in the same run, GB/s.
    pub measured_read_gbps: f64,
    /// Prefill throughput, tokens/s.
    pub prefill_tok_per_s: f64,
    /// Decode throughput of one sequence, tokens/s.
    pub decode_tok_per_s: f64,
    /// Sequences decoding together.
    pub concurrency: u32,
    /// Decode throughput of all sequences together, tokens/s.
    pub aggregate_decode_tok_per_s: f64,
    /// Mean decode step time, ms.
    pub step_ms: f64,
    /// Weight bytes read per decode step.
    pub weight_bytes_per_step: f64,
    /// Weight bytes per step divided by step time, GB/s.
    pub achieved_gbps: f64,
    /// `achieved_gbps / measured_read_gbps`.
    pub bandwidth_fraction: f64,
    /// Mean tokens per decode step (1 without drafting).
    pub tokens_per_step: f64,
    /// Worker threads used.
    pub threads: u32,
    /// The kernel path the engine ran (`generic`, `avx2`, `avx512`, `avx512vnni`).
    pub kernels: String,
    /// Positions of context before the prompt (the request's `depth`).
    pub depth: u32,
    /// KV cache bytes a decode step reads (every attention layer's keys and
    /// values at the decode's depth, in the model's KV precision).
    pub kv_bytes_per_step: u64,
    /// Share of the prefill's time per part of the forward (`trunk_matmuls`,
    /// `deltanet`, `attention`, `head`, `rest`; `kore_engine::profile`),
    /// absent where nothing was counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prefill_share: BTreeMap<String, f64>,
    /// The same shares over plain decoding's steps, absent with MTP or where
    /// nothing was counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decode_share: BTreeMap<String, f64>,
    /// With MTP drafting (`mtp > 0`): the figures of [`MtpBench`], else absent.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpBench>,
}

/// The MTP part of a bench report (`kore-launch bench --mtp N`), measured
/// against plain decoding in the same run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MtpBench {
    /// Drafts per step asked for.
    pub mtp: u32,
    /// Per draft position: fraction of steps whose drafts 1..=k were all accepted.
    pub mtp_acceptance: Vec<f64>,
    /// Mean drafts made per step.
    pub mtp_drafts_per_step: f64,
    /// Plain (one token a step) decode tok/s of the same run.
    pub plain_decode_tok_per_s: f64,
    /// Speculative decode tok/s over plain decode tok/s.
    pub mtp_speedup: f64,
    /// Projected (not measured) speedup at the reference acceptance, from
    /// this run's step costs (`kore_engine::bench::projected_speedup`).
    pub mtp_projected_speedup: f64,
    /// Projected (not measured) speedup at this run's own acceptance.
    #[serde(default)]
    pub mtp_projected_speedup_measured: f64,
    /// Milliseconds of a plain step, timed as the verify steps are.
    #[serde(default)]
    pub mtp_plain_step_ms: f64,
    /// Milliseconds of a verify step over 1..=8 tokens.
    #[serde(default)]
    pub mtp_verify_ms: Vec<f64>,
    /// Milliseconds of one draft.
    #[serde(default)]
    pub mtp_draft_ms: f64,
    /// Draft length with the best projected speedup at this run's acceptance.
    #[serde(default)]
    pub mtp_best_drafts: u32,
    /// Draft vocabulary (lm_head rows the drafts score).
    pub mtp_draft_vocab: u32,
    /// Milliseconds per part of a speculative step (`kore_engine::profile`),
    /// absent where nothing was counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mtp_step_profile_ms: BTreeMap<String, f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtp_figures_sit_beside_the_contract_fields_only_when_drafting() {
        let plain = serde_json::to_value(BenchReport { threads: 2, ..BenchReport::default() });
        let plain = plain.unwrap();
        assert_eq!(plain["threads"], 2);
        assert!(plain.get("mtp").is_none() && plain.get("mtp_acceptance").is_none(), "{plain}");
        let mtp = MtpBench {
            mtp: 3,
            mtp_acceptance: alloc::vec![0.5, 0.25, 0.125],
            mtp_speedup: 1.5,
            ..MtpBench::default()
        };
        let v = serde_json::to_value(BenchReport { mtp: Some(mtp), ..BenchReport::default() });
        let v = v.unwrap();
        assert_eq!(v["mtp"], 3);
        assert_eq!(v["mtp_acceptance"].as_array().map(|a| a.len()), Some(3));
        assert_eq!(v["mtp_speedup"], 1.5);
        assert!(v.get("tokens_per_step").is_some(), "{v}");
    }

    #[test]
    fn prefill_share_is_an_object_only_when_counted() {
        let plain = serde_json::to_value(BenchReport::default()).unwrap();
        assert!(plain.get("prefill_share").is_none(), "{plain}");
        let mut share = BTreeMap::new();
        share.insert(String::from("trunk_matmuls"), 0.75);
        share.insert(String::from("rest"), 0.25);
        let r = BenchReport { prefill_share: share, ..BenchReport::default() };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["prefill_share"]["trunk_matmuls"], 0.75, "{v}");
        let back: BenchReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn ranges_are_checked_by_name() {
        assert!(BenchRequest::default().validate().is_ok());
        let r = BenchRequest { concurrency: Some(0), ..BenchRequest::default() };
        assert!(r.validate().unwrap_err().contains("concurrency"));
        let r = BenchRequest { mtp: Some(17), ..BenchRequest::default() };
        assert!(r.validate().unwrap_err().contains("mtp"));
    }
}
