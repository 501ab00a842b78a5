//! The launcher's settings: built-in defaults, then the config file
//! (`$XDG_CONFIG_HOME/kore/launch.toml`, else `~/.config/kore/launch.toml`,
//! or the file named by `--config` / `KORE_CONFIG`), then environment
//! variables (`KORE_MODEL`, `KORE_VCPUS`, ...), then command-line flags.
//!
//! Commands call [`effective`] with the flags they were given and get the
//! resolved [`Settings`]. A bad file fails with the file, line and key named;
//! unknown keys are rejected.

use crate::host::pci::normalize_addr;
use crate::host::HugepageSize;
use kore_vmm::cpu_level::UnknownGuestCpu;
use kore_vmm::GuestCpu;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The pack used when nothing names one.
pub const DEFAULT_MODEL: &str = "model-packs/tiny";
/// Context length used when nothing sets one.
pub const DEFAULT_CONTEXT: u64 = 65536;
/// Most vCPUs accepted.
pub const MAX_VCPUS: u32 = 1024;
/// The prefix cache's memory budget when nothing sets one (the engine's default).
pub const DEFAULT_CACHE: u64 = 512 << 20;
/// The prefix cache's disk budget when nothing sets one.
pub const DEFAULT_CACHE_DISK: u64 = 8 << 30;

/// A config error, naming where the bad value came from and what to write.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has a bad or unknown key.
    #[error("config file {path}: {place}{message}")]
    File {
        /// The file.
        path: PathBuf,
        /// "line N, key `k`: " when known.
        place: String,
        /// What is wrong and what to write instead.
        message: String,
    },
    /// An environment variable holds a bad value.
    #[error("environment variable {var}={value:?}: {message}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// A command-line value is bad.
    #[error("--{flag}: {message}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The keys of `launch.toml`, as written (validated by [`resolve`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Pack or Hugging Face model directory (`model` is accepted too).
    #[serde(alias = "model")]
    pub pack: Option<PathBuf>,
    /// vCPUs of the appliance VM.
    pub vcpus: Option<toml::Value>,
    /// Guest memory, e.g. "8G" (default: what the pack and context need).
    pub memory: Option<toml::Value>,
    /// "2M", "1G" or "off".
    pub hugepage_size: Option<String>,
    /// PCI address of the GPU VF to pass through.
    pub vf: Option<String>,
    /// Context length in tokens.
    pub context: Option<toml::Value>,
    /// Where the pidfile and sockets of `kore-launch up` live.
    pub runtime_dir: Option<PathBuf>,
    /// The CPU the guest sees: "host", "x86-64-v3" or "x86-64-v2".
    pub guest_cpu: Option<String>,
    /// System prompt of `kore-launch chat` when `--system` is not given.
    pub system_prompt: Option<String>,
    /// The prefix cache's memory budget, e.g. "512M" ("0" turns the cache off).
    pub cache: Option<String>,
    /// The prefix cache's disk budget, e.g. "8G" ("0" keeps nothing on disk).
    pub cache_disk: Option<String>,
}

/// Settings given on the command line (each `None` when the flag is absent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `--model`.
    pub model: Option<PathBuf>,
    /// `--vcpus`.
    pub vcpus: Option<u32>,
    /// `--memory` in bytes.
    pub memory: Option<u64>,
    /// `--hugepage-size`.
    pub hugepage_size: Option<HugepageSize>,
    /// `--vf`.
    pub vf: Option<String>,
    /// `--context`.
    pub context: Option<u64>,
    /// `--runtime-dir`.
    pub runtime_dir: Option<PathBuf>,
    /// `--guest-cpu` (a global flag: [`Loaded::guest_cpu_flag`] fills it when unset).
    pub guest_cpu: Option<GuestCpu>,
}

/// The effective settings after defaults, file, environment and flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Pack or model directory.
    pub model: PathBuf,
    /// True when nothing named a model (the default pack is used).
    pub model_is_default: bool,
    /// vCPUs of the appliance VM.
    pub vcpus: u32,
    /// Guest memory in bytes; `None` = what the pack and context need.
    pub memory: Option<u64>,
    /// Hugepage size backing guest memory.
    pub hugepage_size: HugepageSize,
    /// GPU VF to pass through (normalised PCI address).
    pub vf: Option<String>,
    /// Context length in tokens.
    pub context: u64,
    /// Runtime directory for `up`/`down`/`status`.
    pub runtime_dir: PathBuf,
    /// The CPU level the VMM presents to the guest.
    pub guest_cpu: GuestCpu,
    /// The config file read, if any.
    pub config_file: Option<PathBuf>,
    /// The prefix cache's memory budget in bytes (0: off).
    pub cache: u64,
    /// The prefix cache's disk budget in bytes (0: no disk tier).
    pub cache_disk: u64,
}

/// A config file as loaded: where it came from and what it said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// The file, when one was read.
    pub path: Option<PathBuf>,
    /// Its contents (all `None` without a file).
    pub file: FileConfig,
    /// The global `--guest-cpu` flag, when given.
    pub guest_cpu_flag: Option<GuestCpu>,
    /// The global `--vf` flag, when given (as typed).
    pub vf_flag: Option<String>,
}

static LOADED: OnceLock<Loaded> = OnceLock::new();

/// Loads the config file once for this process (`explicit` is `--config`)
/// and keeps the global `--guest-cpu` flag. Called by `main`; later calls
/// keep the first result.
pub fn init(
    explicit: Option<&Path>,
    guest_cpu_flag: Option<GuestCpu>,
    vf_flag: Option<String>,
) -> Result<&'static Loaded, ConfigError> {
    if let Some(loaded) = LOADED.get() {
        return Ok(loaded);
    }
    let loaded = Loaded { guest_cpu_flag, vf_flag, ..load(explicit, &env_var)? };
    Ok(LOADED.get_or_init(|| loaded))
}

/// The global `--guest-cpu` flag of this process, if given (for `up`, which
/// hands it on to its daemon).
pub fn guest_cpu_flag() -> Option<GuestCpu> {
    LOADED.get().and_then(|l| l.guest_cpu_flag)
}

/// The global `--vf` flag of this process, if given (for `up` and `setup`).
pub fn vf_flag() -> Option<String> {
    LOADED.get().and_then(|l| l.vf_flag.clone())
}

/// The effective settings for a command, given its flags.
pub fn effective(flags: &Overrides) -> Result<Settings, ConfigError> {
    let loaded = init(None, None, None)?;
    resolve(loaded, &env_var, flags)
}

fn env_var(name: &str) -> Option<String> {
    crate::env::get(name)
}

/// Where the config file is, and whether it must exist (named explicitly).
pub fn locate(
    explicit: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<(PathBuf, bool)> {
    if let Some(path) = explicit {
        return Some((path.to_path_buf(), true));
    }
    if let Some(path) = env("KORE_CONFIG") {
        return Some((PathBuf::from(path), true));
    }
    let base = env("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| env("HOME").map(|home| Path::new(&home).join(".config")))?;
    Some((base.join("kore").join("launch.toml"), false))
}

/// Finds and parses the config file.
pub fn load(
    explicit: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let Some((path, required)) = locate(explicit, env) else {
        return Ok(Loaded::default());
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok(Loaded::default())
        }
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let file = parse(&path, &text)?;
    tracing::debug!(path = %path.display(), "config file loaded");
    Ok(Loaded { path: Some(path), file, guest_cpu_flag: None, vf_flag: None })
}

/// Parses config text; errors name the line and key.
pub fn parse(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let place = e.span().map(|span| place_of(text, span.start)).unwrap_or_default();
        ConfigError::File { path: path.to_path_buf(), place, message: one_line(e.message()) }
    })
}

/// Joins a multi-line message into one line.
fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// "line N, key `k`: " for a byte offset into the text.
fn place_of(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let line_no = text[..offset].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    match line.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() => {
            format!("line {line_no}, key `{}`: ", key.trim())
        }
        _ => format!("line {line_no}: "),
    }
}

/// Combines defaults, the loaded file, the environment and the flags.
pub fn resolve(
    loaded: &Loaded,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &Overrides,
) -> Result<Settings, ConfigError> {
    let file = &loaded.file;
    let file_dir = loaded.path.as_deref().and_then(Path::parent).unwrap_or(Path::new("."));
    let home = env("HOME");
    let in_file = |p: &Path| file_path(p, file_dir, home.as_deref());
    let bad_key = |key: &str, message: String| ConfigError::File {
        path: loaded.path.clone().unwrap_or_default(),
        place: format!("key `{key}`: "),
        message,
    };

    let env_model = env("KORE_MODEL").or_else(|| env("KORE_PACK")).map(PathBuf::from);
    let model = flags.model.clone().or(env_model).or_else(|| file.pack.as_deref().map(in_file));
    let model_is_default = model.is_none();

    let mut vcpus = default_vcpus();
    if let Some(v) = &file.vcpus {
        vcpus = v
            .as_integer()
            .and_then(|n| check_vcpus(n).ok())
            .ok_or_else(|| bad_key("vcpus", vcpus_msg()))?;
    }
    if let Some(v) = env("KORE_VCPUS") {
        vcpus = v
            .trim()
            .parse::<i64>()
            .ok()
            .and_then(|n| check_vcpus(n).ok())
            .ok_or(ConfigError::Env { var: "KORE_VCPUS", value: v, message: vcpus_msg() })?;
    }
    if let Some(v) = flags.vcpus {
        vcpus = check_vcpus(v.into())
            .map_err(|message| ConfigError::Flag { flag: "vcpus", message })?;
    }

    let mut memory = match &file.memory {
        Some(toml::Value::String(s)) => Some(parse_size(s).map_err(|m| bad_key("memory", m))?),
        Some(_) => {
            return Err(bad_key(
                "memory",
                "write the size as a string with a unit, e.g. memory = \"8G\"".into(),
            ))
        }
        None => None,
    };
    if let Some(v) = env("KORE_MEMORY") {
        memory = Some(parse_size(&v).map_err(|message| ConfigError::Env {
            var: "KORE_MEMORY",
            value: v,
            message,
        })?);
    }
    memory = flags.memory.or(memory);

    let mut hugepage_size = HugepageSize::default();
    if let Some(s) = &file.hugepage_size {
        hugepage_size = s.parse().map_err(|m| bad_key("hugepage_size", m))?;
    }
    if let Some(v) = env("KORE_HUGEPAGE_SIZE") {
        hugepage_size = v.parse().map_err(|message| ConfigError::Env {
            var: "KORE_HUGEPAGE_SIZE",
            value: v,
            message,
        })?;
    }
    hugepage_size = flags.hugepage_size.unwrap_or(hugepage_size);

    let mut vf = match &file.vf {
        Some(s) => Some(normalize_addr(s).map_err(|e| bad_key("vf", e.to_string()))?),
        None => None,
    };
    if let Some(v) = env("KORE_VF") {
        vf = Some(normalize_addr(&v).map_err(|e| ConfigError::Env {
            var: "KORE_VF",
            value: v.clone(),
            message: e.to_string(),
        })?);
    }
    if let Some(v) = flags.vf.as_ref().or(loaded.vf_flag.as_ref()) {
        vf = Some(
            normalize_addr(v)
                .map_err(|e| ConfigError::Flag { flag: "vf", message: e.to_string() })?,
        );
    }

    let mut context = DEFAULT_CONTEXT;
    if let Some(v) = &file.context {
        context =
            v.as_integer().filter(|&n| n >= 1).ok_or_else(|| bad_key("context", context_msg()))?
                as u64;
    }
    if let Some(v) = env("KORE_CONTEXT") {
        context = v.trim().parse::<u64>().ok().filter(|&n| n >= 1).ok_or(ConfigError::Env {
            var: "KORE_CONTEXT",
            value: v,
            message: context_msg(),
        })?;
    }
    if let Some(v) = flags.context {
        context = Some(v)
            .filter(|&n| n >= 1)
            .ok_or(ConfigError::Flag { flag: "context", message: context_msg() })?;
    }

    let runtime_dir = flags
        .runtime_dir
        .clone()
        .or_else(|| env("KORE_RUNTIME_DIR").map(PathBuf::from))
        .or_else(|| file.runtime_dir.as_deref().map(in_file))
        .unwrap_or_else(|| default_runtime_dir(env));

    let mut guest_cpu = GuestCpu::Host;
    if let Some(s) = &file.guest_cpu {
        guest_cpu = s.parse().map_err(|e: UnknownGuestCpu| bad_key("guest_cpu", e.to_string()))?;
    }
    if let Some(v) = env("KORE_GUEST_CPU") {
        guest_cpu = v.parse().map_err(|e: UnknownGuestCpu| ConfigError::Env {
            var: "KORE_GUEST_CPU",
            value: v.clone(),
            message: e.to_string(),
        })?;
    }
    guest_cpu = flags.guest_cpu.or(loaded.guest_cpu_flag).unwrap_or(guest_cpu);

    Ok(Settings {
        model: model.unwrap_or_else(|| PathBuf::from(DEFAULT_MODEL)),
        model_is_default,
        vcpus,
        memory,
        hugepage_size,
        vf,
        context,
        runtime_dir,
        guest_cpu,
        config_file: loaded.path.clone(),
        cache: cache_size(file.cache.as_deref(), env, ("cache", "KORE_CACHE"), DEFAULT_CACHE)
            .map_err(|e| e.unwrap_or_else(|m| bad_key("cache", m)))?,
        cache_disk: cache_size(
            file.cache_disk.as_deref(),
            env,
            ("cache_disk", "KORE_CACHE_DISK"),
            DEFAULT_CACHE_DISK,
        )
        .map_err(|e| e.unwrap_or_else(|m| bad_key("cache_disk", m)))?,
    })
}

static CACHE_FLAGS: OnceLock<(Option<u64>, Option<u64>)> = OnceLock::new();

/// Keeps the global `--cache` and `--cache-disk` flags (called by `main`).
pub fn set_cache_flags(cache: Option<u64>, cache_disk: Option<u64>) {
    let _ = CACHE_FLAGS.set((cache, cache_disk));
}

/// The global `--cache` and `--cache-disk` flags, if given (for `up`,
/// which hands them on to its daemon).
pub fn cache_flags() -> (Option<u64>, Option<u64>) {
    CACHE_FLAGS.get().copied().unwrap_or_default()
}

/// A prefix-cache budget: the global flag, else the environment, else the
/// file's key, else `default`; "0" is allowed (off). A bad value is the
/// environment's error, or (`Err(Err(message))`) the file key's message.
fn cache_size(
    file: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    (key, var): (&'static str, &'static str),
    default: u64,
) -> Result<u64, Result<ConfigError, String>> {
    let flags = cache_flags();
    if let Some(v) = if key == "cache" { flags.0 } else { flags.1 } {
        return Ok(v);
    }
    if let Some(v) = env(var) {
        return parse_budget(&v).map_err(|message| Ok(ConfigError::Env { var, value: v, message }));
    }
    file.map_or(Ok(default), |s| parse_budget(s).map_err(Err))
}

fn vcpus_msg() -> String {
    format!("vCPUs must be a whole number from 1 to {MAX_VCPUS}")
}

fn context_msg() -> String {
    "the context length must be a whole number of tokens, at least 1 (e.g. 65536)".to_string()
}

fn check_vcpus(n: i64) -> Result<u32, String> {
    u32::try_from(n).ok().filter(|&n| (1..=MAX_VCPUS).contains(&n)).ok_or_else(vcpus_msg)
}

fn default_vcpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_VCPUS as usize) as u32)
}

/// `$XDG_RUNTIME_DIR/kore`, else `/tmp/kore-$UID`.
fn default_runtime_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    match env("XDG_RUNTIME_DIR") {
        Some(dir) => Path::new(&dir).join("kore"),
        None => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/kore-{uid}"))
        }
    }
}

/// A path from the config file: `~/` is the home directory; relative paths
/// are relative to the file's directory.
fn file_path(p: &Path, file_dir: &Path, home: Option<&str>) -> PathBuf {
    if let (Ok(rest), Some(home)) = (p.strip_prefix("~"), home) {
        return Path::new(home).join(rest);
    }
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        file_dir.join(p)
    }
}

/// A prefix-cache budget: a size with a unit (`512M`), a plain number of
/// bytes, or `0` (off).
pub fn parse_budget(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(bytes) => Ok(bytes),
        Err(_) => parse_size(text),
    }
}

/// Parses a memory size with a binary unit: "8G", "8GiB", "512M", "1T", "65536K".
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("`{text}` is not a memory size: write a whole number with a unit, e.g. 8G or 512M")
    };
    let t = text.trim().to_ascii_lowercase();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit.trim().trim_end_matches("ib").trim_end_matches('b') {
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(1u64 << shift).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(bad());
    }
    Ok(bytes)
}
