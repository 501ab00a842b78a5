//! kore-grammar's tool calls input (`kore_grammar::fuzz::tool_calls`): see that module.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_grammar::fuzz::tool_calls(data));
