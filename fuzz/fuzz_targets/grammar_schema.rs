//! kore-grammar's schema input (`kore_grammar::fuzz::schema`): see that module.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kore_grammar::fuzz::schema(data));
