//! Per-sequence state: each layer's cache (DeltaNet conv window and f32
//! recurrent state, or the attention KV cache), the position, and the trunk's
//! last final-normed hidden state (input of the MTP head). Cloning a state is
//! a checkpoint; `reset` starts a new sequence. [`Checkpoints`] record the
//! DeltaNet states after every token of one forward call so that speculative
//! decoding can [`State::rewind`] to the accepted prefix without recomputing.

use alloc::vec;
use alloc::vec::Vec;

use crate::config::{LayerKind, ModelConfig};

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
        k: Vec<f32>,
        /// Values, `[positions, kv_heads, head_dim]`.
        v: Vec<f32>,
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
    /// An empty state for a model with this config.
    pub fn new(cfg: &ModelConfig) -> Self {
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
                LayerKind::Full => LayerState::Full { k: Vec::new(), v: Vec::new() },
            })
            .collect();
        State { pos: 0, layers, last_hidden: vec![0.0; cfg.hidden_size] }
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
