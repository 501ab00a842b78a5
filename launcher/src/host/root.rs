//! The [`Sys`] trait (read, write, list and follow links under `/sys`,
//! `/proc`, `/dev`) and [`SysRoot`], its implementation over a root
//! directory: `/` on a real host, a temporary tree in tests.

use super::HostError;
use std::fs;
use std::io::Write;
use std::path::PathBuf;

/// Access to the host's kernel interfaces by absolute path ("/sys/...").
///
/// Implementations map those paths somewhere: [`SysRoot`] prefixes a root
/// directory; a test may wrap it to simulate the kernel's reaction to writes.
pub trait Sys {
    /// The real location of `path` (for messages and for opening devices).
    fn locate(&self, path: &str) -> PathBuf;
    /// Reads a whole file as text.
    fn read(&self, path: &str) -> Result<String, HostError>;
    /// Writes `value` to an existing file, as `echo value > path` would.
    fn write(&self, path: &str, value: &str) -> Result<(), HostError>;
    /// Entry names of a directory, sorted; empty if it does not exist.
    fn list(&self, path: &str) -> Vec<String>;
    /// Whether the path exists.
    fn exists(&self, path: &str) -> bool;
    /// The file name a symbolic link points to (e.g. the driver's name), if it is a link.
    fn link_name(&self, path: &str) -> Option<String>;

    /// Reads a file holding one unsigned integer.
    fn read_u64(&self, path: &str) -> Result<u64, HostError> {
        let text = self.read(path)?;
        text.trim().parse().map_err(|_| HostError::Parse {
            path: self.shown(path),
            contents: text.trim().to_string(),
            expected: "an unsigned integer",
        })
    }
    /// The path as printed to the user.
    fn shown(&self, path: &str) -> String {
        self.locate(path).display().to_string()
    }
}

/// The host's filesystem seen from a root directory (default `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoot {
    base: PathBuf,
}

impl Default for SysRoot {
    fn default() -> Self {
        SysRoot { base: PathBuf::from("/") }
    }
}

impl SysRoot {
    /// A view of the filesystem rooted at `base`.
    pub fn new(base: impl Into<PathBuf>) -> Self {
        SysRoot { base: base.into() }
    }
}

impl Sys for SysRoot {
    fn locate(&self, path: &str) -> PathBuf {
        self.base.join(path.trim_start_matches('/'))
    }

    fn read(&self, path: &str) -> Result<String, HostError> {
        let real = self.locate(path);
        fs::read_to_string(&real)
            .map_err(|source| HostError::Read { path: real.display().to_string(), source })
    }

    fn write(&self, path: &str, value: &str) -> Result<(), HostError> {
        let real = self.locate(path);
        tracing::debug!(path = %real.display(), value, "sysfs write");
        // One write(2) of the whole value, like `echo value > path`; never
        // create the file (a missing sysfs attribute is an error).
        let result = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&real)
            .and_then(|mut file| file.write_all(format!("{value}\n").as_bytes()));
        result.map_err(|source| HostError::Write {
            path: real.display().to_string(),
            value: value.to_string(),
            source,
        })
    }

    fn list(&self, path: &str) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.locate(path)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn exists(&self, path: &str) -> bool {
        // A dangling link still "exists" as an entry (sysfs links never dangle).
        fs::symlink_metadata(self.locate(path)).is_ok()
    }

    fn link_name(&self, path: &str) -> Option<String> {
        let target = fs::read_link(self.locate(path)).ok()?;
        target.file_name().map(|n| n.to_string_lossy().into_owned())
    }
}
