//! Kore model packs: a directory with `pack.toml`, `weights.safetensors` and
//! `tokenizer.json`, verified and laid out for in-place use by the engine.
