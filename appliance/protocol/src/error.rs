//! Stable error codes (the `error.code` field) and the error of a rejected
//! request line.

use alloc::string::String;
use core::fmt;
use serde::{Deserialize, Serialize};

use crate::request::Id;

/// Stable error codes of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not valid UTF-8 or not a JSON object.
    BadJson,
    /// Valid JSON, but a field is missing, unknown, or of the wrong type/range.
    BadRequest,
    /// The line exceeds the line-length limit; it was skipped up to its newline.
    LineTooLong,
    /// Prompt tokens leave no room to generate within the context limit.
    PromptTooLong,
    /// The request queue (or the connection table) is full; retry later.
    Overloaded,
    /// The id is already in flight on this connection.
    DuplicateId,
    /// The operation is not available in this build.
    Unsupported,
    /// The engine or tokenizer failed; the service keeps running.
    Internal,
}

impl ErrorCode {
    /// The code's wire name (`bad_request`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadJson => "bad_json",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::LineTooLong => "line_too_long",
            ErrorCode::PromptTooLong => "prompt_too_long",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::DuplicateId => "duplicate_id",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected line: the id to answer with, the code and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    /// Echoed id (`null` if unreadable).
    pub id: Id,
    /// Stable error code.
    pub code: ErrorCode,
    /// What is wrong and what to fix.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_match_serde() {
        for code in [
            ErrorCode::BadJson,
            ErrorCode::BadRequest,
            ErrorCode::LineTooLong,
            ErrorCode::PromptTooLong,
            ErrorCode::Overloaded,
            ErrorCode::DuplicateId,
            ErrorCode::Unsupported,
            ErrorCode::Internal,
        ] {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json.trim_matches('"'), code.as_str());
        }
    }
}
