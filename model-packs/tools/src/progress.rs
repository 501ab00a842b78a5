//! Progress reporting for long operations; the launcher renders it with
//! indicatif, libraries and tests pass [`NoProgress`].

/// Receives progress of one operation at a time.
pub trait Progress {
    /// A new phase begins with `total` units (bytes unless said otherwise).
    fn start(&self, label: &str, total: u64);
    /// `n` more units are done.
    fn inc(&self, n: u64);
    /// The phase is over.
    fn finish(&self);
}

/// Discards progress.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _label: &str, _total: u64) {}
    fn inc(&self, _n: u64) {}
    fn finish(&self) {}
}
