//! Byte-level BPE tokenizer (Hugging Face `tokenizer.json`) and the Qwen3.5
//! chat template, `no_std + alloc` so the guest appliance can use it.
#![cfg_attr(not(feature = "std"), no_std)]
extern crate alloc;
