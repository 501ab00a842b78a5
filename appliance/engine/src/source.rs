//! An owned in-memory `TensorSource`: for tests, synthetic models and tools
//! that build weights on the fly.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::tensor::{DType, TensorSource, TensorView};

/// Tensors held in memory by name.
#[derive(Default, Debug, Clone)]
pub struct MemorySource {
    tensors: BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>,
    /// Name used in error messages.
    pub label: String,
}

impl MemorySource {
    /// An empty source labelled `label`.
    pub fn new(label: &str) -> Self {
        MemorySource { tensors: BTreeMap::new(), label: label.to_string() }
    }

    /// Adds (or replaces) a tensor from raw bytes. Returns `false` and stores
    /// nothing when the byte length does not match dtype and shape.
    pub fn insert_raw(&mut self, name: &str, dtype: DType, shape: &[usize], data: Vec<u8>) -> bool {
        let numel: Option<usize> = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match numel.and_then(|n| n.checked_mul(dtype.size())) {
            Some(len) if len == data.len() => {
                self.tensors.insert(name.to_string(), (dtype, shape.to_vec(), data));
                true
            }
            _ => false,
        }
    }

    /// Adds an F32 tensor. Returns `false` when `values` does not fit `shape`.
    pub fn insert_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> bool {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.insert_raw(name, DType::F32, shape, data)
    }

    /// Removes a tensor, returning whether it existed.
    pub fn remove(&mut self, name: &str) -> bool {
        self.tensors.remove(name).is_some()
    }

    /// Names of all tensors.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

impl TensorSource for MemorySource {
    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensors.get(name).map(|(dtype, shape, data)| TensorView { dtype: *dtype, shape, data })
    }

    fn location(&self, _name: &str) -> String {
        self.label.clone()
    }
}
