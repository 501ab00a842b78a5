//! `kore-launch bench --native --mtp N` on the default pack (model-packs/tiny,
//! which has an MTP head): the JSON has the contract's fields plus the MTP
//! ones (acceptance per draft position, plain decode of the same run,
//! speedup), and bad `--mtp` values exit non-zero with a one-line error.
//! Short runs: `KORE_BENCH_PROMPT_TOKENS` / `KORE_BENCH_DECODE_TOKENS`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A short native bench of the default pack on one thread.
fn bench(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kore-launch"))
        .current_dir(root())
        .env("KORE_BENCH_PROMPT_TOKENS", "48")
        .env("KORE_BENCH_DECODE_TOKENS", "40")
        .args(["bench", "--native", "--threads", "1", "--json"])
        .args(extra)
        .output()
        .expect("run kore-launch")
}

fn last_json(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let line = stdout.lines().last().expect("stdout has a line");
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {line}"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

use kore_service::protocol::BENCH_POSITIVE_FIELDS as CONTRACT;

#[test]
fn mtp_3_reports_acceptance_per_position_and_speedup() {
    let v = last_json(&bench(&["--mtp", "3"]));
    for key in CONTRACT {
        assert!(num(&v, key) > 0.0, "{key} in {v}");
    }
    assert_eq!(v["mtp"], 3);
    let tps = num(&v, "tokens_per_step");
    assert!(tps > 1.0 && tps <= 4.0, "tokens_per_step {tps}");
    let acc: Vec<f64> = v["mtp_acceptance"]
        .as_array()
        .expect("mtp_acceptance array")
        .iter()
        .map(|a| a.as_f64().unwrap())
        .collect();
    assert_eq!(acc.len(), 3, "{v}");
    assert!(acc.iter().all(|a| (0.0..=1.0).contains(a)), "{acc:?}");
    assert!(acc[0] > 0.0, "the tiny pack's MTP head never agreed with its trunk: {acc:?}");
    // Each accepted draft adds one token to its step: with 3 drafts on
    // (almost) every step, tokens/step is 1 + the sum of the acceptances.
    let expect = 1.0 + acc.iter().sum::<f64>();
    assert!((tps - expect).abs() < 0.25, "tokens_per_step {tps}, 1 + sum(acceptance) {expect}");
    let drafts = num(&v, "mtp_drafts_per_step");
    assert!(drafts > 2.5 && drafts <= 3.0, "drafts per step {drafts}");
    let (spec, plain) = (num(&v, "decode_tok_per_s"), num(&v, "plain_decode_tok_per_s"));
    let speedup = num(&v, "mtp_speedup");
    assert!((speedup - spec / plain).abs() < 1e-9 * speedup.max(1.0), "{v}");
    let profile = v["mtp_step_profile_ms"].as_object().expect("mtp_step_profile_ms object");
    for phase in ["draft_mtp", "draft_head", "verify_trunk", "verify_head", "restore", "refill"] {
        assert!(profile[phase].as_f64().unwrap() >= 0.0, "{phase} in {profile:?}");
    }
    assert!(profile["verify_trunk"].as_f64().unwrap() > 0.0, "{profile:?}");
    // The projections (3.9 tokens a step with 7 drafts; this run's tokens a
    // step with 3), from the measured verify costs for 1..=8 tokens, the
    // draft cost and the rest of the measured step.
    let phase = |p: &str| profile[p].as_f64().unwrap();
    let verify: Vec<f64> = v["mtp_verify_ms"]
        .as_array()
        .expect("mtp_verify_ms array")
        .iter()
        .map(|a| a.as_f64().unwrap())
        .collect();
    assert_eq!(verify.len(), 8, "{v}");
    assert!(verify.iter().all(|&ms| ms > 0.0), "{verify:?}");
    let draft = phase("draft_mtp") + phase("draft_head");
    assert!((num(&v, "mtp_draft_ms") - draft / drafts).abs() < 1e-9, "{v}");
    let other = num(&v, "step_ms") - draft - phase("verify_trunk") - phase("verify_head");
    let step = |k: usize| verify[k] + k as f64 * draft / drafts + other.max(0.0);
    // The baseline is a plain step timed as the verify steps are.
    let plain_step = num(&v, "mtp_plain_step_ms");
    assert!(plain_step > 0.0, "{v}");
    let want = 3.9 * plain_step / step(7);
    let projected = num(&v, "mtp_projected_speedup");
    assert!((projected - want).abs() < 1e-6 * want, "projected {projected}, want {want}: {v}");
    let want = tps * plain_step / step(3);
    let measured = num(&v, "mtp_projected_speedup_measured");
    assert!((measured - want).abs() < 1e-6 * want, "projected {measured}, want {want}: {v}");
    assert!(v["mtp_best_drafts"].as_u64().is_some_and(|k| k <= 3), "{v}");
}

#[test]
fn mtp_0_is_plain_decoding() {
    let v = last_json(&bench(&["--mtp", "0"]));
    assert_eq!(num(&v, "tokens_per_step"), 1.0);
    assert_eq!(v["mtp"], 0);
    assert!(v.get("mtp_acceptance").is_none(), "{v}");
    if cfg!(target_arch = "x86_64") {
        // Each part's share of the prefill (the tiny pack has DeltaNet and
        // attention layers): five shares summing to 1.
        let share = v["prefill_share"].as_object().expect("prefill_share object");
        let parts = ["trunk_matmuls", "deltanet", "attention", "head", "rest"];
        assert_eq!(share.len(), parts.len(), "{share:?}");
        let sum: f64 = parts.iter().map(|p| share[*p].as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{share:?}");
        for p in ["trunk_matmuls", "deltanet", "attention", "head"] {
            assert!(share[p].as_f64().unwrap() > 0.0, "{p} in {share:?}");
        }
    }
}

#[test]
fn bad_mtp_values_fail_with_one_line() {
    let out = bench(&["--mtp", "8"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "stderr: {err}");
    // The service's one check of the draft count, naming the value.
    assert!(lines[0].contains("mtp 8") && lines[0].contains("at most 7"), "{}", lines[0]);
}
