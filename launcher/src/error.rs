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
    /// Any other failure, already phrased for the user.
    #[error("{0}")]
    Other(String),
    /// The host is not ready for the appliance (a failed doctor check, or a
    /// setup change that could not be made); the message says how to fix it.
    #[error("{0}")]
    Host(String),
}

impl From<crate::config::ConfigError> for LaunchError {
    fn from(err: crate::config::ConfigError) -> Self {
        LaunchError::Usage(err.to_string())
    }
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
            LaunchError::Start { .. } | LaunchError::Cancelled(_) | LaunchError::Other(_) => 1,
            LaunchError::Host(_) => 5,
        }
    }
}

/// Result alias for launcher commands.
pub type Result<T> = std::result::Result<T, LaunchError>;
