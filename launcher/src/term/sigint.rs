//! Ctrl-C as a flag: while installed, SIGINT does not kill the process but
//! sets a flag that the chat polls (to cancel the answer in progress) and
//! interrupts a blocking read of the input (EINTR, no SA_RESTART).

use std::sync::atomic::{AtomicBool, Ordering};

static PENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    PENDING.store(true, Ordering::SeqCst);
}

/// Installs the handler (idempotent).
pub fn install() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; we set
    // a handler that only performs an atomic store, and pass valid pointers.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// True (once) if Ctrl-C was pressed since the last call.
pub fn take() -> bool {
    PENDING.swap(false, Ordering::SeqCst)
}
