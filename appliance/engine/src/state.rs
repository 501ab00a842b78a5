//! Per-sequence state: each layer's cache (DeltaNet conv window and f32
//! recurrent state, or the attention KV cache), the position, and the trunk's
//! last final-normed hidden state (input of the MTP head). Cloning a state is
//! a checkpoint; `reset` starts a new sequence.

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
