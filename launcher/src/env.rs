//! Every environment variable kore-launch reads, in one place.
//!
//! [`VARS`] lists each with its audience (a user setting, an engine or
//! benchmark knob, a test hook) and what it does; docs/user-guide.md and
//! docs/developer.md document the same names (a test checks both ways). The
//! rest of the launcher asks this module, never `std::env` itself (a test
//! checks that too), so the environment's effect on a command is read here.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::LaunchError;

/// Who a variable is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// A setting people use (docs/user-guide.md).
    User,
    /// A test or debugging hook (docs/developer.md).
    Test,
    /// A standard variable of the system (`HOME`, the XDG base directories).
    System,
}

/// One variable the launcher reads.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    /// Its name.
    pub name: &'static str,
    /// Who sets it.
    pub audience: Audience,
}

const fn user(name: &'static str) -> Var {
    Var { name, audience: Audience::User }
}

const fn test(name: &'static str) -> Var {
    Var { name, audience: Audience::Test }
}

const fn system(name: &'static str) -> Var {
    Var { name, audience: Audience::System }
}

/// Every variable kore-launch reads.
pub const VARS: &[Var] = &[
    user("KORE_CONFIG"),
    user("KORE_MODEL"),
    user("KORE_PACK"),
    user("KORE_VCPUS"),
    user("KORE_MEMORY"),
    user("KORE_HUGEPAGE_SIZE"),
    user("KORE_VF"),
    user("KORE_CONTEXT"),
    user("KORE_GUEST_CPU"),
    user("KORE_RUNTIME_DIR"),
    user("KORE_API_KEY"),
    user("KORE_APPLIANCE"),
    user("KORE_KERNELS"),
    user("KORE_KV"),
    user("KORE_DELTANET_CHUNKED_MIN"),
    user("KORE_BOOT_TIMEOUT_S"),
    user("KORE_HANG_TIMEOUT_S"),
    user("KORE_GUEST_KERNEL"),
    user("KORE_GUEST_IMAGE"),
    user("KORE_CACHE_DIR"),
    user("KORE_CACHE"),
    user("KORE_CACHE_DISK"),
    user("KORE_NATIVE_WEIGHTS"),
    user("KORE_BENCH_PROMPT_TOKENS"),
    user("KORE_BENCH_DECODE_TOKENS"),
    user("KORE_BENCH_ROUNDS"),
    user("KORE_BENCH_DRAFT_VOCAB"),
    user("KORE_BENCH_DEPTH"),
    test("KORE_GUEST_CMDLINE_APPEND"),
    test("KORE_LAUNCH_FAKE"),
    test("KORE_LAUNCH_FAKE_DELAY_MS"),
    test("KORE_SYSROOT"),
    test("KORE_FUZZ_TRACE"),
    system("HOME"),
    system("XDG_CONFIG_HOME"),
    system("XDG_CACHE_HOME"),
    system("XDG_DATA_HOME"),
    system("XDG_RUNTIME_DIR"),
    system("SUDO_USER"),
];

/// The variable `name`, when set and not empty.
///
/// # Panics
/// In debug builds, when `name` is not in [`VARS`] (a new variable must be
/// listed, and documented).
pub fn get(name: &str) -> Option<String> {
    debug_assert!(known(name), "{name} is not in env::VARS");
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The path in `name`, when set and not empty.
pub fn path(name: &str) -> Option<PathBuf> {
    debug_assert!(known(name), "{name} is not in env::VARS");
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Logs (debug) each listed variable that is set, so a `-vv` run shows what
/// in its environment changed it; test hooks are flagged as such.
pub fn log_set() {
    for v in VARS.iter().filter(|v| v.audience != Audience::System) {
        if let Some(value) = get(v.name) {
            let shown = if v.name == "KORE_API_KEY" { "(set)" } else { value.as_str() };
            match v.audience {
                Audience::Test => tracing::debug!("environment: {}={shown} (a test hook)", v.name),
                _ => tracing::debug!("environment: {}={shown}", v.name),
            }
        }
    }
}

/// Whether `name` is one of [`VARS`].
pub fn known(name: &str) -> bool {
    VARS.iter().any(|v| v.name == name)
}

/// `name` as whole seconds above zero, else `default` (an unparsable value
/// is ignored with a warning).
pub fn seconds(name: &str, default: Duration) -> Duration {
    seconds_from(name, get(name), default)
}

fn seconds_from(name: &str, value: Option<String>, default: Duration) -> Duration {
    match value.map(|v| (v.trim().parse::<u64>(), v)) {
        None => default,
        Some((Ok(s), _)) if s > 0 => Duration::from_secs(s),
        Some((_, v)) => {
            tracing::warn!("{name}={v:?} is not a positive number of seconds; using {default:?}");
            default
        }
    }
}

/// `name` as a count above zero; `None` when unset. Any other value is a
/// usage error naming the variable.
pub fn count(name: &str) -> Result<Option<u32>, LaunchError> {
    count_from(name, get(name))
}

fn count_from(name: &str, value: Option<String>) -> Result<Option<u32>, LaunchError> {
    match value {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(LaunchError::Usage(format!("{name} must be a positive integer, got {v:?}"))),
        },
    }
}

/// The user who ran `sudo` (not root), for `setup`'s group change.
pub fn sudo_user() -> Option<String> {
    get("SUDO_USER").filter(|u| u != "root")
}

/// An absolute directory from a standard variable (`HOME`, `XDG_DATA_HOME`,
/// `XDG_CACHE_HOME`, `XDG_CONFIG_HOME`); relative values are ignored, as the
/// XDG base directory specification says.
pub fn base_dir(name: &str) -> Option<PathBuf> {
    path(name).filter(|p| p.is_absolute())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launcher's sources, as (path, text).
    fn sources() -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut dirs = vec![PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        assert!(out.len() > 20, "found only {} source files", out.len());
        out
    }

    #[test]
    fn only_this_module_reads_the_environment() {
        let readers: Vec<String> = sources()
            .into_iter()
            .filter(|(p, _)| !p.ends_with("/src/env.rs"))
            .filter(|(_, text)| text.contains("env::var"))
            .map(|(p, _)| p)
            .collect();
        assert!(readers.is_empty(), "read the environment through crate::env: {readers:?}");
    }

    #[test]
    fn every_kore_name_in_the_sources_is_listed() {
        let mut missing = Vec::new();
        for (path, text) in sources() {
            for (i, _) in text.match_indices("KORE_") {
                let name: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.ends_with('_') && !known(&name) && !missing.contains(&name) {
                    missing.push(format!("{name} ({path})"));
                }
            }
        }
        assert!(missing.is_empty(), "add to env::VARS and document: {missing:?}");
    }

    #[test]
    fn each_variable_is_documented_where_its_audience_reads() {
        let doc = |name: &str| {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/").to_string() + name;
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let (guide, developer) = (doc("user-guide.md"), doc("developer.md"));
        for v in VARS {
            let page = match v.audience {
                Audience::User => &guide,
                Audience::Test => &developer,
                Audience::System => continue,
            };
            assert!(page.contains(&format!("`{}`", v.name)), "{} is not documented", v.name);
        }
    }

    #[test]
    fn counts_and_seconds_parse_or_refuse() {
        let d = Duration::from_secs(7);
        let s = |v: &str| seconds_from("X", Some(v.into()), d).as_secs();
        assert_eq!((s("30"), s(" 5 "), s("0"), s("soon")), (30, 5, 7, 7));
        assert_eq!(seconds_from("X", None, d), d);
        let c = |v: &str| count_from("KORE_BENCH_ROUNDS", Some(v.into()));
        assert_eq!(c("3").unwrap(), Some(3));
        assert_eq!(count_from("X", None).unwrap(), None);
        for bad in ["0", "-1", "many"] {
            let e = c(bad).unwrap_err().to_string();
            assert!(e.contains("KORE_BENCH_ROUNDS") && e.contains(bad), "{e}");
        }
    }
}
