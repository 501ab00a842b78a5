//! The prefix cache's part of [`ModelEngine`]: where a sequence starts
//! (the deepest usable checkpoint in memory, else in the store, or after
//! waiting for a running sequence that is about to checkpoint a longer
//! shared prefix), where it checkpoints, and keeping checkpoints.
//!
//! Exactness: checkpoints are kept and used only with kernels whose results
//! do not depend on how a prompt is cut into calls (`snapshot::cuts_exact`:
//! prefill calls of any length and decode steps compute every token alike),
//! and every prompt is cut by the same rule ([`crate::seq::plan`]), so a
//! state at a checkpoint is bit for bit the state any other run of those
//! tokens reaches.

use alloc::vec::Vec;

use kore_engine::snapshot;
use kore_engine::snapshot::file::Identity;
use kore_engine::State;
use kore_service::{GenParams, SeqId};

use super::ModelEngine;
use crate::cache::{CacheStats, CheckpointStore, PrefixCache, Tier};
use crate::seq::{plan, Phase, Seq};

/// Puts `s` at position `depth` of `prompt` (its state already there).
fn place(s: &mut Seq<'_>, prompt: &[u32], depth: usize) {
    s.ran = prompt[..depth].to_vec();
    if let Phase::Plain { input, .. } = &mut s.phase {
        *input = prompt[depth..].to_vec();
    }
}

/// The prompt of a waiting (not yet decoding) plain sequence.
fn prompt_of(s: &Seq<'_>) -> Vec<u32> {
    s.known_tokens().copied().collect()
}

impl<'m> ModelEngine<'m> {
    /// Keeps at most `bytes` of checkpoints in memory (docs/protocol.md,
    /// "Prefix cache"; counted by `kore_engine::snapshot::Shape`); least
    /// recently used checkpoints are dropped beyond it. `0` turns the
    /// cache off.
    pub fn with_cache_budget(mut self, bytes: usize) -> Self {
        self.cache.set_budget(bytes);
        self
    }

    /// The former name of [`Self::with_cache_budget`] (named sessions are
    /// served by the prefix cache now).
    pub fn with_session_budget(self, bytes: usize) -> Self {
        self.with_cache_budget(bytes)
    }

    /// Checkpoints a long prompt every `tokens` positions (rounded up to a
    /// multiple of the prefill chunk; at least one chunk).
    pub fn with_checkpoint_interval(mut self, tokens: usize) -> Self {
        self.checkpoint_interval = tokens.max(1);
        self
    }

    /// Persists checkpoints to `store` and looks there for prompts the
    /// memory tier has no checkpoint for; `pack` names the weights in the
    /// checkpoint files (e.g. the pack's digest).
    pub fn with_store(
        mut self,
        store: alloc::boxed::Box<dyn CheckpointStore + 'm>,
        pack: [u8; 32],
    ) -> Self {
        self.store = Some((store, pack));
        self
    }

    /// The prefix cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats.clone()
    }

    /// The cache's counters as `info` reports them: the memory tier's and
    /// the store's (disk) where there is one.
    pub fn cache_counters(&self) -> kore_service::protocol::CacheInfo {
        let c = &self.cache.stats;
        let d = self.store.as_ref().and_then(|(s, _)| s.stats()).unwrap_or_default();
        kore_service::protocol::CacheInfo {
            hits_memory: c.hits_memory,
            hits_disk: c.hits_disk,
            misses: c.misses,
            tokens_memory: c.tokens_memory,
            tokens_disk: c.tokens_disk,
            bytes_memory: c.bytes as u64,
            budget_memory: c.budget as u64,
            checkpoints: c.checkpoints as u64,
            evictions_memory: c.evictions,
            bytes_disk: d.bytes,
            budget_disk: d.budget,
            files: d.files,
            evictions_disk: d.evictions,
            written: d.written,
            rejected: d.rejected,
        }
    }

    /// Prompt tokens of running sequence `seq` served from the cache so far,
    /// and the tier they came from (`None`: none).
    pub fn served_from(&self, seq: SeqId) -> Option<(u32, Option<Tier>)> {
        self.seqs.get(&seq).map(|s| s.served)
    }

    fn caching(&self) -> bool {
        self.cache.enabled() && snapshot::cuts_exact(self.model)
    }

    fn identity(&self, pack: [u8; 32]) -> Identity {
        Identity { pack, shape: *self.cache.shape(), kv: self.model.options().kv }
    }

    /// Sets up plain sequence `s` of `prompt`: checkpoint positions, the
    /// deepest usable checkpoint, a leader to wait for, the calls.
    pub(super) fn resume(&mut self, s: &mut Seq<'m>, prompt: &[u32], params: &GenParams) {
        let len = prompt.len();
        if self.caching() {
            let mut wanted: Vec<usize> = params.boundaries.iter().map(|&b| b as usize).collect();
            wanted
                .extend(params.checkpoint_at.iter().chain(&params.shared_at).map(|&b| b as usize));
            wanted.retain(|&b| b > 0 && b < len);
            s.wanted = wanted;
            let depth = self.start_from(s, prompt);
            if depth == 0 {
                self.cache.stats.misses += 1;
            }
            s.wait = self.leader_target(prompt, depth);
        }
        self.replan(s);
    }

    /// Recomputes `s`'s calls and checkpoints from where its state is.
    fn replan(&self, s: &mut Seq<'_>) {
        let at = s.ran.len();
        let mut wanted = s.wanted.clone();
        if self.caching() {
            let every = self.checkpoint_interval.div_ceil(self.prefill_chunk) * self.prefill_chunk;
            wanted.extend((1..).map(|k| k * every).take_while(|&g| g < s.prompt_len));
            wanted.push(s.prompt_len);
        }
        (s.cuts, s.stops) = plan(at, s.prompt_len, self.prefill_chunk, &wanted);
    }

    /// Restores `s` from the deepest usable checkpoint of `prompt` deeper
    /// than where it is (memory first, then the store); returns its position.
    fn start_from(&mut self, s: &mut Seq<'m>, prompt: &[u32]) -> usize {
        let len = prompt.len();
        let ok = |d: usize| d < len;
        let from = s.ran.len();
        let hit = self.cache.lookup(prompt, &ok).filter(|h| h.depth > from);
        let mem = hit.map_or(from, |h| h.depth);
        if let Some((store, pack)) = self.store.as_mut() {
            let kv = s.state.kv_precision();
            let id = Identity { pack: *pack, shape: *self.cache.shape(), kv };
            if let Some(d) = store.fetch(prompt, mem, &ok, &id) {
                let depth = d.tokens.len();
                if snapshot::restore(&mut s.state, &[&d.kv], &d.fixed).is_ok() {
                    self.cache.stats.hits_disk += 1;
                    self.cache.stats.tokens_disk += depth as u64;
                    self.cache.insert_decoded(d);
                    place(s, prompt, depth);
                    s.served = (depth as u32, Some(Tier::Disk));
                    return depth;
                }
                s.state.reset();
                place(s, prompt, 0);
            }
        }
        let Some(hit) = hit else { return from };
        match self.cache.restore(hit, &mut s.state) {
            Ok(tier) => {
                place(s, prompt, hit.depth);
                s.served = (hit.depth as u32, Some(tier));
                hit.depth
            }
            Err(_) => {
                place(s, prompt, 0);
                s.served = (0, None);
                0
            }
        }
    }

    /// The deepest checkpoint position past `from` that a running,
    /// non-waiting sequence will take on a prefix it shares with `prompt`.
    fn leader_target(&self, prompt: &[u32], from: usize) -> Option<usize> {
        let len = prompt.len();
        let mut best = None;
        for r in self.seqs.values().filter(|r| r.wait.is_none() && !r.stops.is_empty()) {
            let lcp = r.known_tokens().zip(prompt).take_while(|(a, b)| a == b).count();
            let at = r.ran.len();
            let target = r.stops.iter().copied().filter(|&q| q > at && q > from && q <= lcp);
            let target = target.filter(|&q| q < len).max();
            best = best.max(target);
        }
        best
    }

    /// After checkpoints were kept or a sequence ended: every waiting
    /// sequence continues from what is cached now, waits on, or runs.
    pub(super) fn follow_up(&mut self) {
        let waiting: Vec<u64> =
            self.seqs.iter().filter(|(_, s)| s.wait.is_some()).map(|(&id, _)| id).collect();
        for id in waiting {
            let Some(mut s) = self.seqs.remove(&id) else { continue };
            let prompt = prompt_of(&s);
            let before = s.ran.len();
            let depth = self.start_from(&mut s, &prompt);
            if depth > before {
                self.cache.stats.followed += 1;
            }
            s.wait = self.leader_target(&prompt, depth);
            self.replan(&mut s);
            self.seqs.insert(id, s);
        }
    }

    /// Keeps `state` (having run `tokens`) as a checkpoint at the end of a
    /// generation.
    pub(super) fn keep(&mut self, tokens: &[u32], state: &State) {
        Self::keep_in(&mut self.cache, &mut self.store, tokens, state, true);
    }

    /// Keeps a checkpoint in `cache`, and hands it to `store` when it is
    /// new and `persist` (message boundaries, prompt and generation ends;
    /// not the interval checkpoints inside long prompts).
    pub(super) fn keep_in(
        cache: &mut PrefixCache,
        store: &mut Option<(alloc::boxed::Box<dyn CheckpointStore + 'm>, [u8; 32])>,
        tokens: &[u32],
        state: &State,
        persist: bool,
    ) {
        let id = match store.as_ref() {
            Some((_, pack)) if persist => {
                let kv = state.kv_precision();
                Some(Identity { pack: *pack, shape: *cache.shape(), kv })
            }
            _ => None,
        };
        if let Some(cp) = cache.insert(tokens, state, id.as_ref()) {
            if let Some((store, _)) = store.as_mut() {
                store.persist(cp);
                cache.stats.persisted += 1;
            }
        }
    }

    /// Offers a checkpoint file (e.g. one the host kept for a guest) to the
    /// memory tier; returns the token count it covers. The file is checked
    /// as `snapshot::file::decode` does against this engine's model and
    /// the pack named in [`ModelEngine::with_store`] (all zeros without one).
    pub fn offer(&mut self, bytes: &[u8]) -> Result<usize, snapshot::SnapshotError> {
        let pack = self.store.as_ref().map_or([0; 32], |(_, p)| *p);
        let d = snapshot::file::decode(bytes, &self.identity(pack))
            .map_err(snapshot::SnapshotError::File)?;
        self.cache.insert_decoded(d).ok_or(snapshot::SnapshotError::Mismatch("cache is off"))
    }
}
