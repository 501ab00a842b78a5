//! Per-sequence state: each layer's cache (DeltaNet conv window and f32
//! recurrent state, or the attention KV cache), the position, and the trunk's
//! last final-normed hidden state (input of the MTP head). Cloning a state is
//! a checkpoint; `reset` starts a new sequence. [`Checkpoints`] record the
//! DeltaNet states after every token of one forward call so that speculative
//! decoding can [`State::rewind`] to the accepted prefix without recomputing.
//!
//! Attention keys and values are kept as f16 by default ([`KvPrecision`]):
//! half the bytes of f32, which is what decode reads at long context, and on
//! a trained model's held-out text 99.85% of next-token argmaxes agree with
//! f32 (docs/benchmarks.md, KV precision). f32 stays available: the
//! transformers reference tests hold to 1e-4 only with it.

use alloc::vec;
use alloc::vec::Vec;

use crate::config::{LayerKind, ModelConfig};
use crate::simd::types::KvElem;

/// Element type of the attention KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvPrecision {
    /// f32: exact (what the reference tests check).
    F32,
    /// IEEE f16, rounded to nearest even (the default): half the bytes;
    /// logits move by about 1e-3 on the reference fixtures (over their 1e-4
    /// tolerance).
    #[default]
    F16,
}

impl KvPrecision {
    /// `f32` or `f16`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "f32" => Some(KvPrecision::F32),
            "f16" => Some(KvPrecision::F16),
            _ => None,
        }
    }

    /// The name [`KvPrecision::from_name`] reads.
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
        }
    }

    /// Bytes per cached element.
    pub fn bytes(self) -> usize {
        match self {
            KvPrecision::F32 => 4,
            KvPrecision::F16 => 2,
        }
    }
}

/// One attention layer's keys or values, `[positions, kv_heads, head_dim]`.
#[derive(Clone, Debug)]
pub enum Kv {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements (IEEE bits).
    F16(Vec<u16>),
}

impl Default for Kv {
    fn default() -> Self {
        Kv::new(KvPrecision::default())
    }
}

impl Kv {
    /// An empty cache of this precision.
    pub fn new(p: KvPrecision) -> Self {
        match p {
            KvPrecision::F32 => Kv::F32(Vec::new()),
            KvPrecision::F16 => Kv::F16(Vec::new()),
        }
    }

    /// Element type.
    pub fn precision(&self) -> KvPrecision {
        match self {
            Kv::F32(_) => KvPrecision::F32,
            Kv::F16(_) => KvPrecision::F16,
        }
    }

    /// Elements cached.
    pub fn len(&self) -> usize {
        match self {
            Kv::F32(v) => v.len(),
            Kv::F16(v) => v.len(),
        }
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the first `n` elements.
    pub fn truncate(&mut self, n: usize) {
        match self {
            Kv::F32(v) => v.truncate(n),
            Kv::F16(v) => v.truncate(n),
        }
    }

    /// Forgets everything (keeps the allocation).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Appends `x`, rounded to the cache's precision.
    pub fn extend_f32(&mut self, x: &[f32]) {
        fn ext<E: KvElem>(v: &mut Vec<E>, x: &[f32]) {
            v.extend(x.iter().map(|&a| E::from_f32(a)));
        }
        match self {
            Kv::F32(v) => v.extend_from_slice(x),
            Kv::F16(v) => ext(v, x),
        }
    }
}

/// Cache of one decoder layer.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// Gated DeltaNet layer.
    Linear {
        /// The last `kernel - 1` conv inputs, `[kernel - 1, conv_dim]`, oldest first.
        conv: Vec<f32>,
        /// Recurrent state `S`, `[value_heads, key_dim, value_dim]`.
        recurrent: Vec<f32>,
    },
    /// Full attention layer.
    Full {
        /// Keys after norm and RoPE, `[positions, kv_heads, head_dim]`.
        k: Kv,
        /// Values, `[positions, kv_heads, head_dim]`.
        v: Kv,
    },
}

/// Everything one sequence carries between forward calls.
#[derive(Clone, Debug)]
pub struct State {
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerState>,
    pub(crate) last_hidden: Vec<f32>,
}

impl State {
    /// An empty state for a model with this config, its KV cache in the
    /// default precision (`Model::new_state` uses the model's).
    pub fn new(cfg: &ModelConfig) -> Self {
        Self::with_kv(cfg, KvPrecision::default())
    }

    /// An empty state whose attention caches hold `kv` elements.
    pub fn with_kv(cfg: &ModelConfig, kv: KvPrecision) -> Self {
        let layers = cfg
            .layer_types
            .iter()
            .map(|kind| match kind {
                LayerKind::Linear => LayerState::Linear {
                    conv: vec![0.0; (cfg.linear_conv_kernel_dim - 1) * cfg.linear_conv_dim()],
                    recurrent: vec![
                        0.0;
                        cfg.linear_num_value_heads
                            * cfg.linear_key_head_dim
                            * cfg.linear_value_head_dim
                    ],
                },
                LayerKind::Full => LayerState::Full { k: Kv::new(kv), v: Kv::new(kv) },
            })
            .collect();
        State { pos: 0, layers, last_hidden: vec![0.0; cfg.hidden_size] }
    }

    /// The precision of this state's attention caches (the default for a
    /// model without attention layers).
    pub fn kv_precision(&self) -> KvPrecision {
        self.layers
            .iter()
            .find_map(|l| match l {
                LayerState::Full { k, .. } => Some(k.precision()),
                LayerState::Linear { .. } => None,
            })
            .unwrap_or_default()
    }

    /// Tokens processed so far (the next token's position).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The trunk's final normed hidden state at the last processed position.
    pub fn last_hidden(&self) -> &[f32] {
        &self.last_hidden
    }

    /// Per-layer caches.
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Bytes the state holds: KV caches, DeltaNet conv and recurrent states,
    /// the last hidden state.
    pub fn bytes(&self) -> usize {
        let f32s: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Linear { conv, recurrent } => conv.len() + recurrent.len(),
                LayerState::Full { .. } => 0,
            })
            .sum();
        (f32s + self.last_hidden.len()) * 4 + self.kv_bytes()
    }

    /// Bytes of attention keys and values cached.
    pub fn kv_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Full { k, v } => (k.len() + v.len()) * k.precision().bytes(),
                LayerState::Linear { .. } => 0,
            })
            .sum()
    }

    /// Appends `depth` positions of synthetic keys and values (deterministic
    /// pseudo-random values in [-1, 1) from `seed`) to every attention layer
    /// and advances the position, leaving the DeltaNet states as they are:
    /// for measuring decode at a context depth without prefilling it.
    pub fn push_synthetic_context(&mut self, cfg: &ModelConfig, depth: usize, seed: u64) {
        let row = cfg.num_key_value_heads * cfg.head_dim;
        let mut x = seed | 1;
        let mut buf = vec![0.0f32; row];
        for l in &mut self.layers {
            if let LayerState::Full { k, v } = l {
                for _ in 0..depth {
                    for kv in [&mut *k, &mut *v] {
                        for b in buf.iter_mut() {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            *b = (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                        }
                        kv.extend_f32(&buf);
                    }
                }
            }
        }
        self.pos += depth;
    }

    /// Forgets the sequence (keeps allocations).
    pub fn reset(&mut self) {
        self.pos = 0;
        for l in &mut self.layers {
            match l {
                LayerState::Linear { conv, recurrent } => {
                    conv.fill(0.0);
                    recurrent.fill(0.0);
                }
                LayerState::Full { k, v } => {
                    k.clear();
                    v.clear();
                }
            }
        }
        self.last_hidden.fill(0.0);
    }
}

/// DeltaNet states after every token of one checkpointed forward call
/// (`Model::forward_hidden_checkpointed`). Reused between calls to keep its
/// allocations.
#[derive(Clone, Debug, Default)]
pub struct Checkpoints {
    /// Per layer: `[tokens, conv_window ++ recurrent]` (empty for attention layers).
    layers: Vec<Vec<f32>>,
    pos0: usize,
    tokens: usize,
}

impl Checkpoints {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts recording a call of `tokens` tokens at position `pos0`.
    pub(crate) fn begin(&mut self, layers: usize, pos0: usize, tokens: usize) {
        self.layers.resize_with(layers, Vec::new);
        self.layers.iter_mut().for_each(Vec::clear);
        self.pos0 = pos0;
        self.tokens = tokens;
    }

    /// The sink of layer `i`.
    pub(crate) fn layer_mut(&mut self, i: usize) -> &mut Vec<f32> {
        &mut self.layers[i]
    }

    /// Tokens of the recorded call.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Position of the recorded call's first token.
    pub fn start(&self) -> usize {
        self.pos0
    }
}

/// [`State::rewind`] was asked for a prefix the checkpoints do not cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RewindError {
    /// Tokens asked to keep.
    pub keep: usize,
    /// Tokens recorded.
    pub recorded: usize,
}

impl core::fmt::Display for RewindError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "cannot rewind to {} tokens of a checkpointed call of {} (state moved since?)",
            self.keep, self.recorded
        )
    }
}

#[cfg(feature = "std")]
impl std::error::Error for RewindError {}

impl State {
    /// Rewinds a state that ran the checkpointed call `ckpt` (and nothing
    /// after it) to just after its first `keep` tokens (1..=tokens):
    /// attention caches are truncated, DeltaNet conv and recurrent states
    /// restored from the checkpoint, and `last_hidden` set to `hidden` (the
    /// trunk's final normed state at that token).
    pub fn rewind(
        &mut self,
        ckpt: &Checkpoints,
        keep: usize,
        hidden: &[f32],
    ) -> Result<(), RewindError> {
        let bad = RewindError { keep, recorded: ckpt.tokens };
        if keep == 0 || keep > ckpt.tokens || self.pos != ckpt.pos0 + ckpt.tokens {
            return Err(bad);
        }
        let (old, new) = (self.pos, ckpt.pos0 + keep);
        for (l, rec) in self.layers.iter_mut().zip(&ckpt.layers) {
            match l {
                LayerState::Linear { conv, recurrent } => {
                    let size = conv.len() + recurrent.len();
                    if rec.len() != size * ckpt.tokens {
                        return Err(bad);
                    }
                    let snap = &rec[(keep - 1) * size..keep * size];
                    let (c, r) = snap.split_at(conv.len());
                    conv.copy_from_slice(c);
                    recurrent.copy_from_slice(r);
                }
                LayerState::Full { k, v } => {
                    let row = k.len().checked_div(old).unwrap_or(0);
                    k.truncate(new * row);
                    v.truncate(new * row);
                }
            }
        }
        self.pos = new;
        self.last_hidden.copy_from_slice(hidden);
        Ok(())
    }
}
