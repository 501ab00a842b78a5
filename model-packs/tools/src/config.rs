//! The pack's model configuration (pack.toml's `[config]`) and the tensors it
//! implies; the types live in kore-pack-format, shared with the guest.

pub use kore_pack_format::manifest::{
    ExpectedTensor, LayerType, LinearGroup, PackConfig, PackMoe, TensorKind, ARCHITECTURE,
    ARCHITECTURE_MOE,
};
