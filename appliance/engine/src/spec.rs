//! Speculative decoding with the model's own MTP head.
//!
//! One step, with the trunk at position `P` (it has processed `x_0..x_{P-1}`),
//! the next token `x_P` chosen but not yet processed, and the MTP cache
//! filled for positions `0..P-1` (its last output `g` drafts `x_{P+1}`):
//!
//! ```text
//! draft   d_1 = pick(lm_head(g)); d_j = pick(lm_head(mtp(d_{j-1}, g_{j-1})))   j = 2..N
//! verify  trunk([x_P, d_1..d_N]) in one checkpointed batch -> hidden H[0..=N], logits L[0..=N]
//! accept  the longest prefix d_1..d_a that the target agrees with, then one
//!         bonus token from L[a] (greedy: argmax; sampling: min(1, p/q)
//!         acceptance and a draw from the normalised residual max(0, p - q))
//! rewind  trunk to x_P, d_1..d_a (KV caches truncated, DeltaNet conv and
//!         recurrent state restored from the per-token checkpoint)
//! refill  MTP cache: drop the draft rows (they saw MTP hiddens), rerun the
//!         MTP over (d_1..d_a, bonus) with the trunk's H[0..=a]
//! ```
//!
//! The output equals plain decoding: greedy token for token, sampling in
//! distribution (Leviathan et al., "Fast Inference from Transformers via
//! Speculative Decoding", 2023). Drafts can use only the first `draft_vocab`
//! ids of the lm_head (byte-level BPE ids are roughly frequency-ranked);
//! verification always uses the full vocabulary, so output stays exact.

use alloc::vec;
use alloc::vec::Vec;

use crate::generate::{GenerateOptions, Generation, StopReason};
use crate::model::{ForwardError, Model, MtpError, MtpState};
use crate::sampling::{argmax, Sampler};
use crate::state::{Checkpoints, State};
use crate::weights::Linear;

/// Most drafts per step.
pub const MAX_DRAFTS: usize = 7;

/// When the adaptive draft length has chosen plain steps (drafting does not
/// pay at the estimated acceptance), every this many steps one draft is
/// made anyway to keep measuring the acceptance.
pub const PROBE_EVERY: usize = 8;

/// Vocabularies up to this size are drafted in full.
pub const FULL_DRAFT_VOCAB_MAX: usize = 32 * 1024;

/// Draft vocabulary for a model of `vocab` ids: all of them up to
/// [`FULL_DRAFT_VOCAB_MAX`] (there the draft lm_head is cheap next to the
/// MTP layer, and on the tiny pack a quarter of 4096 ids cut tokens per step
/// from 2.42 to 2.03 at 5 drafts, docs/benchmarks.md), else the lowest
/// quarter of the ids, at least [`FULL_DRAFT_VOCAB_MAX`] (byte-level BPE ids
/// are roughly frequency-ranked).
pub fn draft_vocab(vocab: usize) -> usize {
    if vocab <= FULL_DRAFT_VOCAB_MAX {
        vocab
    } else {
        (vocab / 4).max(FULL_DRAFT_VOCAB_MAX)
    }
}

/// How a rejected draft's trunk state is undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore {
    /// Record every verified token's DeltaNet state and restore the accepted one.
    Checkpoint,
    /// Snapshot the state before verifying; on rejection restore it and run
    /// the accepted tokens through the trunk again.
    Recompute,
}

/// Speculative decoding settings.
#[derive(Clone, Copy, Debug)]
pub struct SpecOptions {
    /// Drafts per step, at most (1..=7).
    pub max_drafts: usize,
    /// Adapt the draft length to the measured acceptance.
    pub adaptive: bool,
    /// Draft over ids `0..draft_vocab` only (0 or >= vocab: all).
    pub draft_vocab: usize,
    /// How rejected drafts are undone.
    pub restore: Restore,
    /// Cost of one draft relative to one single-token trunk step (adaptive mode).
    pub draft_cost: f32,
    /// Extra cost of verifying one more token, relative to a single-token step.
    pub verify_cost: f32,
}

impl SpecOptions {
    /// `n` drafts a step, adaptive, full draft vocabulary, checkpoint restore.
    pub fn new(n: usize) -> Self {
        SpecOptions {
            max_drafts: n.clamp(1, MAX_DRAFTS),
            adaptive: true,
            draft_vocab: 0,
            restore: Restore::Checkpoint,
            draft_cost: 0.2,
            verify_cost: 0.15,
        }
    }
}

/// Counters of a speculative generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Verification steps (trunk forwards after the prefill).
    pub steps: usize,
    /// Tokens those steps produced (accepted drafts plus bonus tokens).
    pub step_tokens: usize,
    /// Drafts proposed at each draft position.
    pub drafted: [u64; MAX_DRAFTS],
    /// Drafts accepted at each draft position.
    pub accepted: [u64; MAX_DRAFTS],
    /// Where the steps' time went (all zero without [`Speculator::set_clock`]).
    pub profile: StepProfile,
}

/// Nanoseconds the steps spent in each phase, summed over steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepProfile {
    /// Chained MTP layer runs (`mtp.fc` + decoder layer) of the drafts.
    pub draft_mtp_ns: u64,
    /// Draft lm_head (over the draft vocabulary) and the draft pick.
    pub draft_head_ns: u64,
    /// The trunk's batched (checkpointed) forward over pending + drafts.
    pub verify_trunk_ns: u64,
    /// The full-vocabulary lm_head over the verified rows and acceptance.
    pub verify_head_ns: u64,
    /// Undoing rejected drafts (rewind, or snapshot and recompute).
    pub restore_ns: u64,
    /// Refilling the MTP cache over the kept positions.
    pub refill_ns: u64,
}

impl StepProfile {
    /// The phases as `(name, ns)`, in step order.
    pub fn phases(&self) -> [(&'static str, u64); 6] {
        [
            ("draft_mtp", self.draft_mtp_ns),
            ("draft_head", self.draft_head_ns),
            ("verify_trunk", self.verify_trunk_ns),
            ("verify_head", self.verify_head_ns),
            ("restore", self.restore_ns),
            ("refill", self.refill_ns),
        ]
    }
}

impl SpecStats {
    /// Mean tokens produced per trunk step (1.0 without drafting).
    pub fn tokens_per_step(&self) -> f64 {
        if self.steps == 0 {
            1.0
        } else {
            self.step_tokens as f64 / self.steps as f64
        }
    }

    /// Acceptance rate at each draft position that was tried.
    pub fn acceptance(&self) -> Vec<f64> {
        self.drafted
            .iter()
            .zip(&self.accepted)
            .take_while(|(d, _)| **d > 0)
            .map(|(d, a)| *a as f64 / *d as f64)
            .collect()
    }
}

/// The speculative decoder of one sequence.
pub struct Speculator<'m, 'a> {
    model: &'m Model<'a>,
    opts: SpecOptions,
    sampler: Sampler,
    mtp: MtpState,
    ckpt: Checkpoints,
    /// MTP normed output at position P-1 (drafts the token after `pending`).
    g: Vec<f32>,
    /// Token chosen but not yet run through the trunk.
    pending: u32,
    /// Running acceptance estimate per draft position.
    alpha: [f32; MAX_DRAFTS],
    /// Adaptive plain steps in a row (see [`PROBE_EVERY`]).
    plain_steps: usize,
    /// Statistics so far.
    pub stats: SpecStats,
    /// Nanosecond clock for [`SpecStats::profile`] (none: not profiled).
    clock: Option<&'m dyn Fn() -> u64>,
}

impl<'m, 'a> Speculator<'m, 'a> {
    /// Prefills `prompt` into `state` (a fresh state: the MTP cache must cover
    /// the same positions) and picks the first token, returned by
    /// [`Speculator::pending`].
    pub fn start(
        model: &'m Model<'a>,
        state: &mut State,
        prompt: &[u32],
        sampler: Sampler,
        opts: SpecOptions,
    ) -> Result<Self, MtpError> {
        if !model.has_mtp() {
            return Err(MtpError::NoMtpHead);
        }
        if state.position() != 0 {
            return Err(ForwardError::StateMismatch.into());
        }
        let h = model.config.hidden_size;
        let hidden = model.forward_hidden(state, prompt)?;
        let mut me = Speculator {
            model,
            opts: SpecOptions { max_drafts: opts.max_drafts.clamp(1, MAX_DRAFTS), ..opts },
            sampler,
            mtp: MtpState::with_kv(model.options().kv),
            ckpt: Checkpoints::new(),
            g: Vec::new(),
            pending: 0,
            alpha: [0.6; MAX_DRAFTS],
            plain_steps: 0,
            stats: SpecStats::default(),
            clock: None,
        };
        let logits = model.logits(&hidden[hidden.len() - h..]);
        me.pending = me.sampler.sample(&logits);
        let mut shifted = prompt[1..].to_vec();
        shifted.push(me.pending);
        let g = model.mtp_forward(&mut me.mtp, &shifted, &hidden)?;
        me.g = g[g.len() - h..].to_vec();
        Ok(me)
    }

    /// Times each phase of later steps with `clock` (nanoseconds) into
    /// [`SpecStats::profile`].
    pub fn set_clock(&mut self, clock: &'m dyn Fn() -> u64) {
        self.clock = Some(clock);
    }

    /// The clock's reading, 0 without one.
    fn now(&self) -> u64 {
        self.clock.map_or(0, |c| c())
    }

    /// The token chosen next (already part of the output).
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// Draft length for the next step, at most `limit`. The adaptive length
    /// is 0 (a plain step) when no length beats one token a step at the
    /// estimated acceptance; then every [`PROBE_EVERY`]-th step drafts one
    /// token anyway, so the estimate can recover.
    fn draft_len(&mut self, limit: usize) -> usize {
        let max = self.opts.max_drafts.min(limit);
        if !self.opts.adaptive || max == 0 {
            return max;
        }
        let n = best_len(&self.alpha, &self.opts, max);
        if n == 0 && self.plain_steps + 1 >= PROBE_EVERY {
            self.plain_steps = 0;
            return 1;
        }
        self.plain_steps = if n == 0 { self.plain_steps + 1 } else { 0 };
        n
    }

    /// Draft logits over the draft vocabulary for MTP output `g`.
    fn draft_logits(&self, g: &[f32]) -> Vec<f32> {
        let head = draft_head(&self.model.lm_head, self.opts.draft_vocab);
        let mut out = vec![0.0; head.rows()];
        self.model.exec().matmul(&head, g, 1, &mut out);
        out
    }

    /// One draft-and-verify step over `state`; returns the new tokens (the
    /// accepted drafts and a bonus token; the last becomes `pending`).
    /// `limit` caps the drafts (remaining token budget, context).
    pub fn step(&mut self, state: &mut State, limit: usize) -> Result<Vec<u32>, MtpError> {
        let model = self.model;
        let h = model.config.hidden_size;
        let room = model.config.max_position_embeddings.saturating_sub(state.position() + 1);
        let n = self.draft_len(limit.min(room));
        let p0 = state.position();
        if n == 0 {
            let hidden = model.forward_hidden(state, &[self.pending])?;
            let tok = self.sampler.sample(&model.logits(&hidden));
            self.finish(&[self.pending], &hidden, tok, p0)?;
            return Ok(vec![tok]);
        }
        // Draft d_1..d_n; keep each draft distribution when sampling.
        let mut drafts = Vec::with_capacity(n);
        let mut q = Vec::with_capacity(n);
        let mut g = self.g.clone();
        let mut t = self.now();
        for j in 0..n {
            let logits = self.draft_logits(&g);
            let d = if self.sampler.params().is_greedy() {
                argmax(&logits)
            } else {
                let dist = self.sampler.distribution(&logits);
                let d = self.sampler.draw(&dist);
                q.push(dist);
                d
            };
            drafts.push(d);
            t = self.lap(t, |p| &mut p.draft_head_ns);
            if j + 1 < n {
                g = model.mtp_forward(&mut self.mtp, &[d], &g)?;
                t = self.lap(t, |p| &mut p.draft_mtp_ns);
            }
        }
        // Verify all in one batch.
        let mut tokens = vec![self.pending];
        tokens.extend_from_slice(&drafts);
        let snapshot = (self.opts.restore == Restore::Recompute).then(|| state.clone());
        let hidden = match snapshot {
            Some(_) => model.forward_hidden(state, &tokens)?,
            None => model.forward_hidden_checkpointed(state, &tokens, &mut self.ckpt)?,
        };
        t = self.lap(t, |p| &mut p.verify_trunk_ns);
        let logits = model.logits(&hidden); // [n+1, vocab]
        let v = model.config.vocab_size;
        let (a, bonus) = self.accept(&drafts, &q, &logits, v);
        t = self.lap(t, |p| &mut p.verify_head_ns);
        for j in 0..n {
            self.stats.drafted[j] += 1;
            let ok = j < a;
            self.stats.accepted[j] += ok as u64;
            if j <= a {
                self.alpha[j] = 0.9 * self.alpha[j] + 0.1 * (ok as u8 as f32);
            }
        }
        let kept = &tokens[..a + 1];
        let hidden = match snapshot {
            Some(snap) if a < n => {
                *state = snap;
                model.forward_hidden(state, kept)?
            }
            Some(_) => hidden,
            None => {
                if a < n {
                    state
                        .rewind(&self.ckpt, a + 1, &hidden[a * h..(a + 1) * h])
                        .map_err(|_| MtpError::Forward(ForwardError::StateMismatch))?;
                }
                hidden[..(a + 1) * h].to_vec()
            }
        };
        debug_assert_eq!(state.position(), p0 + a + 1);
        t = self.lap(t, |p| &mut p.restore_ns);
        self.finish(kept, &hidden, bonus, p0)?;
        self.lap(t, |p| &mut p.refill_ns);
        let mut out = drafts[..a].to_vec();
        out.push(bonus);
        Ok(out)
    }

    /// Adds the time since `t0` to the phase `field` picks; returns now.
    fn lap(&mut self, t0: u64, field: fn(&mut StepProfile) -> &mut u64) -> u64 {
        let t = self.now();
        *field(&mut self.stats.profile) += t.saturating_sub(t0);
        t
    }

    /// Counts the step, refills the MTP cache for the kept positions
    /// `p0..p0+kept.len()` (tokens `kept`, trunk `hidden`) and makes `next`
    /// pending.
    fn finish(
        &mut self,
        kept: &[u32],
        hidden: &[f32],
        next: u32,
        p0: usize,
    ) -> Result<(), MtpError> {
        self.stats.steps += 1;
        self.stats.step_tokens += kept.len();
        self.mtp.truncate(p0);
        let mut shifted = kept[1..].to_vec();
        shifted.push(next);
        let g = self.model.mtp_forward(&mut self.mtp, &shifted, hidden)?;
        let h = self.model.config.hidden_size;
        self.g = g[g.len() - h..].to_vec();
        self.pending = next;
        Ok(())
    }

    /// Accepted draft count and the bonus token, from the verify logits
    /// (`[n+1, vocab]`).
    fn accept(
        &mut self,
        drafts: &[u32],
        q: &[Vec<(u32, f64)>],
        logits: &[f32],
        v: usize,
    ) -> (usize, u32) {
        let row = |i: usize| &logits[i * v..(i + 1) * v];
        if self.sampler.params().is_greedy() {
            for (i, &d) in drafts.iter().enumerate() {
                let t = argmax(row(i));
                if t != d {
                    return (i, t);
                }
            }
            return (drafts.len(), argmax(row(drafts.len())));
        }
        for (i, &d) in drafts.iter().enumerate() {
            let p = self.sampler.distribution(row(i));
            let (pd, qd) = (prob(&p, d), prob(&q[i], d));
            if qd > 0.0 && self.sampler.uniform() < (pd / qd).min(1.0) {
                continue;
            }
            let residual = residual(&p, &q[i]);
            let t = if residual.is_empty() {
                self.sampler.draw(&p)
            } else {
                self.sampler.draw(&residual)
            };
            return (i, t);
        }
        let p = self.sampler.distribution(row(drafts.len()));
        (drafts.len(), self.sampler.draw(&p))
    }
}

/// The lm_head restricted to its first `k` rows (0 or >= rows: all).
fn draft_head<'a>(w: &Linear<'a>, k: usize) -> Linear<'a> {
    w.first_rows(k)
}

fn prob(dist: &[(u32, f64)], t: u32) -> f64 {
    dist.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1)
}

/// `normalise(max(0, p - q))`, empty when it is all zero.
fn residual(p: &[(u32, f64)], q: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let mut r: Vec<(u32, f64)> =
        p.iter().map(|&(t, pt)| (t, (pt - prob(q, t)).max(0.0))).filter(|e| e.1 > 0.0).collect();
    let s: f64 = r.iter().map(|e| e.1).sum();
    if s <= 0.0 {
        return Vec::new();
    }
    r.iter_mut().for_each(|e| e.1 /= s);
    r
}

/// [`crate::generate`] with MTP speculative decoding: the same tokens for
/// greedy decoding, the same distribution when sampling. `state` must be fresh.
pub fn generate_spec(
    model: &Model<'_>,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
    spec: &SpecOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Generation, SpecStats), MtpError> {
    let mut tokens = Vec::new();
    if opts.max_tokens == 0 {
        model.forward_hidden(state, prompt)?;
        return Ok((Generation { tokens, stop: StopReason::MaxTokens }, SpecStats::default()));
    }
    let mut sp = Speculator::start(model, state, prompt, Sampler::new(opts.sampling), *spec)?;
    let mut batch = vec![sp.pending()];
    loop {
        for &t in &batch {
            tokens.push(t);
            if !on_token(t) {
                return Ok((Generation { tokens, stop: StopReason::Cancelled }, sp.stats));
            }
            if opts.stop_tokens.contains(&t) {
                return Ok((Generation { tokens, stop: StopReason::StopToken }, sp.stats));
            }
            if tokens.len() >= opts.max_tokens {
                return Ok((Generation { tokens, stop: StopReason::MaxTokens }, sp.stats));
            }
        }
        // Drafts beyond the remaining budget would be wasted.
        let left = opts.max_tokens - tokens.len();
        batch = sp.step(state, left.saturating_sub(1))?;
    }
}

/// The draft length in `0..=max` with the most expected tokens per unit
/// cost at the acceptance estimates `alpha` (per draft position, given the
/// ones before were accepted): `E(n) = 1 + sum_k prod_{j<=k} alpha_j` over
/// `cost(n) = 1 + n * (draft_cost + verify_cost)`; a plain step is 1 / 1.
fn best_len(alpha: &[f32; MAX_DRAFTS], opts: &SpecOptions, max: usize) -> usize {
    let (mut best, mut best_rate) = (0, 1.0f32);
    let (mut expect, mut reach) = (1.0f32, 1.0f32);
    for n in 1..=max.min(MAX_DRAFTS) {
        reach *= alpha[n - 1];
        expect += reach;
        let rate = expect / (1.0 + n as f32 * (opts.draft_cost + opts.verify_cost));
        if rate > best_rate {
            best = n;
            best_rate = rate;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::{best_len, SpecOptions, MAX_DRAFTS};

    #[test]
    fn adaptive_length_drafts_only_where_it_pays() {
        let opts = SpecOptions::new(7); // draft 0.2 + verify 0.15 a token
                                        // High acceptance: every draft pays.
        assert_eq!(best_len(&[0.95; MAX_DRAFTS], &opts, 7), 7);
        // One draft pays when alpha > 0.35; below that a plain step is best.
        assert_eq!(best_len(&[0.5; MAX_DRAFTS], &opts, 7), 1);
        assert_eq!(best_len(&[0.3; MAX_DRAFTS], &opts, 7), 0);
        assert_eq!(best_len(&[0.0; MAX_DRAFTS], &opts, 1), 0);
        // Drafts that cost as much as a step never pay.
        let dear = SpecOptions { draft_cost: 1.0, ..opts };
        assert_eq!(best_len(&[0.9; MAX_DRAFTS], &dear, 7), 0);
    }
}
