//! The appliance's command line: space-separated `key=value` words; unknown keys are errors
//! (a typo must not silently change the mode).

use alloc::string::String;
use alloc::vec::Vec;

/// Parsed command line.
#[derive(Debug, Default)]
pub struct Cmdline {
    /// `selftest=N`: generate N greedy tokens on the console, then exit.
    pub selftest: Option<usize>,
    /// `prompt_ids=1,2,3`: the self-test prompt.
    pub prompt_ids: Option<Vec<u32>>,
    /// `port=P`: the vsock port to serve on.
    pub port: Option<u32>,
    /// `kernels=NAME`, `kv=f32|f16`, `deltanet_chunked_min=N`: kore-engine's options.
    pub engine: kore_engine::EngineOptions,
    /// `bench=N`: run the benchmark with N decode steps, then exit.
    pub bench: Option<usize>,
    /// `bench_prompt=P`: the benchmark's prompt tokens.
    pub bench_prompt: Option<usize>,
    /// `bench_mib=M`: the read-bandwidth buffer in MiB.
    pub bench_mib: Option<usize>,
    /// `context=N`: the engine's context limit in tokens (never above the model's).
    pub context: Option<u32>,
    /// `kv_tokens=N`: KV positions the running sequences share (requests beyond wait).
    pub kv_tokens: Option<usize>,
    /// `sessions_mib=M`: the prefix cache's memory budget.
    pub sessions_mib: Option<usize>,
    /// `cache_pack=HEX`: the pack identity (64 hex digits) of the prefix cache's files; with
    /// it the appliance exchanges checkpoint files with the host on vsock port 1026.
    pub cache_pack: Option<[u8; 32]>,
}

impl Cmdline {
    /// Parses `raw`; the error names the offending word.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut c = Cmdline::default();
        for word in raw.split_ascii_whitespace() {
            let (k, v) =
                word.split_once('=').ok_or_else(|| alloc::format!("`{word}` is not key=value"))?;
            let bad = || alloc::format!("`{word}`: bad value");
            match k {
                "selftest" => c.selftest = Some(v.parse().map_err(|_| bad())?),
                "prompt_ids" => {
                    let ids: Result<Vec<u32>, _> = v.split(',').map(str::parse).collect();
                    let ids = ids.map_err(|_| bad())?;
                    if ids.is_empty() {
                        return Err(bad());
                    }
                    c.prompt_ids = Some(ids);
                }
                "port" => c.port = Some(v.parse().map_err(|_| bad())?),
                "kernels" => {
                    c.engine.kernels = Some(kore_engine::simd::Path::from_name(v).ok_or_else(bad)?)
                }
                "kv" => {
                    c.engine.kv = kore_engine::state::KvPrecision::from_name(v).ok_or_else(bad)?
                }
                "deltanet_chunked_min" => {
                    let n = v.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
                    c.engine.deltanet_chunked_min = Some(n);
                }
                "bench" => c.bench = Some(v.parse().map_err(|_| bad())?),
                "bench_prompt" => c.bench_prompt = Some(v.parse().map_err(|_| bad())?),
                "bench_mib" => c.bench_mib = Some(v.parse().map_err(|_| bad())?),
                "context" => c.context = Some(v.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?),
                "kv_tokens" => {
                    c.kv_tokens = Some(v.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?)
                }
                "sessions_mib" => c.sessions_mib = Some(v.parse().map_err(|_| bad())?),
                "cache_pack" => c.cache_pack = Some(hex32(v).ok_or_else(bad)?),
                _ => return Err(alloc::format!("unknown key `{k}`")),
            }
        }
        Ok(c)
    }
}

/// 64 hex digits as 32 bytes.
fn hex32(v: &str) -> Option<[u8; 32]> {
    let b = v.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks(2).enumerate() {
        let s = core::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}
