//! The crate's error type.

use alloc::string::String;
use core::fmt;

use crate::json::JsonError;

/// Why a constraint cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarError {
    /// A JSON Schema keyword (or value) this crate does not enforce; the
    /// request should be refused naming it (`keyword` at JSON pointer `at`).
    Unsupported {
        /// The keyword, e.g. `pattern`.
        keyword: String,
        /// JSON pointer of the schema that has it.
        at: String,
    },
    /// The schema or tool list is malformed.
    Invalid {
        /// What is wrong.
        what: String,
        /// JSON pointer of the place.
        at: String,
    },
    /// Text that should be JSON is not.
    Json(JsonError),
    /// The vocabulary lacks what the constraint needs (e.g. a `<tool_call>` token).
    Vocabulary(String),
}

impl fmt::Display for GrammarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrammarError::Unsupported { keyword, at } => write!(
                f,
                "JSON Schema keyword `{keyword}` (at {}) is not supported by constrained decoding; \
                 remove it or relax the schema",
                if at.is_empty() { "the root" } else { at }
            ),
            GrammarError::Invalid { what, at } => {
                write!(
                    f,
                    "invalid schema or tools at {}: {what}",
                    if at.is_empty() { "/" } else { at }
                )
            }
            GrammarError::Json(e) => write!(f, "{e}"),
            GrammarError::Vocabulary(m) => {
                write!(f, "the model's vocabulary cannot express this: {m}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for GrammarError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GrammarError::Json(e) => Some(e),
            _ => None,
        }
    }
}

impl From<JsonError> for GrammarError {
    fn from(e: JsonError) -> Self {
        GrammarError::Json(e)
    }
}
