//! The engine's choices for a model, made by whoever runs it: the launcher
//! from its flags and environment, the Kore guest from its command line
//! (`Model::set_options`). The library itself reads no environment and keeps
//! no process-wide choice, so the host and the guest only differ where their
//! caller says so, and two models in one process (or two tests) may run
//! different kernels side by side.

use crate::simd;
use crate::state::KvPrecision;

/// What `Model::set_options` sets for a model's later forwards and states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineOptions {
    /// The SIMD kernel path; `None` = the fastest this CPU supports.
    pub kernels: Option<simd::Path>,
    /// The KV cache element type of new states (default f16).
    pub kv: KvPrecision,
    /// DeltaNet's chunked form for forwards of at least this many tokens;
    /// `None` = never (the default, see `Model::deltanet_chunked_min`).
    pub deltanet_chunked_min: Option<usize>,
}

impl EngineOptions {
    /// Checks that this CPU (or the XCR0 it was limited to) can run the
    /// kernel path, so a caller can refuse bad options before loading a model.
    pub fn check(&self) -> Result<(), simd::Unsupported> {
        match self.kernels {
            Some(p) if !p.supported() => Err(simd::Unsupported(p)),
            _ => Ok(()),
        }
    }

    /// The kernel path these options give: the chosen one, else the fastest
    /// this CPU supports ([`simd::best`]).
    pub fn path(&self) -> simd::Path {
        self.kernels.unwrap_or_else(simd::best)
    }

    /// The options' `key=value` words for the guest's command line (empty for
    /// the defaults), as the guest appliance parses them.
    pub fn cmdline_words(&self) -> alloc::string::String {
        use core::fmt::Write;
        let mut out = alloc::string::String::new();
        if let Some(p) = self.kernels {
            let _ = write!(out, " kernels={}", p.name());
        }
        if self.kv != KvPrecision::default() {
            let _ = write!(out, " kv={}", self.kv.name());
        }
        if let Some(n) = self.deltanet_chunked_min {
            let _ = write!(out, " deltanet_chunked_min={n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_add_nothing_to_the_guest_command_line() {
        assert_eq!(EngineOptions::default().cmdline_words(), "");
        let o = EngineOptions {
            kernels: Some(simd::Path::Generic),
            kv: KvPrecision::F32,
            deltanet_chunked_min: Some(64),
        };
        assert_eq!(o.cmdline_words(), " kernels=generic kv=f32 deltanet_chunked_min=64");
    }

    #[test]
    fn names_round_trip() {
        for kv in [KvPrecision::F32, KvPrecision::F16] {
            assert_eq!(KvPrecision::from_name(kv.name()), Some(kv));
        }
        assert_eq!(KvPrecision::from_name("bf16"), None);
    }
}
