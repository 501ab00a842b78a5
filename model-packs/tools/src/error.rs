//! The one error type of this crate: every defect names the file (and the
//! tensor, where there is one) and says what to do about it.

use kore_pack_format::manifest::ManifestError;
use kore_pack_format::safetensors::HeaderError;
use std::path::{Path, PathBuf};

/// Everything that can go wrong reading, writing, importing or verifying a pack.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The operating system refused a read or write.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file ends before the data its header promises.
    #[error("{}: truncated: {what} needs {needed} bytes but the file has {actual}; re-copy or re-create it", file.display())]
    Truncated {
        /// The file involved.
        file: PathBuf,
        /// What was being read.
        what: String,
        /// Bytes required.
        needed: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The safetensors header is malformed (bad length, bad JSON, duplicate names...).
    #[error("{}: bad safetensors header: {reason}", file.display())]
    BadHeader {
        /// The file involved.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// One tensor entry of a safetensors file is inconsistent.
    #[error("{}: tensor `{tensor}`: {reason}", file.display())]
    BadTensor {
        /// The file involved.
        file: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// Two tensors claim the same bytes.
    #[error("{}: tensors `{tensor}` and `{other}` overlap in the data area (header offsets lie)", file.display())]
    Overlap {
        /// The file involved.
        file: PathBuf,
        /// One tensor.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// A tensor's shape disagrees with the model configuration.
    #[error("{}: tensor `{tensor}`: shape {found:?} disagrees with the config, which implies {expected:?}", file.display())]
    ShapeMismatch {
        /// The file involved.
        file: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shape the config implies.
        expected: Vec<u64>,
        /// The shape in the file.
        found: Vec<u64>,
    },
    /// A tensor the config requires is absent.
    #[error("{}: tensor `{tensor}` is missing (the config requires it)", file.display())]
    MissingTensor {
        /// The file involved.
        file: PathBuf,
        /// The tensor's name.
        tensor: String,
    },
    /// A tensor the config does not know about.
    #[error("{}: tensor `{tensor}` is not part of this model's architecture", file.display())]
    UnexpectedTensor {
        /// The file involved.
        file: PathBuf,
        /// The tensor's name.
        tensor: String,
    },
    /// A file's sha256 differs from the one recorded in pack.toml.
    #[error("{}: sha256 mismatch: pack.toml records {expected}, the file hashes to {actual}; the file is corrupt or was modified", file.display())]
    Checksum {
        /// The file involved.
        file: PathBuf,
        /// The recorded digest.
        expected: String,
        /// The computed digest.
        actual: String,
    },
    /// pack.toml was written by a newer Kore.
    #[error("{}: pack format version {found} is newer than this kore-pack supports ({supported}); upgrade kore-launch", file.display())]
    NewerFormat {
        /// The manifest.
        file: PathBuf,
        /// The version found.
        found: u32,
        /// The newest version understood.
        supported: u32,
    },
    /// pack.toml (or an imported config.json) is malformed or inconsistent.
    #[error("{}: {reason}", file.display())]
    BadManifest {
        /// The file involved.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor cannot be quantized or its quantized form is invalid.
    #[error("tensor `{tensor}`: {reason}")]
    Quant {
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A request that makes no sense (unknown preset, bad option...).
    #[error("{0}")]
    Invalid(String),
}

impl PackError {
    /// Builds an [`PackError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PackError::Io { path: path.into(), source }
    }

    /// Builds a [`PackError::BadManifest`].
    pub fn manifest(file: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        PackError::BadManifest { file: file.into(), reason: reason.into() }
    }
}

impl PackError {
    /// A format-crate safetensors error, attributed to `file`.
    pub fn header(file: &Path, e: HeaderError) -> Self {
        let file = file.to_path_buf();
        match e {
            HeaderError::Truncated { what, needed, actual } => {
                PackError::Truncated { file, what, needed, actual }
            }
            HeaderError::BadHeader(reason) => PackError::BadHeader { file, reason },
            HeaderError::BadTensor { tensor, reason } => {
                PackError::BadTensor { file, tensor, reason }
            }
            HeaderError::Overlap { tensor, other } => PackError::Overlap { file, tensor, other },
        }
    }

    /// A format-crate manifest error, attributed to `file`.
    pub fn from_manifest(file: &Path, e: ManifestError) -> Self {
        match e {
            ManifestError::NewerFormat { found, supported } => {
                PackError::NewerFormat { file: file.to_path_buf(), found, supported }
            }
            other => PackError::manifest(file, other.to_string()),
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, PackError>;
