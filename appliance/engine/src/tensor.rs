//! Borrowed tensors: element types and a `TensorView` over raw little-endian
//! bytes (both from kore-pack-format), and the `TensorSource` trait through which the engine finds its
//! weights (memory-mapped Hugging Face files, model packs, or a pack already
//! in guest memory).

use alloc::string::String;

pub use kore_pack_format::view::read_float;
pub use kore_pack_format::{DType, TensorView};

/// Where the engine gets its weights from, by canonical tensor name
/// (`model.embed_tokens.weight`, `model.layers.N.…`, `model.norm.weight`,
/// `lm_head.weight`, `mtp.…`).
pub trait TensorSource {
    /// The tensor with this canonical name, if present.
    fn tensor(&self, name: &str) -> Option<TensorView<'_>>;

    /// Human-readable location of a tensor (file name) or of the whole source
    /// when the tensor is absent, used in error messages.
    fn location(&self, name: &str) -> String;
}

impl TensorSource for kore_pack_format::Safetensors<'_> {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.get(name)
    }

    fn location(&self, _name: &str) -> String {
        "safetensors buffer".into()
    }
}
