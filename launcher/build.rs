//! Builds what kore-launch carries with it and embeds it (src/bundle.rs says how it is
//! used): the VMM process binary `kore-vmm` (package kore-vmm-process, `vmm/process`), the
//! two guest images (guest-kernel/build.sh) and the default pack (`model-packs/tiny`).
//!
//! Cargo cannot build another package's binary, or another workspace, for a dependent on
//! stable Rust, so this script runs nested builds into their own target directories
//! (`<target>/vmm-process`, and `<target>/guest` as scripts/test.sh uses it): a different
//! directory has a different lock, so a nested build never waits on the build that runs this
//! script, and a build of the source tree finds the outputs there at run time without
//! extracting anything. The guest build adds the Rust target x86_64-unknown-none through
//! rustup when it is missing (as it always has). The nested builds share this build's job slots (Cargo's jobserver) and get
//! none of the flags Cargo hands to build scripts. The files are copied into OUT_DIR and
//! their sha256 digests computed, so what is embedded is what was hashed.
//!
//! A fuzzing build (`cfg(fuzzing)`, cargo-fuzz) embeds nothing: it never boots a VM.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// What the nested builds read, relative to the repository root: a change reruns this script
/// (the nested Cargo then decides what to rebuild).
/// The guest links the appliance's crates, so they are watched too.
const WATCH: &[&str] = &[
    "vmm",
    "guest-kernel",
    "appliance",
    "model-packs/format",
    "model-packs/tiny",
    "Cargo.toml",
    "Cargo.lock",
];

/// The default pack's files that are embedded (what its pack.toml names, and the manifest).
const PACK_FILES: &[&str] = &["pack.toml", "tokenizer.json", "weights.safetensors"];

/// One file to embed: where it goes in the bundle, where it was built, its Unix mode.
struct Item {
    rel: String,
    src: PathBuf,
    mode: u32,
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by Cargo"));
    let root = manifest.parent().expect("launcher/ has a parent").to_path_buf();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by Cargo"));
    println!("cargo:rerun-if-changed=build.rs");
    for p in WATCH {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let items = if env::var_os("CARGO_CFG_FUZZING").is_some() {
        Vec::new()
    } else {
        let target = target_dir(&root);
        let mut items = vec![vmm_binary(&root, &target)];
        items.extend(guest_images(&root, &target));
        items.extend(PACK_FILES.iter().map(|f| Item {
            rel: format!("packs/tiny/{f}"),
            src: root.join("model-packs/tiny").join(f),
            mode: 0o644,
        }));
        items
    };
    write_bundle(&out, &items);
}

/// The target directory of this build as the source tree sees it: `CARGO_TARGET_DIR` when
/// absolute, else `<root>/target`.
fn target_dir(root: &Path) -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => root.join("target"),
    }
}

/// `cargo build --release -p kore-vmm-process` into `<target>/vmm-process`.
fn vmm_binary(root: &Path, target: &Path) -> Item {
    let dir = target.join("vmm-process");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    clean_env(&mut cmd)
        .args(["build", "--release", "--quiet", "-p", "kore-vmm-process", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &dir);
    run(&mut cmd, "the VMM process binary (kore-vmm)");
    Item { rel: "kore-vmm".into(), src: dir.join("release/kore-vmm"), mode: 0o755 }
}

/// guest-kernel/build.sh into `<target>/guest`: the kernel and the appliance image. Without
/// RUSTFLAGS: the script sets the guest's own (x86-64-v2 ring 3, soft-float ring 0).
fn guest_images(root: &Path, target: &Path) -> [Item; 2] {
    let dir = target.join("guest");
    let mut cmd = Command::new("bash");
    clean_env(&mut cmd)
        .arg(root.join("guest-kernel/build.sh"))
        .env("CARGO_TARGET_DIR", &dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    // Nor the host's profile overrides (scripts/test.sh sets some): the guest workspace's own
    // profile builds the images, the same ones build.sh alone makes.
    for (key, _) in env::vars_os() {
        if key.to_string_lossy().starts_with("CARGO_PROFILE_") {
            cmd.env_remove(&key);
        }
    }
    run(&mut cmd, "the guest images (guest-kernel/build.sh)");
    [
        Item {
            rel: "guest/kore-kernel".into(),
            src: dir.join("x86_64-unknown-none/release/kore-kernel"),
            mode: 0o644,
        },
        Item {
            rel: "guest/kore-appliance".into(),
            src: dir.join("x86_64-unknown-linux-gnu/release/kore-appliance"),
            mode: 0o644,
        },
    ]
}

/// Removes what Cargo sets for build scripts, so a nested Cargo builds as if started by hand
/// (keeping the jobserver, `CARGO_MAKEFLAGS`, and the user's own settings). Call it before
/// setting the command's own variables: a removal wins over an earlier `env`.
fn clean_env(cmd: &mut Command) -> &mut Command {
    const EXACT: &[&str] = &[
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_LINKER",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "TARGET",
        "HOST",
        "OUT_DIR",
        "PROFILE",
        "OPT_LEVEL",
        "DEBUG",
        "NUM_JOBS",
    ];
    const PREFIX: &[&str] = &["CARGO_CFG_", "CARGO_FEATURE_", "CARGO_PKG_", "CARGO_MANIFEST_"];
    for (key, _) in env::vars_os() {
        let k = key.to_string_lossy();
        if EXACT.contains(&k.as_ref()) || PREFIX.iter().any(|p| k.starts_with(p)) {
            cmd.env_remove(&key);
        }
    }
    cmd
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot start {cmd:?} ({what}): {e}"));
    if !out.status.success() {
        panic!(
            "building {what} failed ({}): {cmd:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Copies each item into OUT_DIR and writes `bundle.rs`: the files, their modes and digests,
/// and an id naming this set (the first 16 hex digits of the digest of the digests).
fn write_bundle(out: &Path, items: &[Item]) {
    let files = out.join("bundle");
    let _ = std::fs::remove_dir_all(&files);
    let mut code = String::from("&[\n");
    let mut all = Sha256::new();
    for item in items {
        let bytes = std::fs::read(&item.src)
            .unwrap_or_else(|e| panic!("{} was not built: {e}", item.src.display()));
        let copy = files.join(&item.rel);
        std::fs::create_dir_all(copy.parent().expect("a parent")).expect("OUT_DIR is writable");
        std::fs::write(&copy, &bytes).expect("OUT_DIR is writable");
        let digest = hex(&Sha256::digest(&bytes));
        all.update(item.rel.as_bytes());
        all.update(digest.as_bytes());
        let _ = writeln!(
            code,
            "    Embedded {{ rel: {:?}, mode: {:#o}, sha256: {:?}, bytes: include_bytes!({:?}) }},",
            item.rel,
            item.mode,
            digest,
            copy.display().to_string()
        );
    }
    code.push(']');
    let id = &hex(&all.finalize())[..16];
    let text = format!(
        "/// The embedded files (written by launcher/build.rs).\n\
         pub(super) static FILES: &[Embedded] = {code};\n\
         /// Names this set of files: the first 16 hex digits of a digest of their digests.\n\
         pub(super) const ID: &str = {id:?};\n"
    );
    std::fs::write(out.join("bundle.rs"), text).expect("OUT_DIR is writable");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
