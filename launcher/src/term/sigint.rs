//! Ctrl-C as a flag: while installed, SIGINT does not kill the process but
//! sets a flag that the chat polls (to cancel the answer in progress) and
//! interrupts a blocking read of the input (EINTR, no SA_RESTART).

use std::sync::atomic::{AtomicBool, Ordering};

static PENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only an atomic store: async-signal-safe.
    PENDING.store(true, Ordering::SeqCst);
}

/// Installs the handler (idempotent). `vmm-sys-util` installs it without
/// `SA_RESTART` (unlike `signal-hook`), which the blocking read relies on.
pub fn install() -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(libc::SIGINT, on_sigint)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

/// True (once) if Ctrl-C was pressed since the last call.
pub fn take() -> bool {
    PENDING.swap(false, Ordering::SeqCst)
}
