//! SIGINT/SIGTERM handling: a watcher thread (`signal-hook`'s iterator)
//! stops the VM, so it tears down and releases its hugepages instead of
//! dying mid-run.

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::running::Stopper;

/// Errors installing the handlers.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// A system call failed.
    #[error("installing SIGINT/SIGTERM handlers failed: {0}")]
    Os(std::io::Error),
}

/// Installs SIGINT and SIGTERM handlers that stop the VM behind `stopper`.
/// Each call adds a watcher for its own VM.
pub fn stop_on_signals(stopper: Stopper) -> Result<(), SignalError> {
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(SignalError::Os)?;
    std::thread::Builder::new()
        .name("kore-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::warn!("signal {sig} received: stopping the VM");
                stopper.stop();
            }
        })
        .map_err(SignalError::Os)?;
    Ok(())
}
