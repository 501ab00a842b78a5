//! Checkpoints of a sequence's [`State`] in the two parts a prefix cache
//! keeps apart: the fixed-size part ([`Fixed`]: every DeltaNet layer's conv
//! window and recurrent state, the last hidden state, the position) and the
//! attention keys and values of a range of positions ([`KvSpan`]), so that
//! checkpoints along one token prefix share the KV rows of that prefix.
//! [`restore`] rebuilds a state from spans covering `0..pos` and a `Fixed`.
//!
//! [`Shape`] is the one sizing function of what a cache holds (bytes per
//! cached position, per checkpoint); [`file`] is the checkpoint file format
//! (header, payload, checksum) the disk tier and the guest-to-host transfer
//! use. [`cuts_exact`] says whether a prompt may be cut into forward calls
//! anywhere (prefill calls of any length and decode steps alike) without
//! changing a bit of the result, which decides whether a cache may take and
//! resume checkpoints at all.

use alloc::vec::Vec;
use core::ops::Range;

use crate::config::{LayerKind, ModelConfig};
use crate::state::{Kv, KvPrecision, LayerState, State};

pub mod file;
pub mod fuzz;

/// Whether `model`'s kernel configuration makes a prompt's result
/// independent of how it is cut into calls, one-token decode steps included
/// (attention merges 2048-key pieces the same way in every call):
/// false on the opt-in AMX path (products of 32+ tokens round activations to
/// bf16) and with the chunked DeltaNet form forced (its chunks start at each
/// call's first token). A prefix cache keeps and uses nothing then.
pub fn cuts_exact(model: &crate::Model<'_>) -> bool {
    model.kernels() != crate::simd::Path::Amx && model.deltanet_chunked_min() == usize::MAX
}

/// The sizes a model's checkpoints have: the one function that counts what
/// a prefix cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Decoder layers.
    pub layers: usize,
    /// Full-attention layers (each keeps keys and values per position).
    pub attention_layers: usize,
    /// Elements of one position's keys (or values) in one attention layer.
    pub kv_row: usize,
    /// Floats of the fixed part: conv windows, recurrent states, last hidden.
    pub fixed_floats: usize,
}

impl Shape {
    /// The shape of `cfg`'s states.
    pub fn of(cfg: &ModelConfig) -> Shape {
        let linear = (cfg.linear_conv_kernel_dim.saturating_sub(1)) * cfg.linear_conv_dim()
            + cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim;
        let (mut attention_layers, mut fixed_floats) = (0, cfg.hidden_size);
        for kind in &cfg.layer_types {
            match kind {
                LayerKind::Linear => fixed_floats += linear,
                LayerKind::Full => attention_layers += 1,
            }
        }
        Shape {
            layers: cfg.layer_types.len(),
            attention_layers,
            kv_row: cfg.num_key_value_heads * cfg.head_dim,
            fixed_floats,
        }
    }

    /// Bytes of one checkpoint's fixed part.
    pub fn fixed_bytes(&self) -> usize {
        self.fixed_floats * 4
    }

    /// Bytes of `positions` positions' keys and values (all attention
    /// layers) at precision `kv`.
    pub fn kv_bytes(&self, positions: usize, kv: KvPrecision) -> usize {
        positions * self.attention_layers * 2 * self.kv_row * kv.bytes()
    }

    /// Bytes a cache holds for `positions` cached positions (keys, values
    /// and the token id of each) and `checkpoints` fixed parts.
    pub fn cache_bytes(&self, positions: usize, checkpoints: usize, kv: KvPrecision) -> usize {
        self.kv_bytes(positions, kv) + positions * 4 + checkpoints * self.fixed_bytes()
    }
}

/// Why a checkpoint does not fit a state or a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// The parts do not have this model's shape or do not join up.
    Mismatch(&'static str),
    /// A checkpoint file is not usable (see [`file::decode`]).
    File(file::FileError),
}

impl core::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SnapshotError::Mismatch(what) => write!(f, "checkpoint does not fit: {what}"),
            SnapshotError::File(e) => write!(f, "checkpoint file: {e}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SnapshotError {}

/// The fixed-size part of a state at one position.
#[derive(Clone, Debug, PartialEq)]
pub struct Fixed {
    pos: usize,
    /// Per DeltaNet layer conv window then recurrent state, then the last hidden state.
    data: Vec<f32>,
}

impl Fixed {
    /// Copies `state`'s fixed part.
    pub fn capture(state: &State) -> Fixed {
        let mut data = Vec::new();
        for l in &state.layers {
            if let LayerState::Linear { conv, recurrent } = l {
                data.extend_from_slice(conv);
                data.extend_from_slice(recurrent);
            }
        }
        data.extend_from_slice(&state.last_hidden);
        Fixed { pos: state.pos, data }
    }

    /// A fixed part read back (see [`file`]); `data` as [`Fixed::floats`].
    pub fn from_parts(pos: usize, data: Vec<f32>) -> Fixed {
        Fixed { pos, data }
    }

    /// The position (tokens run) it was taken at.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Its floats, in layer order.
    pub fn floats(&self) -> &[f32] {
        &self.data
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// Keys and values of positions `start..start + rows` of every attention
/// layer, at one precision.
#[derive(Clone, Debug)]
pub struct KvSpan {
    start: usize,
    rows: usize,
    /// Per attention layer: keys, values (`rows` rows each).
    layers: Vec<(Kv, Kv)>,
}

impl KvSpan {
    /// Copies positions `range` of `state`'s attention caches.
    pub fn capture(state: &State, range: Range<usize>) -> KvSpan {
        let (start, rows) = (range.start, range.len());
        let mut layers = Vec::new();
        for l in &state.layers {
            if let LayerState::Full { k, v } = l {
                let row = k.len().checked_div(state.pos).unwrap_or(0);
                layers.push((slice(k, start * row, rows * row), slice(v, start * row, rows * row)));
            }
        }
        KvSpan { start, rows, layers }
    }

    /// A span read back (see [`file`]).
    pub fn from_parts(start: usize, rows: usize, layers: Vec<(Kv, Kv)>) -> KvSpan {
        KvSpan { start, rows, layers }
    }

    /// First position.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Positions held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Per attention layer: keys, values.
    pub fn layers(&self) -> &[(Kv, Kv)] {
        &self.layers
    }

    /// Element precision (f32 when there are no attention layers).
    pub fn precision(&self) -> KvPrecision {
        self.layers.first().map_or(KvPrecision::F32, |(k, _)| k.precision())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| (k.len() + v.len()) * k.precision().bytes()).sum()
    }

    /// Splits off positions `start + at..` into a new span (this one keeps
    /// the first `at`).
    pub fn split_off(&mut self, at: usize) -> KvSpan {
        let at = at.min(self.rows);
        let row_of = |kv: &Kv| kv.len().checked_div(self.rows).unwrap_or(0);
        let layers = self
            .layers
            .iter_mut()
            .map(|(k, v)| {
                let row = row_of(k);
                (split_kv(k, at * row), split_kv(v, at * row))
            })
            .collect();
        let tail = KvSpan { start: self.start + at, rows: self.rows - at, layers };
        self.rows = at;
        tail
    }
}

fn slice(kv: &Kv, from: usize, n: usize) -> Kv {
    match kv {
        Kv::F32(x) => Kv::F32(x[from..from + n].to_vec()),
        Kv::F16(x) => Kv::F16(x[from..from + n].to_vec()),
    }
}

fn split_kv(kv: &mut Kv, at: usize) -> Kv {
    match kv {
        Kv::F32(x) => Kv::F32(x.split_off(at)),
        Kv::F16(x) => Kv::F16(x.split_off(at)),
    }
}

fn append(dst: &mut Kv, src: &Kv) -> Result<(), SnapshotError> {
    match (dst, src) {
        (Kv::F32(d), Kv::F32(s)) => d.extend_from_slice(s),
        (Kv::F16(d), Kv::F16(s)) => d.extend_from_slice(s),
        _ => return Err(SnapshotError::Mismatch("KV precision differs from the state's")),
    }
    Ok(())
}

/// Rebuilds `state` (any content; its KV precision is kept) as the state
/// the checkpoint `spans` + `fixed` describes: `spans` must cover positions
/// `0..fixed.position()` in order. On error the state is reset.
pub fn restore(state: &mut State, spans: &[&KvSpan], fixed: &Fixed) -> Result<(), SnapshotError> {
    state.reset();
    let r = fill(state, spans, fixed);
    if r.is_err() {
        state.reset();
    }
    r
}

fn fill(state: &mut State, spans: &[&KvSpan], fixed: &Fixed) -> Result<(), SnapshotError> {
    let mut at = 0;
    for s in spans {
        if s.start != at {
            return Err(SnapshotError::Mismatch("KV spans do not join up"));
        }
        at += s.rows;
        let mut layers = s.layers.iter();
        for l in &mut state.layers {
            if let LayerState::Full { k, v } = l {
                let (sk, sv) =
                    layers.next().ok_or(SnapshotError::Mismatch("too few attention layers"))?;
                append(k, sk)?;
                append(v, sv)?;
            }
        }
        if layers.next().is_some() {
            return Err(SnapshotError::Mismatch("too many attention layers"));
        }
    }
    if at != fixed.pos {
        return Err(SnapshotError::Mismatch("KV spans end before the checkpoint's position"));
    }
    let mut data = fixed.data.as_slice();
    for l in &mut state.layers {
        if let LayerState::Linear { conv, recurrent } = l {
            for dst in [conv, recurrent] {
                if data.len() < dst.len() {
                    return Err(SnapshotError::Mismatch("fixed part too short"));
                }
                let (head, rest) = data.split_at(dst.len());
                dst.copy_from_slice(head);
                data = rest;
            }
        }
    }
    if data.len() != state.last_hidden.len() {
        return Err(SnapshotError::Mismatch("fixed part has the wrong size"));
    }
    state.last_hidden.copy_from_slice(data);
    state.pos = fixed.pos;
    Ok(())
}
