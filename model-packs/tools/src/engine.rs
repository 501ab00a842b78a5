//! The bridge to kore-engine: a [`Pack`] is a `TensorSource` (borrowed views
//! straight into the mapped weights file) and carries the engine's
//! `ModelConfig` (pack.toml's one mapping, in kore-pack-format).

use crate::error::{PackError, Result};
use crate::pack::Pack;
use kore_engine::{Model, TensorSource, TensorView};

impl Pack {
    /// The engine's model configuration (context length from pack.toml).
    pub fn engine_config(&self) -> kore_engine::ModelConfig {
        self.manifest().model_config()
    }

    /// Loads the engine's model over this pack's mapped weights.
    pub fn model(&self) -> Result<Model<'_>> {
        Model::load(self.engine_config(), self).map_err(|e| PackError::BadManifest {
            file: self.weights().path().to_path_buf(),
            reason: format!("the engine cannot load this pack: {e}"),
        })
    }
}

impl TensorSource for Pack {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.weights().tensor_view(name)
    }

    fn location(&self, _name: &str) -> String {
        self.weights().path().display().to_string()
    }
}
