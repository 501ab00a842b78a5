//! kore-e2e: the suites that need more than `cargo test` may assume — a VM
//! (/dev/kvm, hugepages, the guest images), root, tmux — and the one place
//! they find what they run: the repository, the `kore-launch` binary, the
//! guest images and the default pack.
//!
//! Every suite is a `[[test]]` with `required-features = ["e2e"]`, so
//! `cargo test --workspace` stays hermetic and never builds them;
//! `scripts/test.sh` (the README's test command) builds `kore-launch` and the
//! guest images first, then runs `cargo test -p kore-e2e --features e2e`.
//! A missing prerequisite fails the test with what to run; nothing skips.
//!
//! | folder | what it drives |
//! | --- | --- |
//! | `vm/` | `kore-launch` booting the appliance VM (generate, batch, up/down, sessions, imports, non-root) |
//! | `guest/` | the VMM booting Kore with the test image or the appliance image directly |
//! | `vmm/` | the VMM's lifecycle and its vsock device with a real guest |
//! | `host/` | `kore-launch doctor` on the real host |
//! | `terminal/` | the interactive chat in tmux, and `--native` runs |
//! | `openai/` | `kore-launch serve` with the official `openai` client and Chromium (pytest) |

pub mod boot;

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The Cargo target directory this test binary was built into
/// (`<target>/<profile>/deps/<test exe>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors().nth(3).expect("<target>/<profile>/deps/<exe>").to_path_buf()
}

/// The `kore-launch` binary of the same profile as this test
/// (`cargo build -p kore-launch` first; scripts/test.sh does).
pub fn kore_launch() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe.ancestors().nth(2).expect("<profile>/deps/<exe>").join("kore-launch");
    assert!(
        path.is_file(),
        "{} is missing: build it first (`cargo build --release -p kore-launch`; scripts/test.sh does)",
        path.display()
    );
    path
}

/// Whether `/proc/<pid>` (`proc_dir`) is a VMM process: its program is `kore-vmm`
/// (kore-vmm-process), the binary kore-launch starts for every VM.
pub fn is_vmm_process(proc_dir: &Path) -> bool {
    let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    argv0.rsplit(|&b| b == b'/').next() == Some(b"kore-vmm".as_slice())
}

/// The guest ELF images the VM tests boot.
#[derive(Debug, Clone)]
pub struct GuestImages {
    /// The ring-0 kernel (`KORE_GUEST_KERNEL` overrides).
    pub kernel: PathBuf,
    /// The product's ring-3 image, `kore-appliance` (`KORE_GUEST_IMAGE` overrides, as for `kore-launch`).
    pub appliance: PathBuf,
    /// The ring-3 test image, `kore-test-image` (`KORE_TEST_IMAGE` overrides).
    pub test_image: PathBuf,
}

/// Where `guest-kernel/build.sh` puts the images (`<target>/guest/...`), with the
/// overrides above. Fails (never skips) when /dev/kvm or an image is missing.
pub fn guest_images() -> GuestImages {
    let guest = target_dir().join("guest");
    let pick = |var: &str, rel: &str| {
        std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| guest.join(rel))
    };
    let images = GuestImages {
        kernel: pick("KORE_GUEST_KERNEL", "x86_64-unknown-none/release/kore-kernel"),
        appliance: pick("KORE_GUEST_IMAGE", "x86_64-unknown-linux-gnu/release/kore-appliance"),
        test_image: pick("KORE_TEST_IMAGE", "x86_64-unknown-linux-gnu/release/kore-test-image"),
    };
    require_kvm();
    for p in [&images.kernel, &images.appliance, &images.test_image] {
        assert!(
            p.is_file(),
            "guest image {} is missing: run `cd guest-kernel && CARGO_TARGET_DIR=$PWD/../target/guest ./build.sh` \
             (scripts/test.sh does)",
            p.display()
        );
    }
    images
}

/// Fails the test when /dev/kvm is missing.
pub fn require_kvm() {
    assert!(Path::new("/dev/kvm").exists(), "this test boots VMs: /dev/kvm is missing");
}

/// The default pack the CONTRACT names, `model-packs/tiny`.
pub fn tiny_pack() -> PathBuf {
    let dir = repo_root().join("model-packs/tiny");
    assert!(dir.join("pack.toml").is_file(), "the default pack {} is missing", dir.display());
    dir
}

/// The trained Hugging Face checkpoint the default pack was made from, `model-packs/tiny-hf`.
pub fn tiny_hf() -> PathBuf {
    repo_root().join("model-packs/tiny-hf")
}

/// A JSON-lines file (`batch` output) as values, one per line.
pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// What a test that boots the appliance through `kore-launch` starts from:
/// the images checked, the default pack, a scratch directory and a runtime
/// directory inside it (for `up`'s socket and pid file).
#[derive(Debug)]
pub struct VmScratch {
    /// The default pack's path, as a command-line argument.
    pub pack: String,
    /// The scratch directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// `<dir>/rt`.
    pub runtime: PathBuf,
}

impl Default for VmScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl VmScratch {
    /// Fails the test when /dev/kvm or the guest images are missing.
    pub fn new() -> VmScratch {
        guest_images();
        let pack = tiny_pack().to_str().expect("a UTF-8 path").to_string();
        let dir = tempfile::tempdir().expect("a scratch directory");
        let runtime = dir.path().join("rt");
        VmScratch { pack, dir, runtime }
    }
}
