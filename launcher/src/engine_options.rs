//! The engine options the launcher takes from its environment —
//! `KORE_KERNELS` (generic|avx2|avx512|avx512vnni|amx; amx natively only),
//! `KORE_KV` (f32|f16),
//! `KORE_DELTANET_CHUNKED_MIN` (a token count) — given to every native model
//! of this process and passed on the guest's command line, so that
//! `--native` and the appliance run the same way.

use std::sync::OnceLock;

use kore_engine::simd::Path as KernelPath;
use kore_engine::state::KvPrecision;
use kore_engine::EngineOptions;

use crate::error::LaunchError;

static OPTIONS: OnceLock<EngineOptions> = OnceLock::new();

/// Reads the environment, checks the options and keeps them for [`current`]
/// (every native model takes them: `model::ModelFiles::model`). A bad or
/// unsupported value is a usage error.
pub fn init() -> Result<(), LaunchError> {
    let opts = parse(crate::env::get).map_err(LaunchError::Usage)?;
    opts.check().map_err(|e| LaunchError::Usage(format!("KORE_KERNELS: {e}")))?;
    let _ = OPTIONS.set(opts);
    Ok(())
}

/// The options [`init`] applied (the defaults before it ran).
pub fn current() -> EngineOptions {
    OPTIONS.get().copied().unwrap_or_default()
}

/// The options from `var` (the environment); errors name the variable and the accepted values.
fn parse(var: impl Fn(&str) -> Option<String>) -> Result<EngineOptions, String> {
    let mut opts = EngineOptions::default();
    if let Some(v) = var("KORE_KERNELS") {
        let names: Vec<&str> = KernelPath::ALL.iter().map(|p| p.name()).collect();
        opts.kernels =
            Some(KernelPath::from_name(v.trim()).ok_or_else(|| {
                format!("KORE_KERNELS={v}: expected one of {}", names.join(", "))
            })?);
    }
    if let Some(v) = var("KORE_KV") {
        opts.kv = KvPrecision::from_name(v.trim())
            .ok_or_else(|| format!("KORE_KV={v}: expected f32 or f16"))?;
    }
    if let Some(v) = var("KORE_DELTANET_CHUNKED_MIN") {
        let n = v.trim().parse::<usize>().ok().filter(|&n| n > 0);
        opts.deltanet_chunked_min = Some(n.ok_or_else(|| {
            format!("KORE_DELTANET_CHUNKED_MIN={v}: expected a positive token count")
        })?);
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn reads_each_variable_and_defaults_without_them() {
        assert_eq!(parse(env(&[])).unwrap(), EngineOptions::default());
        let o = parse(env(&[
            ("KORE_KERNELS", "generic"),
            ("KORE_KV", "f16"),
            ("KORE_DELTANET_CHUNKED_MIN", "64"),
        ]))
        .unwrap();
        assert_eq!(o.kernels, Some(KernelPath::Generic));
        assert_eq!(o.kv, KvPrecision::F16);
        assert_eq!(o.deltanet_chunked_min, Some(64));
    }

    #[test]
    fn bad_values_name_the_variable_and_what_it_takes() {
        let e = parse(env(&[("KORE_KERNELS", "sse9")])).unwrap_err();
        assert!(e.contains("KORE_KERNELS=sse9") && e.contains("avx2"), "{e}");
        let e = parse(env(&[("KORE_KV", "bf16")])).unwrap_err();
        assert!(e.contains("f32 or f16"), "{e}");
        let e = parse(env(&[("KORE_DELTANET_CHUNKED_MIN", "0")])).unwrap_err();
        assert!(e.contains("positive"), "{e}");
    }
}
