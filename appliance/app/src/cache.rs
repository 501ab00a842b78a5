//! The automatic prefix cache of [`crate::ModelEngine`] (docs/protocol.md,
//! "Prefix cache"): checkpoints of sequence states, found by token prefix.
//!
//! A radix tree over token ids: each edge holds its tokens and the
//! attention keys and values of those positions ([`KvSpan`]), each node
//! whose position was checkpointed holds the fixed-size part of the state
//! there ([`Fixed`]: DeltaNet conv and recurrent states, last hidden). A
//! checkpoint is the path's KV spans plus its node's fixed part, so the KV
//! rows of a prefix shared by many checkpoints (a system prompt, earlier
//! turns) are kept once. [`PrefixCache::lookup`] finds the deepest usable
//! checkpoint of a prompt; [`PrefixCache::restore`] copies it into a
//! sequence's own state, so running sequences never depend on the cache.
//!
//! Everything is counted by [`Shape`] (kore-engine's one sizing function)
//! against a byte budget; past it the least recently used checkpoints go,
//! and with them the KV rows no remaining checkpoint needs.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use kore_engine::snapshot::file::{self, Decoded, Identity};
use kore_engine::snapshot::{self, Fixed, KvSpan, Shape, SnapshotError};
use kore_engine::state::KvPrecision;
use kore_engine::State;

/// Where a request's cached tokens came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// A checkpoint kept in memory by this process.
    Memory,
    /// A checkpoint handed back by a [`CheckpointStore`] (the disk tier).
    Disk,
}

impl Tier {
    /// `memory` or `disk`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Disk => "disk",
        }
    }
}

/// Counters of the prefix cache ([`crate::ModelEngine::cache_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests that started from a memory checkpoint.
    pub hits_memory: u64,
    /// Requests that started from a checkpoint loaded from the store.
    pub hits_disk: u64,
    /// Requests that could use the cache and found nothing.
    pub misses: u64,
    /// Prompt tokens served from memory checkpoints.
    pub tokens_memory: u64,
    /// Prompt tokens served from stored checkpoints.
    pub tokens_disk: u64,
    /// Bytes held in memory (KV rows, token ids, fixed parts).
    pub bytes: usize,
    /// The memory budget.
    pub budget: usize,
    /// Checkpoints held in memory.
    pub checkpoints: usize,
    /// Positions (KV rows) held in memory.
    pub positions: usize,
    /// Checkpoints dropped for the budget.
    pub evictions: u64,
    /// Checkpoints handed to the store to persist.
    pub persisted: u64,
    /// Requests that waited for another request's checkpoint instead of
    /// prefilling the same tokens.
    pub followed: u64,
}

/// A checkpoint handed to a [`CheckpointStore`]: the token prefix, the KV
/// spans covering it and the fixed part, shared with the memory tier (no
/// copy is made on the engine's thread; [`Checkpoint::encode`] serializes
/// it in the checkpoint file format wherever the store likes).
#[derive(Clone)]
pub struct Checkpoint {
    tokens: Vec<u32>,
    spans: Vec<Arc<KvSpan>>,
    fixed: Arc<Fixed>,
    identity: Identity,
}

impl core::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Checkpoint").field("tokens", &self.tokens.len()).finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// The token prefix it covers (the store's key).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// What its file says it belongs to.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Bytes of its file.
    pub fn file_bytes(&self) -> usize {
        file::file_bytes(&self.identity, self.tokens.len())
    }

    /// Writes its file (kore-engine's `snapshot::file` format) to `sink`.
    pub fn encode(&self, sink: &mut dyn FnMut(&[u8])) {
        let spans: Vec<&KvSpan> = self.spans.iter().map(|s| &**s).collect();
        file::encode(&self.identity, &self.tokens, &spans, &self.fixed, sink);
    }

    /// Writes about `budget` more bytes of its file to `sink`, going on from
    /// `cursor` (see `snapshot::file::encode_some`); true once it is complete.
    pub fn encode_some(
        &self,
        cursor: &mut file::EncodeCursor,
        budget: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> bool {
        let spans: Vec<&KvSpan> = self.spans.iter().map(|s| &**s).collect();
        file::encode_some(&self.identity, &self.tokens, &spans, &self.fixed, cursor, budget, sink)
    }

    /// Its file as one buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.file_bytes());
        self.encode(&mut |b| v.extend_from_slice(b));
        v
    }
}

/// Where checkpoints persist beyond the memory tier: the disk tier natively
/// (`crate::disk`, feature `std`), the host over vsock for a guest.
pub trait CheckpointStore {
    /// Keeps `checkpoint` (e.g. queues it for a writer thread); must not block long.
    fn persist(&mut self, checkpoint: Checkpoint);

    /// The deepest stored checkpoint whose tokens are a prefix of `prompt`,
    /// longer than `deeper_than` and `usable` at its length, already checked
    /// against `identity` (see `snapshot::file::decode`); `None` if there is none.
    fn fetch(
        &mut self,
        prompt: &[u32],
        deeper_than: usize,
        usable: &dyn Fn(usize) -> bool,
        identity: &Identity,
    ) -> Option<Decoded>;

    /// The store's counters, for `info` and `/metrics` (`None`: it keeps none).
    fn stats(&self) -> Option<StoreStats> {
        None
    }
}

/// Counters of a [`CheckpointStore`] (the disk tier's, natively or on the
/// host for a guest).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Checkpoint files kept.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The size budget.
    pub budget: u64,
    /// Files deleted for the budget.
    pub evictions: u64,
    /// Files written.
    pub written: u64,
    /// Files found bad and ignored.
    pub rejected: u64,
}

struct Ckpt {
    fixed: Arc<Fixed>,
    used: u64,
    tier: Tier,
}

struct Node {
    parent: usize,
    /// Position at the end of the edge.
    depth: usize,
    /// The edge's tokens (positions `depth - tokens.len()..depth`).
    tokens: Vec<u32>,
    kv: Arc<KvSpan>,
    children: BTreeMap<u32, usize>,
    ckpt: Option<Ckpt>,
}

/// A found checkpoint: its node and position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hit {
    node: usize,
    pub(crate) depth: usize,
}

/// The radix tree of checkpoints under a byte budget.
pub(crate) struct PrefixCache {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    lru: BTreeMap<u64, usize>,
    clock: u64,
    shape: Shape,
    kv: Option<KvPrecision>,
    pub(crate) stats: CacheStats,
}

const ROOT: usize = 0;

fn root() -> Node {
    let kv = Arc::new(KvSpan::from_parts(0, 0, Vec::new()));
    Node { parent: ROOT, depth: 0, tokens: Vec::new(), kv, children: BTreeMap::new(), ckpt: None }
}

impl PrefixCache {
    /// An empty cache for states of `shape`, at most `budget` bytes.
    pub(crate) fn new(shape: Shape, budget: usize) -> Self {
        let stats = CacheStats { budget, ..CacheStats::default() };
        let (nodes, free, lru) = (vec![Some(root())], Vec::new(), BTreeMap::new());
        PrefixCache { nodes, free, lru, clock: 0, shape, kv: None, stats }
    }

    /// Changes the budget, evicting at once.
    pub(crate) fn set_budget(&mut self, budget: usize) {
        self.stats.budget = budget;
        self.evict();
    }

    /// The shape of what it holds.
    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Whether anything can be kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.stats.budget >= self.shape.fixed_bytes()
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The child of `at` whose edge starts with `t`.
    fn child(&self, at: usize, t: u32) -> Option<usize> {
        self.node(at).children.get(&t).copied()
    }

    /// The deepest checkpoint whose tokens are a prefix of `prompt` and
    /// that `usable` accepts (by its length).
    pub(crate) fn lookup(&self, prompt: &[u32], usable: &dyn Fn(usize) -> bool) -> Option<Hit> {
        let (mut at, mut best) = (ROOT, None);
        loop {
            let n = self.node(at);
            if n.ckpt.is_some() && usable(n.depth) {
                best = Some(Hit { node: at, depth: n.depth });
            }
            let Some(&t) = prompt.get(n.depth) else { return best };
            let Some(c) = self.child(at, t) else { return best };
            let c_node = self.node(c);
            if prompt.get(n.depth..c_node.depth) != Some(&c_node.tokens[..]) {
                return best;
            }
            at = c;
        }
    }

    /// The KV spans from the root to `node`, in order.
    fn path(&self, mut node: usize) -> Vec<Arc<KvSpan>> {
        let mut spans = Vec::new();
        while node != ROOT {
            let n = self.node(node);
            spans.push(Arc::clone(&n.kv));
            node = n.parent;
        }
        spans.reverse();
        spans
    }

    /// Copies checkpoint `hit` into `state` and counts the hit.
    pub(crate) fn restore(&mut self, hit: Hit, state: &mut State) -> Result<Tier, SnapshotError> {
        let spans = self.path(hit.node);
        let refs: Vec<&KvSpan> = spans.iter().map(|s| &**s).collect();
        let now = self.tick();
        let ckpt = self.node_mut(hit.node).ckpt.as_mut().expect("a checkpoint node");
        let (old, tier) = (core::mem::replace(&mut ckpt.used, now), ckpt.tier);
        let fixed = Arc::clone(&ckpt.fixed);
        self.lru.remove(&old);
        self.lru.insert(now, hit.node);
        snapshot::restore(state, &refs, &fixed)?;
        let (hits, tokens) = match tier {
            Tier::Memory => (&mut self.stats.hits_memory, &mut self.stats.tokens_memory),
            Tier::Disk => (&mut self.stats.hits_disk, &mut self.stats.tokens_disk),
        };
        *hits += 1;
        *tokens += hit.depth as u64;
        Ok(tier)
    }

    /// Keeps `state` (which has run exactly `tokens`) as a checkpoint; a
    /// checkpoint already there is only marked used. Returns the new
    /// checkpoint for a store when one was made and `identity` is given.
    pub(crate) fn insert(
        &mut self,
        tokens: &[u32],
        state: &State,
        identity: Option<&Identity>,
    ) -> Option<Checkpoint> {
        if !self.enabled() || tokens.is_empty() || state.position() != tokens.len() {
            return None;
        }
        self.match_precision(state.kv_precision());
        let node = self.extend(tokens, &mut |r| KvSpan::capture(state, r));
        let made = self.mark(node, Tier::Memory, || Fixed::capture(state));
        let out = made.then(|| identity.map(|id| self.checkpoint(node, tokens, id))).flatten();
        self.evict();
        out
    }

    /// Keeps a checkpoint read back from a store; returns its position.
    pub(crate) fn insert_decoded(&mut self, d: Decoded) -> Option<usize> {
        if !self.enabled() || d.tokens.is_empty() {
            return None;
        }
        self.match_precision(d.kv.precision());
        let mut kv = Some(d.kv);
        let node = self.extend(&d.tokens, &mut |r: Range<usize>| {
            let mut all = kv.take().expect("one new edge per insertion");
            all.split_off(r.start)
        });
        let fixed = d.fixed;
        self.mark(node, Tier::Disk, || fixed);
        self.evict();
        Some(d.tokens.len())
    }

    /// Drops everything when checkpoints of another KV precision arrive.
    fn match_precision(&mut self, p: KvPrecision) {
        if self.kv.is_some_and(|k| k != p) {
            let (budget, stats) = (self.stats.budget, self.stats.clone());
            *self = PrefixCache::new(self.shape, budget);
            self.stats = CacheStats { bytes: 0, checkpoints: 0, positions: 0, ..stats };
        }
        self.kv = Some(p);
    }

    fn checkpoint(&self, node: usize, tokens: &[u32], id: &Identity) -> Checkpoint {
        let fixed = Arc::clone(&self.node(node).ckpt.as_ref().expect("checkpoint").fixed);
        let identity = Identity { kv: self.kv.unwrap_or_default(), ..*id };
        Checkpoint { tokens: tokens.to_vec(), spans: self.path(node), fixed, identity }
    }

    /// Gives `node` a checkpoint made by `fixed` unless it has one (then
    /// marks it used); whether one was made.
    fn mark(&mut self, node: usize, tier: Tier, fixed: impl FnOnce() -> Fixed) -> bool {
        let now = self.tick();
        if let Some(c) = self.node_mut(node).ckpt.as_mut() {
            let old = core::mem::replace(&mut c.used, now);
            self.lru.remove(&old);
            self.lru.insert(now, node);
            return false;
        }
        let fixed = Arc::new(fixed());
        self.stats.bytes += self.shape.fixed_bytes();
        self.stats.checkpoints += 1;
        self.node_mut(node).ckpt = Some(Ckpt { fixed, used: now, tier });
        self.lru.insert(now, node);
        true
    }

    /// The node at the end of `tokens`, made (splitting an edge, adding a
    /// leaf whose KV rows `kv(range)` gives) where missing.
    fn extend(&mut self, tokens: &[u32], kv: &mut dyn FnMut(Range<usize>) -> KvSpan) -> usize {
        let mut at = ROOT;
        loop {
            let depth = self.node(at).depth;
            if depth == tokens.len() {
                return at;
            }
            let Some(c) = self.child(at, tokens[depth]) else {
                return self.add(at, tokens, kv(depth..tokens.len()));
            };
            let edge = &self.node(c).tokens;
            let same = edge.iter().zip(&tokens[depth..]).take_while(|(a, b)| a == b).count();
            if same < edge.len() {
                self.split(c, same);
            }
            at = self.child(at, tokens[depth]).expect("the edge just walked");
        }
    }

    fn alloc(&mut self, n: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(n);
                i
            }
            None => {
                self.nodes.push(Some(n));
                self.nodes.len() - 1
            }
        }
    }

    /// A leaf under `parent` for the rest of `tokens`.
    fn add(&mut self, parent: usize, tokens: &[u32], kv: KvSpan) -> usize {
        let depth = self.node(parent).depth;
        let edge = tokens[depth..].to_vec();
        self.stats.bytes += kv.bytes() + edge.len() * 4;
        self.stats.positions += edge.len();
        let first = edge[0];
        let n = Node {
            parent,
            depth: tokens.len(),
            tokens: edge,
            kv: Arc::new(kv),
            children: BTreeMap::new(),
            ckpt: None,
        };
        let i = self.alloc(n);
        self.node_mut(parent).children.insert(first, i);
        i
    }

    /// Cuts `c`'s edge after its first `at` tokens into a new node.
    fn split(&mut self, c: usize, at: usize) {
        let n = self.node_mut(c);
        let mut head = Arc::unwrap_or_clone(core::mem::replace(
            &mut n.kv,
            Arc::new(KvSpan::from_parts(0, 0, Vec::new())),
        ));
        n.kv = Arc::new(head.split_off(at));
        let tail_tokens = n.tokens.split_off(at);
        let head_tokens = core::mem::replace(&mut n.tokens, tail_tokens);
        let (parent, depth) = (n.parent, n.depth - n.tokens.len());
        let first_tail = n.tokens[0];
        let first = head_tokens[0];
        let mid = Node {
            parent,
            depth,
            tokens: head_tokens,
            kv: Arc::new(head),
            children: BTreeMap::from([(first_tail, c)]),
            ckpt: None,
        };
        let m = self.alloc(mid);
        self.node_mut(c).parent = m;
        self.node_mut(parent).children.insert(first, m);
    }

    /// Drops least recently used checkpoints while over budget.
    fn evict(&mut self) {
        while self.stats.bytes > self.stats.budget {
            let Some((_, node)) = self.lru.pop_first() else { return };
            self.node_mut(node).ckpt = None;
            self.stats.bytes -= self.shape.fixed_bytes();
            self.stats.checkpoints -= 1;
            self.stats.evictions += 1;
            self.prune(node);
        }
    }

    /// Removes `node` and its ancestors while they hold nothing anyone needs.
    fn prune(&mut self, mut node: usize) {
        while node != ROOT {
            let n = self.node(node);
            if n.ckpt.is_some() || !n.children.is_empty() {
                return;
            }
            let n = self.nodes[node].take().expect("live node");
            self.free.push(node);
            self.stats.bytes -= n.kv.bytes() + n.tokens.len() * 4;
            self.stats.positions -= n.tokens.len();
            self.node_mut(n.parent).children.remove(&n.tokens[0]);
            node = n.parent;
        }
    }
}
