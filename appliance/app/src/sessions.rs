//! Kept session states of [`crate::ModelEngine`]: per session name, up to
//! two checkpoints of a finished request's sequence (the state after its
//! prompt, and the state after its last generated token that ran), each with
//! the token ids it covers.
//!
//! The rule (docs/protocol.md, "Sessions"): a new request of the session
//! continues from the checkpoint with the longest token list that is a
//! strict prefix of its prompt (a DeltaNet state cannot be rewound, so a
//! checkpoint is usable only whole), and prefills only the rest. The
//! checkpoint after the answer serves a chat template that re-renders the
//! answer token for token; the one after the prompt serves a template that
//! re-renders it differently (Qwen3.5 drops the thinking of earlier turns).
//! Kept states count against a byte budget; the least recently used
//! sessions are dropped first.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use kore_engine::State;

/// One checkpoint: a state and the tokens it has run.
pub(crate) struct Checkpoint {
    pub(crate) tokens: Vec<u32>,
    pub(crate) state: State,
}

struct Kept {
    checkpoints: Vec<Checkpoint>,
    bytes: usize,
    used: u64,
}

/// Kept states by session name, and shared prefixes by their tokens, under
/// one byte budget.
pub(crate) struct Sessions {
    map: BTreeMap<String, Kept>,
    shared: BTreeMap<Vec<u32>, Kept>,
    budget: usize,
    bytes: usize,
    clock: u64,
}

impl Sessions {
    /// No sessions; at most `budget` bytes of kept states.
    pub(crate) fn new(budget: usize) -> Self {
        Sessions { map: BTreeMap::new(), shared: BTreeMap::new(), budget, bytes: 0, clock: 0 }
    }

    /// Changes the budget (evicting at the next [`Sessions::keep`]).
    pub(crate) fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
    }

    /// Takes session `name`'s best checkpoint for `prompt` (the longest
    /// whose tokens are a strict prefix of it) out of the store, dropping
    /// the session's other checkpoints; `None` when none fits.
    pub(crate) fn take(&mut self, name: &str, prompt: &[u32]) -> Option<Checkpoint> {
        let kept = self.map.remove(name)?;
        self.bytes -= kept.bytes;
        kept.checkpoints
            .into_iter()
            .filter(|c| c.tokens.len() < prompt.len() && prompt.starts_with(&c.tokens))
            .max_by_key(|c| c.tokens.len())
    }

    /// Keeps `checkpoints` (empty ones dropped) as session `name`'s,
    /// replacing what it had, then drops least recently used sessions while
    /// the total is over budget (this one too if it alone is).
    pub(crate) fn keep(&mut self, name: String, checkpoints: Vec<Checkpoint>) {
        if let Some(old) = self.map.remove(&name) {
            self.bytes -= old.bytes;
        }
        let checkpoints: Vec<Checkpoint> =
            checkpoints.into_iter().filter(|c| !c.tokens.is_empty()).collect();
        if checkpoints.is_empty() {
            return;
        }
        let bytes = checkpoints.iter().map(|c| c.state.bytes()).sum();
        self.clock += 1;
        self.bytes += bytes;
        self.map.insert(name, Kept { checkpoints, bytes, used: self.clock });
        self.evict();
    }

    /// A copy of the longest shared prefix that is a strict prefix of
    /// `prompt` (see [`Sessions::share`]).
    pub(crate) fn shared_for(&mut self, prompt: &[u32]) -> Option<Checkpoint> {
        self.clock += 1;
        let (_, kept) = self
            .shared
            .iter_mut()
            .filter(|(t, _)| t.len() < prompt.len() && prompt.starts_with(t))
            .max_by_key(|(t, _)| t.len())?;
        kept.used = self.clock;
        let c = &kept.checkpoints[0];
        Some(Checkpoint { tokens: c.tokens.clone(), state: c.state.clone() })
    }

    /// Keeps `prefix` for every session whose prompt starts with its tokens
    /// (a system prompt), unless it is kept already.
    pub(crate) fn share(&mut self, prefix: Checkpoint) {
        self.clock += 1;
        if let Some(k) = self.shared.get_mut(&prefix.tokens) {
            k.used = self.clock;
            return;
        }
        let bytes = prefix.state.bytes();
        self.bytes += bytes;
        let kept = Kept { checkpoints: alloc::vec![prefix], bytes, used: self.clock };
        self.shared.insert(kept.checkpoints[0].tokens.clone(), kept);
        self.evict();
    }

    /// Drops the least recently used sessions and prefixes while over budget.
    fn evict(&mut self) {
        while self.bytes > self.budget {
            let named =
                self.map.iter().min_by_key(|(_, k)| k.used).map(|(n, k)| (k.used, n.clone()));
            let shared =
                self.shared.iter().min_by_key(|(_, k)| k.used).map(|(t, k)| (k.used, t.clone()));
            let freed = match (named, shared) {
                (Some((a, n)), Some((b, _))) if a <= b => self.map.remove(&n),
                (_, Some((_, t))) => self.shared.remove(&t),
                (Some((_, n)), None) => self.map.remove(&n),
                (None, None) => break,
            };
            self.bytes -= freed.map_or(0, |k| k.bytes);
        }
    }

    /// Sessions kept.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes of kept states.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}
