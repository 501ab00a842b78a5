//! launch.toml, environment variables and flags: precedence, paths, errors.

#[allow(dead_code)]
#[path = "../src/config.rs"]
mod config;
#[allow(dead_code, unused_imports)]
#[path = "../src/host/mod.rs"]
mod host;

/// The launcher's environment seam (`launcher/src/env.rs`), as config.rs uses it.
mod env {
    pub fn get(name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

use config::{load, locate, parse, parse_size, resolve, ConfigError, Loaded, Overrides};
use host::HugepageSize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const GIB: u64 = 1 << 30;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> =
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| map.get(k).cloned()
}

fn loaded(text: &str) -> Loaded {
    let path = PathBuf::from("/home/u/.config/kore/launch.toml");
    Loaded {
        file: parse(&path, text).unwrap(),
        path: Some(path),
        guest_cpu_flag: None,
        vf_flag: None,
    }
}

const FULL: &str = r#"
pack = "packs/qwen9b"
vcpus = 6
memory = "12G"
hugepage_size = "1G"
vf = "03:00.1"
context = 32768
runtime_dir = "~/run/kore"
"#;

#[test]
fn defaults_without_file_env_or_flags() {
    let s = resolve(
        &Loaded::default(),
        &env(&[("XDG_RUNTIME_DIR", "/run/user/7")]),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(s.model, Path::new("model-packs/tiny"));
    assert!(s.model_is_default);
    assert!(s.vcpus >= 1);
    assert_eq!(
        (s.memory, s.hugepage_size, s.vf.clone(), s.context),
        (None, HugepageSize::M2, None, 65536)
    );
    assert_eq!(s.runtime_dir, Path::new("/run/user/7/kore"));
    assert_eq!(s.config_file, None);
}

#[test]
fn the_file_sets_every_key_with_paths_relative_to_it() {
    let s = resolve(&loaded(FULL), &env(&[("HOME", "/home/u")]), &Overrides::default()).unwrap();
    assert_eq!(s.model, Path::new("/home/u/.config/kore/packs/qwen9b"));
    assert!(!s.model_is_default);
    assert_eq!(s.vcpus, 6);
    assert_eq!(s.memory, Some(12 * GIB));
    assert_eq!(s.hugepage_size, HugepageSize::G1);
    assert_eq!(s.vf.as_deref(), Some("0000:03:00.1"));
    assert_eq!(s.context, 32768);
    assert_eq!(s.runtime_dir, Path::new("/home/u/run/kore"));
    assert_eq!(s.config_file.as_deref(), Some(Path::new("/home/u/.config/kore/launch.toml")));
    // `model` is accepted for `pack`.
    let s = resolve(&loaded("model = \"/abs/pack\""), &env(&[]), &Overrides::default()).unwrap();
    assert_eq!(s.model, Path::new("/abs/pack"));
}

#[test]
fn environment_beats_file_and_flags_beat_both() {
    let e = env(&[
        ("KORE_MODEL", "/env/pack"),
        ("KORE_VCPUS", "3"),
        ("KORE_MEMORY", "4G"),
        ("KORE_HUGEPAGE_SIZE", "off"),
        ("KORE_VF", "0000:04:00.2"),
        ("KORE_CONTEXT", "4096"),
        ("KORE_RUNTIME_DIR", "/env/run"),
    ]);
    let s = resolve(&loaded(FULL), &e, &Overrides::default()).unwrap();
    assert_eq!(s.model, Path::new("/env/pack"));
    assert_eq!(
        (s.vcpus, s.memory, s.hugepage_size, s.context),
        (3, Some(4 * GIB), HugepageSize::Off, 4096)
    );
    assert_eq!(s.vf.as_deref(), Some("0000:04:00.2"));
    assert_eq!(s.runtime_dir, Path::new("/env/run"));

    let flags = Overrides {
        model: Some("/flag/pack".into()),
        vcpus: Some(2),
        memory: Some(GIB),
        hugepage_size: Some(HugepageSize::M2),
        vf: Some("05:00.3".into()),
        context: Some(512),
        runtime_dir: Some("/flag/run".into()),
        guest_cpu: None,
    };
    let s = resolve(&loaded(FULL), &e, &flags).unwrap();
    assert_eq!(s.model, Path::new("/flag/pack"));
    assert_eq!(
        (s.vcpus, s.memory, s.hugepage_size, s.context),
        (2, Some(GIB), HugepageSize::M2, 512)
    );
    assert_eq!(s.vf.as_deref(), Some("0000:05:00.3"));
    assert_eq!(s.runtime_dir, Path::new("/flag/run"));

    // KORE_PACK is an alias of KORE_MODEL; empty variables count as unset.
    let s = resolve(&loaded(FULL), &env(&[("KORE_PACK", "/p")]), &Overrides::default()).unwrap();
    assert_eq!(s.model, Path::new("/p"));
}

fn file_error(text: &str) -> String {
    let err = parse(Path::new("/cfg/launch.toml"), text)
        .map(|file| Loaded {
            file,
            path: Some("/cfg/launch.toml".into()),
            guest_cpu_flag: None,
            vf_flag: None,
        })
        .and_then(|l| resolve(&l, &env(&[]), &Overrides::default()).map(|_| ()))
        .unwrap_err();
    assert!(matches!(err, ConfigError::File { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("config file /cfg/launch.toml: "), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
    msg
}

#[test]
fn bad_files_name_the_file_line_and_key() {
    let msg = file_error("vcpus = 4\ngpus = 2\n");
    assert!(msg.contains("line 2, key `gpus`") && msg.contains("unknown field"), "{msg}");
    let msg = file_error("context = \"long\"\n");
    assert!(msg.contains("key `context`"), "{msg}");
    let msg = file_error("hugepage_size = \"3M\"\n");
    assert!(msg.contains("key `hugepage_size`") && msg.contains("2M, 1G or off"), "{msg}");
    let msg = file_error("memory = 8192\n");
    assert!(msg.contains("key `memory`") && msg.contains("\"8G\""), "{msg}");
    let msg = file_error("vcpus = 0\n");
    assert!(msg.contains("key `vcpus`") && msg.contains("1 to 1024"), "{msg}");
    let msg = file_error("vf = \"gpu0\"\n");
    assert!(msg.contains("key `vf`") && msg.contains("DDDD:BB:DD.F"), "{msg}");
    let msg = file_error("vcpus = \n");
    assert!(msg.contains("line 1"), "{msg}");
}

#[test]
fn bad_environment_values_name_the_variable() {
    for (var, value, says) in [
        ("KORE_VCPUS", "many", "1 to 1024"),
        ("KORE_MEMORY", "lots", "8G"),
        ("KORE_HUGEPAGE_SIZE", "4k", "2M, 1G or off"),
        ("KORE_VF", "x", "PCI address"),
        ("KORE_CONTEXT", "0", "at least 1"),
    ] {
        let err =
            resolve(&Loaded::default(), &env(&[(var, value)]), &Overrides::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("environment variable {var}=")) && msg.contains(says),
            "{msg}"
        );
    }
    let err =
        resolve(&Loaded::default(), &env(&[]), &Overrides { vcpus: Some(0), ..Default::default() })
            .unwrap_err();
    assert!(err.to_string().starts_with("--vcpus:"), "{err}");
}

#[test]
fn the_file_is_found_by_flag_env_xdg_or_home() {
    let none = env(&[]);
    assert_eq!(locate(None, &none), None);
    let home = env(&[("HOME", "/home/u")]);
    assert_eq!(
        locate(None, &home),
        Some((PathBuf::from("/home/u/.config/kore/launch.toml"), false))
    );
    let xdg = env(&[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/xdg")]);
    assert_eq!(locate(None, &xdg), Some((PathBuf::from("/xdg/kore/launch.toml"), false)));
    // A relative XDG_CONFIG_HOME is invalid per the spec and ignored.
    let rel = env(&[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "rel")]);
    assert_eq!(locate(None, &rel).unwrap().0, PathBuf::from("/home/u/.config/kore/launch.toml"));
    let named = env(&[("HOME", "/home/u"), ("KORE_CONFIG", "/etc/kore.toml")]);
    assert_eq!(locate(None, &named), Some((PathBuf::from("/etc/kore.toml"), true)));
    assert_eq!(locate(Some(Path::new("/x.toml")), &named), Some((PathBuf::from("/x.toml"), true)));
}

#[test]
fn loading_reads_the_xdg_file_and_requires_named_ones() {
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().to_str().unwrap().to_string();
    let e = env(&[("XDG_CONFIG_HOME", &xdg)]);
    assert_eq!(load(None, &e).unwrap(), Loaded::default());
    std::fs::create_dir_all(dir.path().join("kore")).unwrap();
    let file = dir.path().join("kore/launch.toml");
    std::fs::write(&file, "vcpus = 5\n").unwrap();
    let l = load(None, &e).unwrap();
    assert_eq!(l.path.as_deref(), Some(file.as_path()));
    assert_eq!(resolve(&l, &e, &Overrides::default()).unwrap().vcpus, 5);
    let err = load(Some(&dir.path().join("missing.toml")), &e).unwrap_err();
    assert!(
        matches!(err, ConfigError::Read { .. }) && err.to_string().contains("missing.toml"),
        "{err}"
    );
}

#[test]
fn sizes_parse_with_binary_units() {
    assert_eq!(parse_size("8G"), Ok(8 * GIB));
    assert_eq!(parse_size("8GiB"), Ok(8 * GIB));
    assert_eq!(parse_size(" 512m "), Ok(512 << 20));
    assert_eq!(parse_size("1T"), Ok(1 << 40));
    assert_eq!(parse_size("65536K"), Ok(64 << 20));
    assert_eq!(parse_size("2 GB"), Ok(2 * GIB));
    for bad in ["", "8", "G", "1.5G", "-1G", "0G", "8X", "99999999999T"] {
        assert!(parse_size(bad).is_err(), "{bad}");
    }
}

#[test]
fn guest_cpu_comes_from_file_env_then_flag() {
    use kore_vmm::GuestCpu;
    let none = env(&[]);
    let s = resolve(&loaded(""), &none, &Overrides::default()).unwrap();
    assert_eq!(s.guest_cpu, GuestCpu::Host);
    let file = loaded("guest_cpu = \"x86-64-v3\"\n");
    assert_eq!(resolve(&file, &none, &Overrides::default()).unwrap().guest_cpu, GuestCpu::X86_64V3);
    let e = env(&[("KORE_GUEST_CPU", "x86-64-v2")]);
    assert_eq!(resolve(&file, &e, &Overrides::default()).unwrap().guest_cpu, GuestCpu::X86_64V2);
    let flag = Overrides { guest_cpu: Some(GuestCpu::Host), ..Overrides::default() };
    assert_eq!(resolve(&file, &e, &flag).unwrap().guest_cpu, GuestCpu::Host);
    // The global flag counts as a flag.
    let global = Loaded { guest_cpu_flag: Some(GuestCpu::X86_64V3), ..loaded("") };
    assert_eq!(resolve(&global, &e, &Overrides::default()).unwrap().guest_cpu, GuestCpu::X86_64V3);
    let err = resolve(&loaded("guest_cpu = \"v4\"\n"), &none, &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("key `guest_cpu`"), "{err}");
    let err =
        resolve(&file, &env(&[("KORE_GUEST_CPU", "zen")]), &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("KORE_GUEST_CPU"), "{err}");
}

#[test]
fn the_global_vf_flag_beats_file_and_env() {
    let global = Loaded { vf_flag: Some("06:00.4".into()), ..loaded(FULL) };
    let s = resolve(&global, &env(&[("KORE_VF", "04:00.2")]), &Overrides::default()).unwrap();
    assert_eq!(s.vf.as_deref(), Some("0000:06:00.4"), "normalised, flag first");
    let bad = Loaded { vf_flag: Some("gpu0".into()), ..loaded("") };
    let err = resolve(&bad, &env(&[]), &Overrides::default()).unwrap_err();
    assert!(matches!(err, ConfigError::Flag { flag: "vf", .. }), "{err:?}");
}

#[test]
fn prefix_cache_budgets_from_file_and_env() {
    let none = env(&[]);
    let s = resolve(&loaded(""), &none, &Overrides::default()).unwrap();
    assert_eq!((s.cache, s.cache_disk), (config::DEFAULT_CACHE, config::DEFAULT_CACHE_DISK));
    let file = loaded("cache = \"256M\"\ncache_disk = \"0\"\n");
    let s = resolve(&file, &none, &Overrides::default()).unwrap();
    assert_eq!((s.cache, s.cache_disk), (256 << 20, 0));
    let e = env(&[("KORE_CACHE", "0"), ("KORE_CACHE_DISK", "2G")]);
    let s = resolve(&file, &e, &Overrides::default()).unwrap();
    assert_eq!((s.cache, s.cache_disk), (0, 2 * GIB), "the environment beats the file");
    let err = resolve(&loaded("cache = \"lots\"\n"), &none, &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("key `cache`"), "{err}");
    let err =
        resolve(&file, &env(&[("KORE_CACHE_DISK", "8Q")]), &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("KORE_CACHE_DISK"), "{err}");
}
