//! The two guest ELFs the appliance VM boots: the ring-0 Kore kernel and the
//! ring-3 appliance image.
//!
//! Found, in order: `KORE_GUEST_KERNEL` / `KORE_GUEST_IMAGE` (each a file
//! path), then `guest/x86_64-unknown-none/release/kore-kernel` and
//! `guest/x86_64-unknown-linux-gnu/release/kore-appliance` under any ancestor
//! directory of the running executable (the `target/guest` directory that
//! `guest-kernel/build.sh` fills). When they are missing and kore-launch runs
//! from a build of a source checkout (`cargo run`), it builds them there once
//! with `guest-kernel/build.sh`, so a fresh clone needs no extra step.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{LaunchError, Result};

const KERNEL_REL: &str = "guest/x86_64-unknown-none/release/kore-kernel";
const IMAGE_REL: &str = "guest/x86_64-unknown-linux-gnu/release/kore-appliance";
const BUILD_HINT: &str =
    "build them with `cd guest-kernel && CARGO_TARGET_DIR=$PWD/../target/guest ./build.sh`, \
     or set KORE_GUEST_KERNEL and KORE_GUEST_IMAGE";

/// The two guest ELFs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImages {
    /// Ring-0 Kore kernel.
    pub kernel: PathBuf,
    /// Ring-3 appliance image.
    pub image: PathBuf,
}

impl GuestImages {
    /// Finds the images (see the module docs), building them from the
    /// source checkout when that is where kore-launch was built.
    pub fn locate() -> Result<GuestImages> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        match (env("KORE_GUEST_KERNEL"), env("KORE_GUEST_IMAGE")) {
            (None, None) => {}
            (kernel, image) => {
                return Ok(GuestImages {
                    kernel: from_env("KORE_GUEST_KERNEL", kernel, KERNEL_REL)?,
                    image: from_env("KORE_GUEST_IMAGE", image, IMAGE_REL)?,
                })
            }
        }
        let exe = std::env::current_exe()
            .map_err(|e| LaunchError::Host(format!("cannot find kore-launch's own path: {e}")))?;
        if let Some(found) = search(&exe) {
            return Ok(found);
        }
        if let Some(build) = checkout_build(&exe) {
            build.run()?;
            if let Some(found) = search(&exe) {
                return Ok(found);
            }
        }
        Err(LaunchError::Host(format!(
            "the Kore guest images were not found ({KERNEL_REL} and {IMAGE_REL} under a directory \
             containing {}); {BUILD_HINT}",
            exe.display()
        )))
    }
}

/// One image named by its environment variable; the other defaults to its
/// usual place next to the first one's `guest/` directory.
fn from_env(var: &str, given: Option<PathBuf>, rel: &str) -> Result<PathBuf> {
    let Some(p) = given else {
        return Err(LaunchError::Host(format!(
            "set both KORE_GUEST_KERNEL and KORE_GUEST_IMAGE ({var} is missing; it is usually \
             target/{rel})"
        )));
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(LaunchError::Host(format!("{var}={}: no such file; {BUILD_HINT}", p.display())))
    }
}

/// Both images under one ancestor of `exe`.
fn search(exe: &Path) -> Option<GuestImages> {
    exe.ancestors().skip(1).find_map(|dir| {
        let (kernel, image) = (dir.join(KERNEL_REL), dir.join(IMAGE_REL));
        (kernel.is_file() && image.is_file()).then_some(GuestImages { kernel, image })
    })
}

/// How to build the images for an executable built from this source tree.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CheckoutBuild {
    /// `guest-kernel/build.sh`.
    script: PathBuf,
    /// Where the images go: `target/guest` next to the executable's profile
    /// directory (`target/release/kore-launch` -> `target/guest`).
    target_dir: PathBuf,
}

/// The checkout build applies when the source tree kore-launch was compiled
/// from still exists and the executable sits in a cargo profile directory.
fn checkout_build(exe: &Path) -> Option<CheckoutBuild> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-kernel/build.sh");
    let profile_dir = exe.parent()?;
    let is_profile = matches!(profile_dir.file_name()?.to_str()?, "release" | "debug");
    let target_dir = profile_dir.parent()?.join("guest");
    (script.is_file() && is_profile).then_some(CheckoutBuild { script, target_dir })
}

impl CheckoutBuild {
    fn run(&self) -> Result<()> {
        eprintln!(
            "kore-launch: building the Kore guest images once (a few minutes): \
             CARGO_TARGET_DIR={} {}",
            self.target_dir.display(),
            self.script.display()
        );
        let status = Command::new("bash")
            .arg(&self.script)
            .env("CARGO_TARGET_DIR", &self.target_dir)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| LaunchError::Host(format!("cannot run {}: {e}", self.script.display())))?;
        if status.success() {
            Ok(())
        } else {
            Err(LaunchError::Host(format!(
                "building the guest images failed ({status}, output above); {BUILD_HINT}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_found_under_an_ancestor_of_the_executable() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("target/release/kore-launch");
        assert_eq!(search(&exe), None);
        for rel in [KERNEL_REL, IMAGE_REL] {
            let p = dir.path().join("target").join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"elf").unwrap();
        }
        let found = search(&exe).expect("found");
        assert_eq!(found.kernel, dir.path().join("target").join(KERNEL_REL));
        assert_eq!(found.image, dir.path().join("target").join(IMAGE_REL));
    }

    #[test]
    fn a_checkout_build_targets_the_profiles_sibling_guest_dir() {
        let b = checkout_build(Path::new("/x/target/release/kore-launch")).expect("checkout");
        assert_eq!(b.target_dir, Path::new("/x/target/guest"));
        assert!(b.script.ends_with("guest-kernel/build.sh"));
        // Not in a cargo profile directory (e.g. installed): no build.
        assert_eq!(checkout_build(Path::new("/usr/local/bin/kore-launch")), None);
    }
}
