//! The multi-token-prediction (MTP) head of Qwen3.5, as vLLM's
//! `Qwen3_5MultiTokenPredictor` defines it (`qwen3_5_mtp.py`).
//!
//! At position `i` the head sees the *next* token `x_{i+1}` and the trunk's
//! final normed hidden state `h_i`, and predicts `x_{i+2}`:
//!
//! ```text
//! e = rmsnorm_1p(embed(x_{i+1}), pre_fc_norm_embedding)     [T, H]
//! n = rmsnorm_1p(h_i, pre_fc_norm_hidden)                   [T, H]
//! u = fc(concat(e, n))                                      [T, 2H] -> [T, H]  (embedding first)
//! u = decoder_layer(u)   one full-attention layer, own KV cache, RoPE position i
//! g = rmsnorm_1p(u, mtp.norm)                               [T, H]
//! logits = lm_head(g)                                       shared with the trunk
//! ```
//!
//! Chained drafts feed `g` back as the hidden input of the next position.
//! The MTP's KV cache has one row per position, like the trunk's.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use super::{ForwardError, Model};
use crate::ops::rms_norm_1p_rows;
use crate::state::{Kv, LayerState};

/// MTP drafting failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MtpError {
    /// A trunk or MTP forward rejected its input.
    Forward(ForwardError),
    /// The checkpoint has no `mtp.*` weights.
    NoMtpHead,
    /// The MTP head was given a hidden-state buffer of the wrong size.
    HiddenShape {
        /// Values expected (`tokens * hidden`).
        expected: usize,
        /// Values given.
        got: usize,
    },
}

impl From<ForwardError> for MtpError {
    fn from(e: ForwardError) -> Self {
        MtpError::Forward(e)
    }
}

impl fmt::Display for MtpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MtpError::Forward(e) => e.fmt(f),
            MtpError::NoMtpHead => {
                write!(f, "the model has no MTP head (no mtp.* weights); generate with --mtp 0")
            }
            MtpError::HiddenShape { expected, got } => {
                write!(f, "MTP hidden input has {got} values, expected {expected}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for MtpError {}

/// The MTP head's own cache: the KV rows of its attention layer for
/// positions `0..position()`.
#[derive(Clone, Debug)]
pub struct MtpState {
    pos: usize,
    layer: LayerState,
}

impl Default for MtpState {
    fn default() -> Self {
        Self::new()
    }
}

impl MtpState {
    /// An empty cache in the default KV precision.
    pub fn new() -> Self {
        Self::with_kv(crate::state::KvPrecision::default())
    }

    /// An empty cache whose keys and values are `kv` elements (a model's:
    /// `Model::options().kv`).
    pub fn with_kv(kv: crate::state::KvPrecision) -> Self {
        MtpState { pos: 0, layer: LayerState::Full { k: Kv::new(kv), v: Kv::new(kv) } }
    }

    /// Positions cached (the next MTP call runs at this position).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Forgets positions `pos..` (no-op when `pos >= position()`).
    pub fn truncate(&mut self, pos: usize) {
        if pos >= self.pos {
            return;
        }
        if let LayerState::Full { k, v } = &mut self.layer {
            let row = k.len() / self.pos;
            k.truncate(pos * row);
            v.truncate(pos * row);
        }
        self.pos = pos;
    }

    /// Forgets everything (keeps allocations).
    pub fn reset(&mut self) {
        self.truncate(0);
    }
}

impl Model<'_> {
    /// Whether the checkpoint has an MTP head.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Runs the MTP head at positions `mtp.position()..+T`: row `i` of
    /// `tokens` is the token *after* the position's own token and row `i` of
    /// `hidden` (`[T, hidden]`) its trunk (or chained MTP) final normed state.
    /// Returns the MTP's normed output `[T, hidden]`; `Model::logits` of a
    /// row drafts the token after `tokens[i]`. On error nothing changed.
    pub fn mtp_forward(
        &self,
        mtp: &mut MtpState,
        tokens: &[u32],
        hidden: &[f32],
    ) -> Result<Vec<f32>, MtpError> {
        let head = self.mtp.as_ref().ok_or(MtpError::NoMtpHead)?;
        let cfg = &self.config;
        let (t, h) = (tokens.len(), cfg.hidden_size);
        if t == 0 {
            return Err(ForwardError::Empty.into());
        }
        if hidden.len() != t * h {
            return Err(MtpError::HiddenShape { expected: t * h, got: hidden.len() });
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= cfg.vocab_size) {
            return Err(
                ForwardError::TokenOutOfRange { token: bad, vocab_size: cfg.vocab_size }.into()
            );
        }
        let needed = mtp.pos + t;
        if needed > cfg.max_position_embeddings {
            return Err(
                ForwardError::ContextFull { needed, max: cfg.max_position_embeddings }.into()
            );
        }
        let eps = cfg.rms_norm_eps;
        let mut e = self.embed(tokens); // [T, H]
        rms_norm_1p_rows(&mut e, &head.pre_fc_norm_embedding, eps);
        let mut n = hidden.to_vec(); // [T, H]
        rms_norm_1p_rows(&mut n, &head.pre_fc_norm_hidden, eps);
        let mut cat = vec![0.0; t * 2 * h]; // [T, 2H]: embedding | hidden
        for ((row, e), n) in
            cat.chunks_exact_mut(2 * h).zip(e.chunks_exact(h)).zip(n.chunks_exact(h))
        {
            row[..h].copy_from_slice(e);
            row[h..].copy_from_slice(n);
        }
        let mut u = vec![0.0; t * h]; // [T, H]
        self.exec().matmul(&head.fc, &cat, t, &mut u);
        self.layer_forward(&head.layer, &mut mtp.layer, &mut u, t, mtp.pos, None);
        rms_norm_1p_rows(&mut u, &head.norm, eps);
        mtp.pos += t;
        Ok(u)
    }
}
