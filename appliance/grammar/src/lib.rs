//! Constrained decoding for Kore, `no_std + alloc` (it runs in the guest).
//!
//! - [`json`]: an order-keeping JSON value with Python-exact printing (what chat
//!   templates and schemas need).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
extern crate alloc;

mod error;
mod frame;
#[doc(hidden)]
pub mod fuzz;
mod grammar;
pub mod json;
mod matcher;
pub mod parse;
mod schema;
pub mod tools;
mod trie;
mod vocab;

pub use error::GrammarError;
pub use frame::Special;
pub use grammar::{Grammar, Options, DEFAULT_MAX_WS};
pub use matcher::{mask_allows, Matcher, Rejected};
pub use parse::{parse_tool_calls, Event, ParseError, ToolCall, ToolCallParser};
pub use tools::{Tool, ToolChoice, ToolSet};
pub use vocab::Vocab;
