//! Several sequences in one forward ([`Model::forward_batch`]): their token
//! rows are stacked so every projection, MLP and the lm_head read each weight
//! once for all of them (an MoE layer groups all of them by expert, so each
//! routed expert is read once for the step), while the token mixers (DeltaNet conv and recurrent
//! state, attention KV cache) run on each sequence's own rows and state.
//!
//! Every row goes through the same kernels with the same per-row arithmetic
//! as when its sequence runs alone (the products keep one accumulator per
//! token, the mixers see only their sequence), so a sequence's logits are
//! bit-for-bit those of [`Model::forward`] on the same tokens.

use alloc::vec;
use alloc::vec::Vec;
use core::ops::Range;

use super::deltanet::SeqState;
use super::{add, ForwardError, Layer, Mixer, Model};
use crate::ops::rms_norm_1p_rows;
use crate::state::{LayerState, State};

/// One sequence's part of a batched forward.
#[derive(Debug)]
pub struct SeqInput<'s> {
    /// The sequence's state, extended by `tokens`.
    pub state: &'s mut State,
    /// Tokens to run (a prefill chunk, or one decode token).
    pub tokens: &'s [u32],
    /// Whether to return the logits of the last token (`[vocab]`).
    pub logits: bool,
}

/// A batched forward refused one sequence's input; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchError {
    /// Index of the offending sequence in the batch.
    pub index: usize,
    /// What was wrong with it.
    pub error: ForwardError,
}

impl<'a> Model<'a> {
    /// Runs every sequence's tokens through the model in one pass over the
    /// weights and returns, per sequence, the logits of its last token
    /// (empty when it did not ask for them). On error no state changed.
    pub fn forward_batch(&self, seqs: &mut [SeqInput<'_>]) -> Result<Vec<Vec<f32>>, BatchError> {
        for (index, s) in seqs.iter().enumerate() {
            self.check_input(s.state, s.tokens).map_err(|error| BatchError { index, error })?;
        }
        let h = self.config.hidden_size;
        let mut rows = Vec::with_capacity(seqs.len());
        let mut tokens = Vec::new();
        for s in seqs.iter() {
            rows.push(tokens.len()..tokens.len() + s.tokens.len());
            tokens.extend_from_slice(s.tokens);
        }
        if tokens.is_empty() {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let mut x = self.embed(&tokens);
        for (i, layer) in self.layers.iter().enumerate() {
            self.layer_forward_batch(layer, i, seqs, &rows, &mut x);
        }
        rms_norm_1p_rows(&mut x, &self.norm, self.config.rms_norm_eps);
        let mut last = Vec::new();
        for (s, r) in seqs.iter_mut().zip(&rows) {
            s.state.pos += r.len();
            s.state.last_hidden.copy_from_slice(&x[(r.end - 1) * h..r.end * h]);
            if s.logits {
                last.extend_from_slice(&x[(r.end - 1) * h..r.end * h]);
            }
        }
        let logits = self.logits(&last);
        let v = self.config.vocab_size;
        let mut at = 0;
        Ok(seqs
            .iter()
            .map(|s| {
                if !s.logits {
                    return Vec::new();
                }
                at += v;
                logits[at - v..at].to_vec()
            })
            .collect())
    }

    /// Layer `i` over the stacked rows `x` of `seqs` (sequence `j` owns rows
    /// `rows[j]`), in place.
    fn layer_forward_batch(
        &self,
        layer: &Layer<'_>,
        i: usize,
        seqs: &mut [SeqInput<'_>],
        rows: &[Range<usize>],
        x: &mut [f32],
    ) {
        let cfg = &self.config;
        let ex = self.exec();
        let t = x.len() / cfg.hidden_size;
        let mut hn = x.to_vec();
        rms_norm_1p_rows(&mut hn, &layer.input_norm, cfg.rms_norm_eps);
        let (core, out_proj) = match &layer.mixer {
            Mixer::Linear(d) => {
                let mut p = d.project(cfg, ex, &hn, t);
                let mut states: Vec<SeqState<'_>> = seqs
                    .iter_mut()
                    .zip(rows)
                    .map(|(s, r)| {
                        let LayerState::Linear { conv, recurrent } = &mut s.state.layers[i] else {
                            unreachable!("state layout checked in check_input");
                        };
                        SeqState { conv, recurrent, rows: r.clone() }
                    })
                    .collect();
                let _p = crate::profile::scope(crate::profile::Part::DeltaNet);
                (d.mix_batch(cfg, ex, self.chunked_min, &mut p, &mut states), &d.out_proj)
            }
            Mixer::Full(a) => {
                let mut p = a.project(cfg, ex, &hn, t);
                let _p = crate::profile::scope(crate::profile::Part::Attention);
                let mut core = Vec::with_capacity(t * cfg.num_attention_heads * cfg.head_dim);
                for (s, r) in seqs.iter_mut().zip(rows) {
                    let pos0 = s.state.pos;
                    let LayerState::Full { k, v } = &mut s.state.layers[i] else {
                        unreachable!("state layout checked in check_input");
                    };
                    core.extend(a.mix(cfg, ex, &self.inv_freq, p.rows_mut(r.clone()), pos0, k, v));
                }
                (core, &a.o_proj)
            }
        };
        let mut y = vec![0.0; t * cfg.hidden_size];
        ex.matmul(out_proj, &core, t, &mut y);
        add(x, &y);
        let mut hn = x.to_vec();
        rms_norm_1p_rows(&mut hn, &layer.post_attention_norm, cfg.rms_norm_eps);
        add(x, &layer.mlp.forward(ex, &hn, t, &self.expert_reads));
    }
}

impl core::fmt::Display for BatchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "sequence {} of the batch: {}", self.index, self.error)
    }
}

#[cfg(feature = "std")]
impl std::error::Error for BatchError {}
