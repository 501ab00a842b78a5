//! End-to-end tests of `kore-launch` live in `tests/tests/`; this crate only
//! provides helpers to locate the built binary and the repository.
use std::path::PathBuf;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}
