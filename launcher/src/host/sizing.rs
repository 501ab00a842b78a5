//! How much guest memory the appliance needs for a pack and a context
//! length: the one sizing used by `setup`, `doctor` and the boot. The formula
//! (documented in docs/host-setup.md):
//!
//! ```text
//! total = weights + kv_cache + recurrent_state + sessions + heap + kernel
//! weights         = the pack files the VMM preloads (pack.toml, weights.safetensors,
//!                   tokenizer.json), each rounded up to 2 MiB as the VMM places them
//!                   (for a Hugging Face directory: its files)
//! kv_tokens       = max(context, 8 x min(context, 4096)): the KV positions all running
//!                   sequences share (the guest queues requests beyond them)
//! kv_cache        = 2 (growth headroom) x kv_tokens x (full-attention layers + MTP layers)
//!                   x 2 (K and V) x kv_heads x head_dim x bytes per element of the KV
//!                   precision the appliance runs with (`KORE_KV`: f16 by default, 2 bytes;
//!                   f32, 4)
//! sessions        = the prefix cache's memory budget (config key `cache`, `--cache`,
//!                   KORE_CACHE; default 512 MiB): checkpoints, LRU beyond it
//! recurrent_state = linear-attention layers x ( v_heads x k_dim x v_dim x 4 bytes (f32 state)
//!                   + (conv_kernel - 1) x (2 x k_heads x k_dim + v_heads x v_dim) x 4 bytes )
//! heap            = 256 MiB (activations, logits, tokenizer, I/O buffers)
//!                   + for an MoE model: 512 (a prefill chunk) x experts per token
//!                   x (2 x hidden + 2 x expert width) x 4 bytes (rows grouped by expert)
//! kernel          = 64 MiB (Kore kernel, appliance image, page tables, virtio rings)
//! ```
//!
//! The VMM gets `kv_cache + recurrent_state + sessions + heap + kernel` as the guest's own
//! memory (or the `memory` setting) and places the weights beside it;
//! [`Budget::guest_bytes_for`] is exactly the RAM it then allocates
//! (`kore_vmm::memory::RamPlan`), so the pages `setup` reserves and `doctor`
//! counts are the pages the boot asks for.
//!
//! An MoE model's weights are its whole pack: the guest holds every expert,
//! although a token reads only the ones it is routed to.
//!
//! The model shape is read from the pack's `pack.toml` or a Hugging Face
//! `config.json` (Qwen3.5 key names, the `text_config` table first). The
//! context is capped at the model's `max_position_embeddings`.

use super::hugepages::HugepageSize;
use super::HostError;
use kore_engine::state::KvPrecision;
use kore_vmm::memory::RamPlan;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;
/// The KV cache grows by doubling (`Vec`), so it may hold up to twice what it uses.
pub const KV_GROWTH: u64 = 2;
/// Sequences the guest decodes together at most (kore-appliance's default).
pub const BATCH_SEQUENCES: u64 = 8;
/// The context each of those gets room for when the configured context is longer.
pub const BATCH_CONTEXT: u64 = 4096;
/// The most kept session states take.
pub const SESSION_BYTES: u64 = 512 * MIB;
/// The pack files the VMM preloads, in order.
pub const PRELOADED: [&str; 3] = ["pack.toml", "weights.safetensors", "tokenizer.json"];
/// Bytes per recurrent-state element (f32).
pub const STATE_BYTES: u64 = 4;
/// Heap for activations, logits, tokenizer and I/O buffers.
pub const HEAP_BYTES: u64 = 256 * MIB;
/// Kore kernel, appliance image, page tables and virtio rings.
pub const KERNEL_BYTES: u64 = 64 * MIB;
/// Tokens of a prefill chunk (kore-appliance's default), whose rows an MoE
/// layer holds grouped by expert.
pub const PREFILL_CHUNK: u64 = 512;

/// The parts of a model's shape that decide its per-token memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Full (gated) attention layers, which keep a KV cache.
    pub full_layers: u64,
    /// Gated DeltaNet layers, which keep a fixed-size recurrent state.
    pub linear_layers: u64,
    /// MTP layers (one full-attention layer each, with its own KV cache).
    pub mtp_layers: u64,
    /// KV heads of the full-attention layers.
    pub kv_heads: u64,
    /// Head dimension of the full-attention layers.
    pub head_dim: u64,
    /// Key heads of the linear-attention layers.
    pub linear_k_heads: u64,
    /// Value heads of the linear-attention layers.
    pub linear_v_heads: u64,
    /// Key head dimension of the linear-attention layers.
    pub linear_k_dim: u64,
    /// Value head dimension of the linear-attention layers.
    pub linear_v_dim: u64,
    /// Causal conv kernel size of the linear-attention layers.
    pub conv_kernel: u64,
    /// The model's maximum context, if given.
    pub max_context: Option<u64>,
    /// An MoE model's prefill-chunk activations grouped by expert (0 if dense).
    pub moe_chunk_bytes: u64,
}

impl ModelShape {
    /// KV-cache bytes per token of context in precision `kv` (without growth headroom).
    pub fn kv_bytes_per_token(&self, kv: KvPrecision) -> u64 {
        (self.full_layers + self.mtp_layers) * 2 * self.kv_heads * self.head_dim * kv.bytes() as u64
    }

    /// Recurrent state bytes (independent of the context).
    pub fn recurrent_bytes(&self) -> u64 {
        let state = self.linear_v_heads * self.linear_k_dim * self.linear_v_dim;
        let conv_channels =
            2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim;
        let conv = self.conv_kernel.saturating_sub(1) * conv_channels;
        self.linear_layers * (state + conv) * STATE_BYTES
    }
}

/// The guest memory budget, part by part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The model directory sized.
    pub pack: PathBuf,
    /// Context length the budget is for (after capping).
    pub context: u64,
    /// Pack files.
    pub weights: u64,
    /// KV cache for `context` tokens.
    pub kv_cache: u64,
    /// KV positions the running sequences share (the guest's admission budget).
    pub kv_tokens: u64,
    /// The KV cache's precision the budget is for.
    pub kv: KvPrecision,
    /// Kept session states.
    pub sessions: u64,
    /// Linear-attention state.
    pub recurrent_state: u64,
    /// Heap.
    pub heap: u64,
    /// Kernel and image.
    pub kernel: u64,
    /// The shape used, if one was found.
    pub shape: Option<ModelShape>,
    /// Remarks about the computation (capped context, missing shape).
    pub notes: Vec<String>,
    /// The guest's own memory set explicitly (`memory` in the config), if any.
    pub requested: Option<u64>,
}

impl Budget {
    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.weights + self.own_needed()
    }

    /// Everything but the weights, as computed (ignoring an explicit `memory`).
    fn own_needed(&self) -> u64 {
        self.kv_cache + self.recurrent_state + self.sessions + self.heap + self.kernel
    }

    /// The guest's own memory (everything but the preloaded pack): what the
    /// VMM is given as its `memory`, the explicit `memory` setting if any.
    pub fn own_memory(&self) -> u64 {
        self.requested.unwrap_or_else(|| self.own_needed())
    }

    /// Guest RAM the VMM allocates on pages of `size` (the guest's own memory
    /// and the preloaded pack, laid out by `kore_vmm::memory::RamPlan`).
    pub fn guest_bytes_for(&self, size: HugepageSize) -> u64 {
        let page = size.bytes().unwrap_or(4096);
        match RamPlan::new(self.own_memory(), self.weights, page) {
            Ok(plan) => plan.total(),
            // Sizes the VMM refuses (it says why at boot): the plain sum.
            Err(_) => (self.own_memory() + self.weights).div_ceil(page) * page,
        }
    }

    /// [`Budget::guest_bytes_for`] on 2 MiB pages.
    pub fn guest_bytes(&self) -> u64 {
        self.guest_bytes_for(HugepageSize::M2)
    }

    /// Uses an explicit size for the guest's own memory (besides the pack).
    pub fn with_memory(mut self, memory: Option<u64>) -> Budget {
        let own = self.own_needed();
        if let Some(bytes) = memory.filter(|&b| b < own) {
            self.notes.push(format!(
                "memory = {} is below the {} this pack and context need besides the weights: the appliance may run out of memory",
                mib(bytes),
                mib(own)
            ));
        }
        self.requested = memory;
        self
    }

    /// Sizes the prefix cache's memory tier at `bytes` (the configured
    /// `cache` budget) instead of the default.
    pub fn with_cache(mut self, bytes: u64) -> Budget {
        self.sessions = bytes;
        self
    }

    /// Sizes the model at `pack` for `context` tokens with a KV cache in precision `kv`
    /// (the appliance's: `appliance::budget`).
    pub fn compute(pack: &Path, context: u64, kv: KvPrecision) -> Result<Budget, HostError> {
        let err = |reason: String| HostError::Pack { path: pack.to_path_buf(), reason };
        if !pack.is_dir() {
            return Err(err("not a directory".to_string()));
        }
        let weights = preloaded_bytes(pack).map_err(|e| err(e.to_string()))?;
        let mut notes = Vec::new();
        let shape = read_shape(pack).map_err(err)?;
        let mut context = context;
        let mut kv_tokens = context;
        let (kv_cache, recurrent_state) = match &shape {
            Some(shape) => {
                if let Some(max) = shape.max_context.filter(|&max| context > max) {
                    notes.push(format!(
                        "context {context} is above the model's maximum {max}: sized for {max}"
                    ));
                    context = max;
                }
                kv_tokens = context.max(BATCH_SEQUENCES * context.min(BATCH_CONTEXT));
                (KV_GROWTH * kv_tokens * shape.kv_bytes_per_token(kv), shape.recurrent_bytes())
            }
            None => {
                notes.push(
                    "no model shape found in pack.toml or config.json: KV cache and state estimated as a quarter of the weights"
                        .to_string(),
                );
                (weights / 4, 0)
            }
        };
        let moe_heap = shape.map_or(0, |s| s.moe_chunk_bytes);
        if moe_heap > 0 {
            notes.push(
                "mixture of experts: the guest holds every expert (the whole pack), although a token reads only the experts it is routed to"
                    .to_string(),
            );
        }
        Ok(Budget {
            pack: pack.to_path_buf(),
            context,
            weights,
            kv_cache,
            kv_tokens,
            kv,
            sessions: kv_cache.min(SESSION_BYTES),
            recurrent_state,
            heap: HEAP_BYTES + moe_heap,
            kernel: KERNEL_BYTES,
            shape,
            notes,
            requested: None,
        })
    }

    /// One line per part, for `setup` and `doctor`.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "weights          {:>10}  (files in {})",
                mib(self.weights),
                self.pack.display()
            ),
            format!(
                "KV cache         {:>10}  ({} positions shared by the running sequences, context {}; {}, room to double)",
                mib(self.kv_cache),
                self.kv_tokens,
                self.context,
                self.kv.name()
            ),
            format!("recurrent state  {:>10}", mib(self.recurrent_state)),
            format!("sessions         {:>10}  (prefix cache checkpoints)", mib(self.sessions)),
            format!("heap             {:>10}", mib(self.heap)),
            format!("kernel           {:>10}", mib(self.kernel)),
            format!("total            {:>10}", mib(self.total())),
            format!(
                "guest RAM        {:>10}  (as the VMM lays it out on 2 MiB pages)",
                mib(self.guest_bytes())
            ),
        ];
        if let Some(bytes) = self.requested {
            lines.push(format!(
                "guest memory     {:>10}  (besides the weights; set by `memory`)",
                mib(bytes)
            ));
        }
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines
    }
}

/// Formats bytes as MiB, rounded up.
pub fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(MIB))
}

/// The bytes the VMM preloads for the pack at `dir`: each of [`PRELOADED`]
/// rounded up to 2 MiB, as it places them. A Hugging Face directory (no
/// `pack.toml`) is imported to a pack of the same dtypes first: its files.
fn preloaded_bytes(dir: &Path) -> std::io::Result<u64> {
    if !dir.join("pack.toml").is_file() {
        return dir_bytes(dir);
    }
    let huge = 2 * MIB;
    // A missing file is the boot's error to report (it names the file); size what is there.
    let present = PRELOADED.iter().filter_map(|name| fs::metadata(dir.join(name)).ok());
    Ok(present.map(|m| m.len().max(1).div_ceil(huge) * huge).sum())
}

/// Total size of the regular files under `dir` (hidden entries skipped, links followed).
fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let meta = fs::metadata(entry.path())?;
        if meta.is_dir() {
            total += dir_bytes(&entry.path())?;
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

/// Reads the shape from `pack.toml`, else `config.json`; `Ok(None)` if neither has one.
fn read_shape(pack: &Path) -> Result<Option<ModelShape>, String> {
    for name in ["pack.toml", "config.json"] {
        let path = pack.join(name);
        let Ok(text) = fs::read_to_string(&path) else { continue };
        let value = if name.ends_with(".toml") {
            let table: toml::Value =
                toml::from_str(&text).map_err(|e| format!("{name}: {}", e.message()))?;
            serde_json::to_value(table).map_err(|e| format!("{name}: {e}"))?
        } else {
            serde_json::from_str(&text).map_err(|e| format!("{name}: {e}"))?
        };
        if let Some(shape) = shape_from(&value) {
            return Ok(Some(shape));
        }
    }
    Ok(None)
}

/// Finds `key` anywhere in `v` (depth-first, tables in document order).
fn find<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    match v {
        Value::Object(map) => {
            map.get(key).or_else(|| map.values().find_map(|child| find(child, key)))
        }
        Value::Array(items) => items.iter().find_map(|child| find(child, key)),
        _ => None,
    }
}

/// Builds a shape from a config value (Qwen3.5 `config.json` key names).
pub fn shape_from(config: &Value) -> Option<ModelShape> {
    let root = find(config, "text_config").filter(|v| v.is_object()).unwrap_or(config);
    let num = |key: &str| find(root, key).and_then(Value::as_u64);
    let layers = num("num_hidden_layers")?;
    let (full_layers, linear_layers) = match find(root, "layer_types").and_then(Value::as_array) {
        Some(types) => {
            let full = types.iter().filter(|t| t.as_str() == Some("full_attention")).count() as u64;
            (full, types.len() as u64 - full)
        }
        None => {
            let interval = num("full_attention_interval").unwrap_or(4).max(1);
            (layers / interval, layers - layers / interval)
        }
    };
    let head_dim = num("head_dim")
        .or_else(|| Some(num("hidden_size")? / num("num_attention_heads")?.max(1)))?;
    let moe_chunk_bytes = match (num("num_experts_per_tok"), num("moe_intermediate_size")) {
        (Some(k), Some(i)) => PREFILL_CHUNK * k * (2 * num("hidden_size").unwrap_or(0) + 2 * i) * 4,
        _ => 0,
    };
    Some(ModelShape {
        full_layers,
        linear_layers,
        mtp_layers: num("mtp_num_hidden_layers").unwrap_or(0),
        kv_heads: num("num_key_value_heads").or_else(|| num("num_attention_heads"))?,
        head_dim,
        linear_k_heads: num("linear_num_key_heads").unwrap_or(0),
        linear_v_heads: num("linear_num_value_heads").unwrap_or(0),
        linear_k_dim: num("linear_key_head_dim").unwrap_or(0),
        linear_v_dim: num("linear_value_head_dim").unwrap_or(0),
        conv_kernel: num("linear_conv_kernel_dim").unwrap_or(4),
        max_context: num("max_position_embeddings"),
        moe_chunk_bytes,
    })
}
