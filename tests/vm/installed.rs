//! An installed kore-launch works anywhere: the binary alone, copied to an empty directory
//! and run from another empty directory with HOME and every XDG directory pointing at fresh
//! temporary ones (no checkout, no target/, no model-packs/ in reach), answers
//! `chat -p "ROMEO:" --max-tokens 8` in the guest, exactly as the source tree's build does
//! with the repository's pack. What it needs (the VMM binary, the guest images, the default
//! pack) it carries and writes under `$XDG_DATA_HOME/kore/<version>-<id>/` on first use; the
//! next run reuses those files, and a damaged one is written again (checked by digest).
//! `cargo install --path launcher` installs this same binary (docs/user-guide.md).
//!
//! Needs /dev/kvm and the built kore-launch, like tests/vm/appliance_vm.rs.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The command of the issue; with thinking on (the default) the tiny model's 8 tokens are
/// all thinking, so the answers compared below turn it off to have text to compare.
const CHAT: &[&str] = &["chat", "-p", "ROMEO:", "--max-tokens", "8"];
const CHAT_TEXT: &[&str] = &["chat", "-p", "ROMEO:", "--max-tokens", "8", "--thinking", "off"];

/// A fresh place: `bin/kore-launch` (the copy), an empty working directory, and the
/// user's HOME, data, config and runtime directories, all empty.
struct Place {
    dir: tempfile::TempDir,
    exe: PathBuf,
}

impl Place {
    fn new() -> Place {
        let dir = tempfile::tempdir().unwrap();
        for d in ["bin", "work", "home", "data", "config", "run"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let run = dir.path().join("run");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        let exe = dir.path().join("bin/kore-launch");
        std::fs::copy(kore_e2e::kore_launch(), &exe).unwrap();
        Place { dir, exe }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn chat(&self, args: &[&str]) -> Output {
        let out = Command::new(&self.exe)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.path("home"))
            .env("XDG_DATA_HOME", self.path("data"))
            .env("XDG_CONFIG_HOME", self.path("config"))
            .env("XDG_RUNTIME_DIR", self.path("run"))
            .current_dir(self.path("work"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the copied kore-launch failed: {stderr}");
        out
    }

    /// The one bundle directory under `$XDG_DATA_HOME/kore`.
    fn bundle(&self) -> PathBuf {
        let kore = self.path("data/kore");
        let dirs: Vec<_> = std::fs::read_dir(&kore)
            .unwrap_or_else(|e| panic!("{}: {e}", kore.display()))
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(dirs.len(), 1, "one bundle directory: {dirs:?}");
        dirs[0].clone()
    }
}

/// The same command from the source tree's build, in the repository (its pack, its images).
fn from_source_tree() -> Output {
    let rt = tempfile::tempdir().unwrap();
    let out = Command::new(kore_e2e::kore_launch())
        .args(CHAT_TEXT)
        .env_remove("KORE_APPLIANCE")
        .current_dir(kore_e2e::repo_root())
        .env("KORE_RUNTIME_DIR", rt.path().join("rt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn ino(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).ino()
}

#[test]
fn the_binary_alone_answers_in_the_guest_from_an_empty_directory() {
    kore_e2e::require_kvm();
    let place = Place::new();
    let exact = place.chat(CHAT);
    let said = String::from_utf8_lossy(&exact.stderr);
    assert!(said.contains("8 tokens at"), "no 8-token answer: {said}");
    let first = place.chat(CHAT_TEXT);
    let answer = String::from_utf8_lossy(&first.stdout).to_string();
    assert!(!answer.trim().is_empty(), "no answer: {:?}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(first.stdout, from_source_tree().stdout, "the same answer as the source tree's");

    let bundle = place.bundle();
    let files = ["kore-vmm", "guest/kore-kernel", "guest/kore-appliance", "packs/tiny/pack.toml"];
    for f in files {
        assert!(bundle.join(f).is_file(), "{f} not written under {}", bundle.display());
    }
    let vmm = bundle.join("kore-vmm");
    assert_eq!(std::fs::metadata(&vmm).unwrap().mode() & 0o111, 0o111, "kore-vmm executable");
    // The files written are the ones the source tree built and holds.
    let same = |a: &Path, b: &Path| std::fs::read(a).unwrap() == std::fs::read(b).unwrap();
    let built = kore_e2e::target_dir().join("vmm-process/release/kore-vmm");
    assert!(same(&vmm, &built), "kore-vmm differs from {}", built.display());
    let pack = kore_e2e::tiny_pack().join("weights.safetensors");
    assert!(same(&bundle.join("packs/tiny/weights.safetensors"), &pack));

    // Again: nothing rewritten, the same answer.
    let before: Vec<u64> = files.iter().map(|f| ino(&bundle.join(f))).collect();
    assert_eq!(place.chat(CHAT_TEXT).stdout, first.stdout);
    let after: Vec<u64> = files.iter().map(|f| ino(&bundle.join(f))).collect();
    assert_eq!(before, after, "the files were written again");

    // A damaged file is noticed by its digest and written again.
    std::fs::write(&vmm, b"#!/bin/sh\nexit 1\n").unwrap();
    std::fs::remove_file(bundle.join("guest/kore-kernel")).unwrap();
    assert_eq!(place.chat(CHAT_TEXT).stdout, first.stdout);
    assert!(same(&vmm, &built), "kore-vmm not restored");
    assert!(bundle.join("guest/kore-kernel").is_file(), "the kernel not restored");
    // The working directory stays empty: nothing is written where the user runs it.
    assert_eq!(std::fs::read_dir(place.path("work")).unwrap().count(), 0);
}
