//! SIGINT/SIGTERM handling: a watcher thread stops the VM, so it tears down
//! and releases its hugepages instead of dying mid-run.

use std::sync::atomic::{AtomicI32, Ordering};

use crate::vm::Stopper;

static PIPE_W: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = PIPE_W.load(Ordering::SeqCst);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; the buffer is a live local.
        unsafe {
            libc::write(fd, (&b as *const u8).cast(), 1);
        }
    }
}

/// Errors installing the handlers.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// A system call failed.
    #[error("installing SIGINT/SIGTERM handlers failed: {0}")]
    Os(std::io::Error),
}

/// Installs SIGINT and SIGTERM handlers that stop the VM behind `stopper`.
/// Call once per process; later calls replace the target VM.
pub fn stop_on_signals(stopper: Stopper) -> Result<(), SignalError> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SignalError::Os(std::io::Error::last_os_error()));
    }
    let old = PIPE_W.swap(fds[1], Ordering::SeqCst);
    if old >= 0 {
        // SAFETY: closing the previous pipe's write end, which we own.
        unsafe { libc::close(old) };
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: on_signal only performs async-signal-safe operations.
        let r = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
        if r == libc::SIG_ERR {
            return Err(SignalError::Os(std::io::Error::last_os_error()));
        }
    }
    let rfd = fds[0];
    std::thread::Builder::new()
        .name("kore-signals".into())
        .spawn(move || {
            let mut b = 0u8;
            // SAFETY: reading one byte into a live local from our pipe.
            let n = unsafe { libc::read(rfd, (&mut b as *mut u8).cast(), 1) };
            if n == 1 {
                tracing::warn!("signal received: stopping the VM");
                stopper.stop();
            }
        })
        .map_err(SignalError::Os)?;
    Ok(())
}
