//! The Qwen3.5 text model (dense, or MoE: the `moe` module): weights borrowed from a
//! `TensorSource` and one readable forward pass over a batch of tokens of one
//! sequence.
//!
//! ```text
//! x = embed(tokens)                                  [T, H]
//! for each layer:
//!     x += mixer(rmsnorm_1p(x))   (DeltaNet or gated attention, per layer_types)
//!     x += ffn(rmsnorm_1p(x))     (SwiGLU MLP, or the MoE block)
//! h = rmsnorm_1p(x)                                  [T, H]  (kept for MTP)
//! logits = lm_head(h)                                [T, V]  (last or all rows)
//! ```

mod attention;
mod batch;
mod deltanet;
mod head;
mod moe;
mod mtp;

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

pub use attention::Attention;
pub use batch::{BatchError, SeqInput};
pub use deltanet::DeltaNet;
pub use head::RESCORE_ROWS;
pub use moe::{ExpertReads, Ffn, Moe};
pub use mtp::{MtpError, MtpState};

use crate::config::{ConfigError, LayerKind, ModelConfig};
use crate::kernels::{Exec, Product};
use crate::ops::{rms_norm_1p_rows, rope_inv_freq, silu_mul};
use crate::options::EngineOptions;
use crate::pool::{Parallel, PoolRef};
use crate::simd::{Path, Unsupported};
use crate::state::{Checkpoints, KvPrecision, LayerState, State};
use crate::tensor::TensorSource;
use crate::weights::{Linear, WeightError, WeightLoader};

/// Loading a model failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The config is unusable.
    Config(ConfigError),
    /// A weight is missing or has the wrong shape or dtype.
    Weights(WeightError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Config(e) => write!(f, "config: {e}"),
            LoadError::Weights(e) => e.fmt(f),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for LoadError {}

impl From<WeightError> for LoadError {
    fn from(e: WeightError) -> Self {
        LoadError::Weights(e)
    }
}

/// A forward call was given input it cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardError {
    /// No tokens.
    Empty,
    /// A token id is not below the vocabulary size.
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// The sequence would exceed `max_position_embeddings`.
    ContextFull {
        /// Positions the call needs.
        needed: usize,
        /// The limit.
        max: usize,
    },
    /// The state was made for a different model.
    StateMismatch,
}

impl fmt::Display for ForwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardError::Empty => write!(f, "no input tokens"),
            ForwardError::TokenOutOfRange { token, vocab_size } => {
                write!(f, "token id {token} is outside the vocabulary (size {vocab_size}; valid ids are 0..{vocab_size})")
            }
            ForwardError::ContextFull { needed, max } => {
                write!(f, "sequence of {needed} tokens exceeds the model's context of {max}")
            }
            ForwardError::StateMismatch => {
                write!(f, "sequence state does not belong to this model")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ForwardError {}

/// SwiGLU MLP weights.
#[derive(Debug)]
pub struct Mlp<'a> {
    /// `[intermediate, hidden]`.
    pub gate_proj: Linear<'a>,
    /// `[intermediate, hidden]`.
    pub up_proj: Linear<'a>,
    /// `[hidden, intermediate]`.
    pub down_proj: Linear<'a>,
}

/// Token mixer of a layer.
#[derive(Debug)]
pub enum Mixer<'a> {
    /// Gated DeltaNet.
    Linear(DeltaNet<'a>),
    /// Gated full attention.
    Full(Attention<'a>),
}

/// One decoder layer.
#[derive(Debug)]
pub struct Layer<'a> {
    /// (1+w) RMSNorm before the mixer.
    pub input_norm: Vec<f32>,
    /// (1+w) RMSNorm before the MLP.
    pub post_attention_norm: Vec<f32>,
    /// The token mixer.
    pub mixer: Mixer<'a>,
    /// The feed-forward block: a SwiGLU MLP, or an MoE block.
    pub mlp: Ffn<'a>,
}

/// The multi-token-prediction head's weights (`mtp.*`); carried for the MTP
/// drafter, not used by the trunk's forward.
#[derive(Debug)]
pub struct MtpWeights<'a> {
    /// `mtp.fc`: `[hidden, 2*hidden]` over `concat(norm_e(embed), norm_h(hidden))`.
    pub fc: Linear<'a>,
    /// `mtp.pre_fc_norm_embedding` (1+w).
    pub pre_fc_norm_embedding: Vec<f32>,
    /// `mtp.pre_fc_norm_hidden` (1+w).
    pub pre_fc_norm_hidden: Vec<f32>,
    /// `mtp.layers.0`: one full-attention decoder layer.
    pub layer: Layer<'a>,
    /// `mtp.norm` (1+w).
    pub norm: Vec<f32>,
}

/// A loaded Qwen3.5 text model (dense or MoE) borrowing its weights for `'a`.
#[derive(Debug)]
pub struct Model<'a> {
    /// The configuration the weights were checked against.
    pub config: ModelConfig,
    /// `[vocab, hidden]`.
    pub embed_tokens: Linear<'a>,
    /// Decoder layers.
    pub layers: Vec<Layer<'a>>,
    /// Final (1+w) RMSNorm.
    pub norm: Vec<f32>,
    /// `[vocab, hidden]` (the embedding when tied).
    pub lm_head: Linear<'a>,
    /// Exact head weights that rescore a quantized `lm_head`'s best
    /// candidates (the BF16 embedding of a tied model with a quantized head
    /// copy, or an untied pack's `lm_head_exact`); `None`: logits are the
    /// head's own. See [`RESCORE_ROWS`].
    pub head_exact: Option<Linear<'a>>,
    /// MTP head weights when the checkpoint has them.
    pub mtp: Option<MtpWeights<'a>>,
    inv_freq: Vec<f32>,
    /// Workers the matrix products split rows across (default: serial).
    pool: PoolRef<'a>,
    /// Routed experts read so far (MoE models).
    expert_reads: ExpertReads,
    /// The kernel path every forward of this model runs (default: the
    /// fastest this CPU supports).
    kernels: Path,
    /// The KV cache precision of this model's new states.
    kv: KvPrecision,
    /// DeltaNet's chunked form from this many tokens (`usize::MAX`: never).
    chunked_min: usize,
}

/// Which positions' logits a forward returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position: `[vocab]`.
    Last,
    /// Every position: `[T, vocab]`.
    All,
}

impl<'a> Model<'a> {
    /// Loads and checks every weight the config implies from `src`.
    pub fn load<S: TensorSource + ?Sized>(
        config: ModelConfig,
        src: &'a S,
    ) -> Result<Self, LoadError> {
        config.validate().map_err(LoadError::Config)?;
        let w = WeightLoader::new(src);
        let (v, h) = (config.vocab_size, config.hidden_size);
        let embed_tokens = w.dense("model.embed_tokens.weight", v, h)?;
        let mut layers = Vec::with_capacity(config.num_layers());
        for (i, kind) in config.layer_types.iter().enumerate() {
            layers.push(load_layer(&w, &config, &format!("model.layers.{i}"), *kind)?);
        }
        let norm = w.vector("model.norm.weight", h)?;
        // A tied pack may carry a separate (quantized) head copy; the
        // embedding then rescores its candidates, as an untied pack's
        // `lm_head_exact` copy does.
        let tied = config.tie_word_embeddings;
        let lm_head = if tied && !w.has("lm_head.weight") {
            embed_tokens
        } else {
            w.linear("lm_head", v, h)?
        };
        let head_exact = if tied && w.has("lm_head.weight") {
            Some(embed_tokens)
        } else if !tied && w.has("lm_head_exact.weight") {
            Some(w.linear("lm_head_exact", v, h)?)
        } else {
            None
        };
        let mtp = if w.has("mtp.fc.weight") { Some(load_mtp(&w, &config)?) } else { None };
        let inv_freq = rope_inv_freq(config.rope_theta, config.rotary_dim);
        let expert_reads = ExpertReads::default();
        Ok(Model {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            head_exact,
            mtp,
            inv_freq,
            pool: PoolRef::default(),
            expert_reads,
            kernels: crate::simd::best(),
            kv: KvPrecision::default(),
            chunked_min: usize::MAX,
        })
    }

    /// Takes the engine's options for this model's later forwards and new
    /// states: kernel path, KV precision, DeltaNet's chunked form. Fails,
    /// changing nothing, when this CPU cannot run the kernel path.
    pub fn set_options(&mut self, o: &EngineOptions) -> Result<(), Unsupported> {
        o.check()?;
        self.kernels = o.path();
        self.kv = o.kv;
        self.chunked_min = o.deltanet_chunked_min.map_or(usize::MAX, |n| n.max(1));
        Ok(())
    }

    /// The options this model runs with (the kernel path resolved).
    pub fn options(&self) -> EngineOptions {
        EngineOptions {
            kernels: Some(self.kernels),
            kv: self.kv,
            deltanet_chunked_min: (self.chunked_min != usize::MAX).then_some(self.chunked_min),
        }
    }

    /// Runs later forwards on the kernel path `path`. Fails, changing
    /// nothing, when this CPU cannot run it.
    pub fn set_kernels(&mut self, path: Path) -> Result<(), Unsupported> {
        if !path.supported() {
            return Err(Unsupported(path));
        }
        self.kernels = path;
        Ok(())
    }

    /// The kernel path this model's forwards run.
    pub fn kernels(&self) -> Path {
        self.kernels
    }

    /// Where and how this model's products run: its pool and kernel path.
    pub fn exec(&self) -> Exec<'a> {
        Exec { pool: self.pool.0, path: self.kernels }
    }

    /// Forwards (without checkpoints) of at least this many tokens take
    /// DeltaNet's chunked form (`usize::MAX`: never, the default; measured
    /// slower here, see `model::deltanet`).
    pub fn deltanet_chunked_min(&self) -> usize {
        self.chunked_min
    }

    /// Runs the heavy ops of later forwards on `pool` (threads, or vCPUs in the guest).
    pub fn set_pool(&mut self, pool: &'a dyn Parallel) {
        self.pool = PoolRef(pool);
    }

    /// The pool forwards run on.
    pub fn pool(&self) -> &'a dyn Parallel {
        self.pool.0
    }

    /// A fresh sequence state for this model (its KV precision).
    pub fn new_state(&self) -> State {
        State::with_kv(&self.config, self.kv)
    }

    /// Bytes of weights one decode step of one sequence reads (all layers,
    /// lm_head and the exact head's rescored rows); in an MoE model the
    /// active parameters: the router, the shared expert and `top_k` routed
    /// experts of each layer.
    pub fn weight_bytes_per_token(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.mlp.active_bytes()
                    + match &l.mixer {
                        Mixer::Linear(d) => {
                            [&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a, &d.out_proj]
                                .iter()
                                .map(|x| x.weight_bytes())
                                .sum::<usize>()
                        }
                        Mixer::Full(a) => [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                            .iter()
                            .map(|x| x.weight_bytes())
                            .sum(),
                    }
            })
            .sum();
        layers + self.lm_head.weight_bytes() + self.rescore_bytes_per_row()
    }

    /// Of [`Model::weight_bytes_per_token`], the routed experts' share: one
    /// token's `top_k` experts in every MoE layer (0 for a dense model).
    pub fn routed_bytes_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.mlp {
                Ffn::Moe(m) => m.routed_bytes_per_token(),
                Ffn::Dense(_) => 0,
            })
            .sum()
    }

    /// Bytes of the exact head one row of logits rescores (0 without one).
    pub fn rescore_bytes_per_row(&self) -> usize {
        self.head_exact
            .map_or(0, |e| e.weight_bytes() / e.rows().max(1) * RESCORE_ROWS.min(e.rows()))
    }

    /// Bytes of weights one MTP draft reads besides the lm_head (`mtp.fc`
    /// and its decoder layer); 0 without an MTP head.
    pub fn mtp_weight_bytes(&self) -> usize {
        let Some(m) = &self.mtp else { return 0 };
        let l = &m.layer;
        let mlp = l.mlp.active_bytes();
        let mix = match &l.mixer {
            Mixer::Full(a) => {
                [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj].iter().map(|x| x.weight_bytes()).sum()
            }
            Mixer::Linear(_) => 0,
        };
        m.fc.weight_bytes() + mlp + mix
    }

    /// Runs `tokens` through the model, extending `state`, and returns logits
    /// for the last position (`[vocab]`) or all positions (`[T, vocab]`).
    /// On error nothing in `state` has changed.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        which: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let hidden = self.forward_hidden(state, tokens)?;
        let h = self.config.hidden_size;
        Ok(match which {
            Logits::Last => self.logits(&hidden[hidden.len() - h..]),
            Logits::All => self.logits(&hidden),
        })
    }

    /// lm_head over rows of final-normed hidden states (`[n, hidden]` -> `[n, vocab]`).
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let n = hidden.len() / self.config.hidden_size;
        let _p = crate::profile::scope(crate::profile::Part::Head);
        let mut out = vec![0.0; n * self.config.vocab_size];
        self.exec().matmul(&self.lm_head, hidden, n, &mut out);
        if let Some(exact) = &self.head_exact {
            head::rescore(exact, hidden, &mut out);
        }
        out
    }

    /// Runs `tokens` through the trunk and returns the final-normed hidden
    /// states `[T, hidden]` (the last row is also kept in the state for MTP).
    pub fn forward_hidden(
        &self,
        state: &mut State,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ForwardError> {
        self.trunk(state, tokens, None)
    }

    /// [`Model::forward_hidden`] that also records, after every token, each
    /// DeltaNet layer's conv window and recurrent state into `ckpt`, so the
    /// state can be rewound to any prefix of `tokens` ([`State::rewind`]); used
    /// to verify speculative drafts in one batch.
    pub fn forward_hidden_checkpointed(
        &self,
        state: &mut State,
        tokens: &[u32],
        ckpt: &mut Checkpoints,
    ) -> Result<Vec<f32>, ForwardError> {
        self.trunk(state, tokens, Some(ckpt))
    }

    fn trunk(
        &self,
        state: &mut State,
        tokens: &[u32],
        mut ckpt: Option<&mut Checkpoints>,
    ) -> Result<Vec<f32>, ForwardError> {
        self.check_input(state, tokens)?;
        let cfg = &self.config;
        let (t, h) = (tokens.len(), cfg.hidden_size);
        let mut x = self.embed(tokens); // [T, H]
        let pos0 = state.pos;
        if let Some(c) = ckpt.as_deref_mut() {
            c.begin(self.layers.len(), pos0, t);
        }
        for (i, (layer, ls)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            let sink = ckpt.as_deref_mut().map(|c| c.layer_mut(i));
            self.layer_forward(layer, ls, &mut x, t, pos0, sink);
        }
        rms_norm_1p_rows(&mut x, &self.norm, cfg.rms_norm_eps);
        state.pos += t;
        state.last_hidden.copy_from_slice(&x[(t - 1) * h..]);
        Ok(x)
    }

    /// Token embeddings `[T, hidden]` (ids must be in range).
    pub(crate) fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        let h = self.config.hidden_size;
        let mut x = vec![0.0; tokens.len() * h];
        for (row, &tok) in x.chunks_exact_mut(h).zip(tokens) {
            self.embed_tokens.decode_row(tok as usize, row);
        }
        x
    }

    /// One pre-norm decoder layer over `x` (`[T, hidden]`, residual stream)
    /// at positions `pos0..pos0+T`, in place. `ckpt` (DeltaNet layers only)
    /// receives the layer's state after every token.
    pub(crate) fn layer_forward(
        &self,
        layer: &Layer<'_>,
        ls: &mut LayerState,
        x: &mut [f32],
        t: usize,
        pos0: usize,
        ckpt: Option<&mut Vec<f32>>,
    ) {
        let cfg = &self.config;
        let ex = self.exec();
        let mut hn = x.to_vec();
        rms_norm_1p_rows(&mut hn, &layer.input_norm, cfg.rms_norm_eps);
        let mixed = match (&layer.mixer, ls) {
            (Mixer::Linear(d), LayerState::Linear { conv, recurrent }) => {
                let _p = crate::profile::scope(crate::profile::Part::DeltaNet);
                let min = self.chunked_min;
                d.forward_checkpointed(cfg, ex, min, &hn, t, conv, recurrent, ckpt)
            }
            (Mixer::Full(a), LayerState::Full { k, v }) => {
                let _p = crate::profile::scope(crate::profile::Part::Attention);
                a.forward(cfg, ex, &self.inv_freq, &hn, t, pos0, k, v)
            }
            _ => unreachable!("state layout checked in check_input"),
        };
        add(x, &mixed);
        let mut hn = x.to_vec();
        rms_norm_1p_rows(&mut hn, &layer.post_attention_norm, cfg.rms_norm_eps);
        add(x, &layer.mlp.forward(ex, &hn, t, &self.expert_reads));
    }

    /// Routed-expert weight bytes read and expert passes made by this
    /// model's forwards so far (0 for a dense model): an expert that any
    /// token of a forward is routed to is read once in that forward.
    pub fn expert_reads(&self) -> (u64, u64) {
        let r = &self.expert_reads;
        (
            r.bytes.load(core::sync::atomic::Ordering::Relaxed),
            r.passes.load(core::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Validates tokens and state before anything is mutated.
    fn check_input(&self, state: &State, tokens: &[u32]) -> Result<(), ForwardError> {
        let cfg = &self.config;
        if tokens.is_empty() {
            return Err(ForwardError::Empty);
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ForwardError::TokenOutOfRange { token: bad, vocab_size: cfg.vocab_size });
        }
        let needed = state.pos + tokens.len();
        if needed > cfg.max_position_embeddings {
            return Err(ForwardError::ContextFull { needed, max: cfg.max_position_embeddings });
        }
        let matches = state.layers.len() == self.layers.len()
            && state.last_hidden.len() == cfg.hidden_size
            && self.layers.iter().zip(&state.layers).all(|(l, s)| match (&l.mixer, s) {
                (Mixer::Linear(_), LayerState::Linear { conv, recurrent }) => {
                    conv.len() == (cfg.linear_conv_kernel_dim - 1) * cfg.linear_conv_dim()
                        && recurrent.len()
                            == cfg.linear_num_value_heads
                                * cfg.linear_key_head_dim
                                * cfg.linear_value_head_dim
                }
                (Mixer::Full(_), LayerState::Full { k, v }) => {
                    let n = state.pos * cfg.num_key_value_heads * cfg.head_dim;
                    k.len() == n && v.len() == n
                }
                _ => false,
            });
        if !matches {
            return Err(ForwardError::StateMismatch);
        }
        Ok(())
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// SwiGLU: `down(silu(gate(x)) * up(x))` over `[T, hidden]`.
pub(super) fn mlp_forward(ex: Exec<'_>, m: &Mlp<'_>, x: &[f32], t: usize) -> Vec<f32> {
    let inter = m.gate_proj.rows();
    let mut g = vec![0.0; t * inter];
    let mut u = vec![0.0; t * inter];
    ex.matmuls(
        t,
        &mut [Product::new(&m.gate_proj, x, &mut g), Product::new(&m.up_proj, x, &mut u)],
    );
    silu_mul(ex.path, &mut g, &u);
    let mut y = vec![0.0; t * m.down_proj.rows()];
    ex.matmul(&m.down_proj, &g, t, &mut y);
    y
}

fn load_mlp<'a, S: TensorSource + ?Sized>(
    w: &WeightLoader<'a, S>,
    cfg: &ModelConfig,
    p: &str,
) -> Result<Mlp<'a>, WeightError> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    Ok(Mlp {
        gate_proj: w.linear(&format!("{p}.gate_proj"), i, h)?,
        up_proj: w.linear(&format!("{p}.up_proj"), i, h)?,
        down_proj: w.linear(&format!("{p}.down_proj"), h, i)?,
    })
}

fn load_layer<'a, S: TensorSource + ?Sized>(
    w: &WeightLoader<'a, S>,
    cfg: &ModelConfig,
    p: &str,
    kind: LayerKind,
) -> Result<Layer<'a>, WeightError> {
    let h = cfg.hidden_size;
    let mixer = match kind {
        LayerKind::Linear => Mixer::Linear(DeltaNet::load(w, cfg, &format!("{p}.linear_attn"))?),
        LayerKind::Full => Mixer::Full(Attention::load(w, cfg, &format!("{p}.self_attn"))?),
    };
    let mlp = match &cfg.moe {
        Some(m) => Ffn::Moe(Moe::load(w, cfg, m, &format!("{p}.mlp"))?),
        None => Ffn::Dense(load_mlp(w, cfg, &format!("{p}.mlp"))?),
    };
    Ok(Layer {
        input_norm: w.vector(&format!("{p}.input_layernorm.weight"), h)?,
        post_attention_norm: w.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
        mixer,
        mlp,
    })
}

fn load_mtp<'a, S: TensorSource + ?Sized>(
    w: &WeightLoader<'a, S>,
    cfg: &ModelConfig,
) -> Result<MtpWeights<'a>, WeightError> {
    let h = cfg.hidden_size;
    Ok(MtpWeights {
        fc: w.linear("mtp.fc", h, 2 * h)?,
        pre_fc_norm_embedding: w.vector("mtp.pre_fc_norm_embedding.weight", h)?,
        pre_fc_norm_hidden: w.vector("mtp.pre_fc_norm_hidden.weight", h)?,
        layer: load_layer(w, cfg, "mtp.layers.0", LayerKind::Full)?,
        norm: w.vector("mtp.norm.weight", h)?,
    })
}
