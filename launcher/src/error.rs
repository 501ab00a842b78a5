//! The launcher's error type: one line for the user, and an exit code.

use kore_protocol::ErrorCode;

/// Everything that can make a `kore-launch` command fail.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Wrong or inconsistent command-line usage.
    #[error("{0}")]
    Usage(String),
    /// A model directory or pack could not be loaded.
    #[error("{0}")]
    Model(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Talking to the appliance failed, or it refused a request.
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    /// A thread, process or runtime this command needs could not be started.
    #[error("cannot start {what}: {source}")]
    Start {
        /// What was being started.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The user cancelled the work (Ctrl-C).
    #[error("{0} was cancelled (Ctrl-C)")]
    Cancelled(&'static str),
    /// The appliance (its VM, VMM process or daemon) failed or cannot be reached.
    #[error(transparent)]
    Appliance(#[from] ApplianceError),
    /// Serving HTTP failed (the listening socket or the server).
    #[error("{what}: {source}")]
    Serve {
        /// What failed (e.g. "cannot listen on 127.0.0.1:8080").
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A report or answer line could not be written as JSON.
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// `batch --fail-on-error`: some lines failed.
    #[error("{failed} of {total} lines failed (see their error rows); rerun to retry them")]
    BatchFailed {
        /// Lines that failed.
        failed: usize,
        /// Lines in the batch.
        total: usize,
    },
    /// The host is not ready for the appliance (a failed doctor check, or a
    /// setup change that could not be made); the message says how to fix it.
    #[error("{0}")]
    Host(String),
}

impl LaunchError {
    /// The process exit code for this error (documented in docs/user-guide.md).
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::Usage(_) => 2,
            LaunchError::Model(_) => 3,
            LaunchError::Io { .. } => 4,
            LaunchError::Client(e) => match e.code() {
                Some(ErrorCode::BadRequest | ErrorCode::PromptTooLong | ErrorCode::BadJson) => 2,
                _ => 1,
            },
            LaunchError::Start { .. }
            | LaunchError::Cancelled(_)
            | LaunchError::Appliance(_)
            | LaunchError::Serve { .. }
            | LaunchError::Json(_)
            | LaunchError::BatchFailed { .. } => 1,
            LaunchError::Host(_) => 5,
        }
    }
}

/// Why the appliance failed or could not be reached; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ApplianceError {
    /// Connecting to the guest's service through the vsock socket failed.
    #[error("the Kore guest's vsock: {0}")]
    Vsock(#[source] kore_vmm::vsock::ConnectError),
    /// The VM was already stopped.
    #[error("the VM is gone (it was stopped); start it again")]
    Gone,
    /// The guest ended before its service accepted.
    #[error("the Kore guest {how} before its service was ready; console:\n{console}")]
    EndedEarly {
        /// How it ended.
        how: String,
        /// The serial console's last lines.
        console: String,
    },
    /// The service did not accept in time.
    #[error(
        "the Kore guest did not accept on vsock port {port} within {limit:?}; it hangs or the \
         host is very slow (KORE_BOOT_TIMEOUT_S waits longer)"
    )]
    BootTimeout {
        /// The service's port.
        port: u32,
        /// The limit.
        limit: std::time::Duration,
    },
    /// Another appliance serves the socket.
    #[error(
        "{0} is in use by a running appliance; stop it with `kore-launch down` or use another \
         runtime directory"
    )]
    SocketInUse(String),
    /// No appliance runs in the runtime directory.
    #[error("no appliance is running in {dir} (no {socket}); start one with `kore-launch up`")]
    NotRunning {
        /// The runtime directory.
        dir: String,
        /// The socket file's name.
        socket: &'static str,
    },
    /// A running appliance does not answer.
    #[error("the appliance (pid {pid}) does not answer on {socket}: {source}")]
    NotAnswering {
        /// The daemon's pid.
        pid: u32,
        /// Its socket.
        socket: String,
        /// Why.
        #[source]
        source: Box<LaunchError>,
    },
    /// A request saw no event for the watchdog's limit and the probe failed.
    #[error(
        "the appliance stopped answering: no event for {silent_s}s on this request, and {why} \
         within {limit_s}s, so it is probably hung; the request is abandoned (restart an \
         appliance of `kore-launch up` with `down` and `up`). On a host so slow that one engine \
         step takes longer, raise KORE_HANG_TIMEOUT_S"
    )]
    Hung {
        /// Seconds without an event.
        silent_s: u64,
        /// What the probe saw.
        why: &'static str,
        /// The probe's limit in seconds.
        limit_s: u64,
    },
    /// The appliance's socket went away mid-answer.
    #[error("the appliance went away in the middle of an answer ({0}); restart it")]
    WentAway(kore_vmm::vsock::ConnectError),
    /// The VMM process ended before the VM started.
    #[error("the VMM process ended before the VM started ({0})")]
    VmmEnded(String),
    /// `up`: the daemon did not answer in time.
    #[error(
        "the appliance did not answer within {limit:?} (log: {log}); `kore-launch down` stops it"
    )]
    DaemonTimeout {
        /// The limit.
        limit: std::time::Duration,
        /// The daemon's log file.
        log: String,
    },
    /// `up`: the daemon exited.
    #[error("the appliance did not start ({status}): {last} (log: {log})")]
    DaemonExited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The log's last line.
        last: String,
        /// The daemon's log file.
        log: String,
    },
}

/// Result alias for launcher commands.
pub type Result<T> = std::result::Result<T, LaunchError>;
